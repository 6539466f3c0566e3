"""The study report: the report stage. The work is ``modelupgrade.report``'s."""

from __future__ import annotations

import logging
from pathlib import Path

from modelupgrade.commands.results import WrittenFiles
from modelupgrade.config import Params
from modelupgrade.layout import StudyLayout
from modelupgrade.replicates import REPLICATES_ROOT

log = logging.getLogger(__name__)


def report(
    params: Params,
    out: Path | None = None,
    root: Path = Path("."),
    replicates_root: Path = REPLICATES_ROOT,
) -> WrittenFiles:
    """The study report (markdown, HTML and the plots it shows) from the evaluation outputs.

    Reads metrics/<scenario>/{summary,backfill_summary}.json,
    metrics/sequential/<strategy>/summary.json and the plots beside them; writes <out>/report.md,
    <out>/report.html, <out>/claims.json (the verdict on each of the papers' claims) and
    <out>/plots/. With replicates.seeds in params, the claims and the seed table also read each
    seed's results under <replicates-root>/seed-<seed>/metrics/. Run metadata (git commit, params
    hash, DVC data hash, seeds, device) comes from the repository and params; wall times per stage
    from the MLflow store.

    Args:
        params: the params file: scenarios, sequential and registry sections
        out: report directory (default: reports/study)
        root: the study directory: metrics and plots below it (default: the current directory)
        replicates_root: the replicates stage's results (default: replicates)
    """
    from modelupgrade.registry import Tracker, stage_wall_times
    from modelupgrade.report import (
        collect_replicates,
        collect_results,
        run_metadata,
        write_report,
    )

    layout = StudyLayout(root)
    out = out or layout.report
    study = collect_results(params, layout)
    replicates = collect_replicates(params, replicates_root)
    tracker = Tracker.from_params(params)
    written = write_report(
        study,
        run_metadata(params, study),
        stage_wall_times(tracker),
        out,
        replicates=replicates,
    )
    with tracker.stage_run("report", params={"out": str(out)}) as stage:
        stage.log_artifact(out, "report")
    log.info("report written: %s", ", ".join(str(p) for p in written))
    return WrittenFiles(written)
