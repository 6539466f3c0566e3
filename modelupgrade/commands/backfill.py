"""Simulate online backfilling of a scenario: the simulate_backfill stages and
``modelupgrade simulate-backfill``. The work is ``modelupgrade.backfill.study``'s."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from modelupgrade.backfill.summary import BackfillSummary
from modelupgrade.commands.results import SummaryWritten
from modelupgrade.config import Params
from modelupgrade.layout import StudyLayout

if TYPE_CHECKING:
    from modelupgrade.backfill.variants import ScenarioVariants


class BackfillStudy(SummaryWritten[BackfillSummary]):
    """A simulation's summary (``backfill_summary.json``) and where its tables went."""

    def heading(self) -> str:
        return (
            f"{self.summary.scenario}: {len(self.summary.curves)} backfill curves written to "
            f"{self.metrics_dir} ({len(self.summary.skipped)} skipped)"
        )


def simulate_backfill(
    params: Params,
    scenario: str,
    embeddings_root: Path | None = None,
    old: Path | None = None,
    variant: Sequence[str] = (),
    array: Sequence[str] = (),
    old_logits: Path | None = None,
    compatible: Sequence[str] = (),
    query_split: Path | None = None,
    gallery_split: Path | None = None,
    metrics_dir: Path | None = None,
    plots_dir: Path | None = None,
) -> BackfillStudy:
    """Simulate online backfilling: retrieval quality while the gallery moves to the new model.

    Every (strategy, ordering policy, serving mode) combination of params.yaml whose inputs are
    present runs; the others are listed as skipped. Writes <metrics>/backfill_curves.{parquet,csv},
    backfill_summary.json (AUCs both ways, Seo et al.'s conditions), backfill_plots/<curve>.csv
    (for dvc plots) and <plots>/backfill_curves.png.

    Args:
        params: the params file: the validated configuration of every step
        scenario: a scenario of params.yaml
        embeddings_root: compare every strategy and head of the scenario found under <root>/<sc>/
            (gen0, gen1-<strategy>, <head>-<strategy>); default: embeddings, unless --old is given
        old: the old model's embedding directory (query.npy, gallery.npy)
        variant: with --old: NAME=DIR, an upgraded system and its new model's embedding directory
        array: with --old: NAME:FIELD=PATH, a head output of a variant; FIELD is forward_gallery,
            sigma2, reverse_query, rho_query, rho_gallery or rho_reverse_query
        old_logits: with --old: the old classifier's logits on the gallery split (.npy), for the
            confidence and entropy orders
        compatible: with --old: NAME of a variant whose new model was trained to be compatible
            with the old one (BCT family); the oracle order needs that or the variant's ψ
        query_split: query split parquet (default: data/splits/<sc>/query.parquet)
        gallery_split: gallery split parquet (default: data/splits/<sc>/gallery.parquet)
        metrics_dir: where backfill_curves.{parquet,csv}, backfill_summary.json and
            backfill_plots/ go (default: metrics/<sc>)
        plots_dir: where backfill_curves.png goes (default: plots/<sc>)
    """
    from modelupgrade.backfill.study import backfill_inputs

    layout = StudyLayout()
    if embeddings_root is None and old is None:
        embeddings_root = layout.embeddings_root
    found = backfill_inputs(
        params, scenario, embeddings_root, old, variant, array, old_logits, compatible
    )
    return _simulate_tracked(
        params, scenario, found, query_split, gallery_split, metrics_dir, plots_dir, layout
    )


def _simulate_tracked(
    params: Params,
    scenario: str,
    found: ScenarioVariants,
    query_split: Path | None,
    gallery_split: Path | None,
    metrics_dir: Path | None,
    plots_dir: Path | None,
    layout: StudyLayout,
) -> BackfillStudy:
    """The simulation inside the stage's MLflow run: its inputs, parameters, headline metrics and
    report files recorded."""
    from modelupgrade.backfill.study import output_dirs, report_files
    from modelupgrade.backfill.study import simulate_backfill as simulate
    from modelupgrade.registry import track_stage

    asked = {
        "scenario": scenario,
        "old": found.old,
        "variants": found.variants,
        "arrays": found.arrays,
        "old_logits": found.old_logits,
        "compatible": sorted(found.compatible),
        "query_split": query_split,
        "gallery_split": gallery_split,
    }
    run_name = f"simulate_backfill@{scenario}"
    with track_stage("simulate_backfill", params, run_name=run_name, arguments=asked) as stage:
        stage.set_tags({"scenario": scenario})
        stage.log_params(
            {
                "seed": params.seed,
                "backfill": params.backfill,
                "evaluation.protocol": params.evaluation.protocol,
            }
        )
        summary = simulate(
            params, scenario, found, query_split, gallery_split, metrics_dir, plots_dir, layout
        )
        stage.log_metrics(summary.headline_metrics())
        metrics, plots = output_dirs(scenario, metrics_dir, plots_dir, layout)
        stage.log_artifacts(report_files(metrics, plots), "backfill")
    return BackfillStudy(summary, metrics)
