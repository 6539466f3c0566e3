"""Stage: the study report (markdown, HTML and the plots it shows) from the evaluation outputs.

    python -m stages.report --params params.yaml --out reports/study

Reads metrics/<scenario>/{summary,backfill_summary}.json, metrics/sequential/<strategy>/summary.json
and the plots beside them; writes <out>/report.md, <out>/report.html, <out>/claims.json (the verdict
on each of the papers' claims) and <out>/plots/. Run metadata (git commit, params hash, DVC data
hash, seeds, device) comes from the repository and params; wall times per stage from the MLflow store.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from modelupgrade.config import Params, params_hash
from modelupgrade.errors import exit_on_user_error
from modelupgrade.plugins import load_params
from modelupgrade.registry import Tracker, dvc_data_hash, git_commit, stage_wall_times
from modelupgrade.report import collect_results, write_report
from modelupgrade.runtime import setup_logging

log = logging.getLogger("stages.report")


def run(params: Params, out: str | Path, metrics_root: str | Path = "metrics", plots_root: str | Path = "plots",
        tracker: Tracker | None = None) -> list[Path]:
    study = collect_results(params, metrics_root, plots_root)
    devices = sorted({str(sc.evaluation.get("device")) for sc in study.scenarios if sc.evaluation.get("device")})
    metadata = {
        "git commit": git_commit(),
        "params hash": params_hash(params),
        "DVC data hash": dvc_data_hash(),
        "seed": f"{params.seed} (generation g trains with seed {params.seed} + g)",
        "device": ", ".join(devices) or params.device,
        "dataset": f"{params.dataset.name} ({params.dataset.loader} loader, {params.dataset.root})",
    }
    tracker = tracker or Tracker.from_params(params)
    written = write_report(study, metadata, stage_wall_times(tracker), out)
    with tracker.stage_run("report", params={"out": str(out)}) as stage:
        stage.log_artifact(out, "report")
    log.info("report written: %s", ", ".join(str(p) for p in written))
    return written


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stages.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--out", default="reports/study", help="report directory (default: reports/study)")
    parser.add_argument("--metrics-root", default="metrics", help="root of metrics/<scenario>/ (default: metrics)")
    parser.add_argument("--plots-root", default="plots", help="root of plots/<scenario>/ (default: plots)")
    return parser


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    setup_logging()
    run(load_params(args.params), args.out, args.metrics_root, args.plots_root)


if __name__ == "__main__":
    main()
