"""The flows' reports as Prefect artifacts (the flow run's Artifacts tab; the same key keeps a
history). The reports themselves are written by ``modelupgrade.report.upgrade`` into the work
directory; these tasks publish them.

Artifact keys: ``upgrade-report`` / ``upgrade-metrics`` (one upgrade cycle), ``lineage-report`` /
``compatibility-matrix`` (a lineage), ``backfill-report`` (a gallery backfill; its
``backfill-progress`` comes from ``flows.gallery_tasks`` while it runs).
"""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.layout import FlowSettings, load_settings, model_key
from flows.tasks import open_registry, stage_task
from modelupgrade.report.upgrade import (
    Chain,
    skipped_upgrade_report,
    write_backfill_report,
    write_lineage_report,
    write_upgrade_report,
)


def chain_of(settings: FlowSettings) -> Chain:
    """The flows' chain: its registered model and where its files lie in the work directory."""
    return Chain(
        registry=open_registry(settings),
        strategy=settings.strategy,
        metric=settings.params.evaluation.headline_metric,
        metrics_dir=settings.work.metrics(settings.strategy),
        heatmap=settings.work.heatmap(settings.strategy),
        reports_dir=settings.work.reports,
    )


@stage_task("publish-upgrade-report")
def publish_upgrade_report(
    params_path: str, work_dir: str, generation: int, registration: dict[str, Any]
) -> dict[str, Any]:
    settings = load_settings(params_path, work_dir)
    key = model_key(settings.strategy, generation)
    report = write_upgrade_report(
        chain_of(settings),
        generation,
        key,
        registration,
        snapshot=settings.work.snapshot(generation),
        registration_file=settings.work.registration(generation),
    )
    model = registration["registered_model"]
    create_markdown_artifact(
        markdown=report.markdown, key="upgrade-report", description=f"{key} of {model}"
    )
    create_table_artifact(
        table=report.rows,
        key="upgrade-metrics",
        description=f"{key}: its queries against every gallery of the chain",
    )
    return report.record


@stage_task("publish-skipped-upgrade")
def publish_skipped_upgrade(params_path: str, work_dir: str, generation: int) -> dict[str, Any]:
    settings = load_settings(params_path, work_dir)
    planned = len(settings.params.sequential.fractions)
    markdown = skipped_upgrade_report(generation, settings.work.splits, planned)
    create_markdown_artifact(
        markdown=markdown, key="upgrade-report", description=f"gen{generation}: no new data"
    )
    return {"status": "skipped", "generation": generation, "reason": "no data snapshot"}


@stage_task("publish-lineage-report")
def publish_lineage_report(params_path: str, work_dir: str) -> dict[str, Any]:
    report = write_lineage_report(chain_of(load_settings(params_path, work_dir)))
    model, metric = report.record["registered_model"], report.record["compatibility"]["metric"]
    create_markdown_artifact(markdown=report.markdown, key="lineage-report", description=model)
    create_table_artifact(
        table=report.rows,
        key="compatibility-matrix",
        description=f"{model}: M(query generation, gallery generation), {metric}",
    )
    return report.record


@stage_task("publish-backfill-report")
def publish_backfill_report(params_path: str, work_dir: str, summary: dict[str, Any]) -> str:
    settings = load_settings(params_path, work_dir)
    report = write_backfill_report(summary, settings.work.reports)
    create_markdown_artifact(
        markdown=report.markdown, key="backfill-report", description=summary["store"]
    )
    return str(report.path)
