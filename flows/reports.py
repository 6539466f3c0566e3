"""The flows' reports as Prefect artifacts (the flow run's Artifacts tab; the same key keeps a
history). The reports are written by the library (``modelupgrade.report.upgrade``, through
``modelupgrade.chain``) into the work directory; these tasks publish them.

Artifact keys: ``upgrade-report`` / ``upgrade-metrics`` (one upgrade cycle), ``lineage-report`` /
``compatibility-matrix`` (a lineage), ``backfill-report`` (a gallery backfill; its
``backfill-progress`` comes from ``flows.tasks.follow_champion`` while it runs).
"""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from modelupgrade.chain import load_chain
from modelupgrade.orchestration import flow_task


@flow_task("publish-upgrade-report")
def publish_upgrade_report(
    params_path: str, work_dir: str, generation: int, registration: dict[str, Any]
) -> dict[str, Any]:
    report = load_chain(params_path, work_dir).upgrade_report(generation, registration)
    create_markdown_artifact(
        markdown=report.markdown, key="upgrade-report", description=report.title
    )
    create_table_artifact(table=report.rows, key="upgrade-metrics", description=report.rows_title)
    return report.record


@flow_task("publish-skipped-upgrade")
def publish_skipped_upgrade(params_path: str, work_dir: str, generation: int) -> dict[str, Any]:
    report = load_chain(params_path, work_dir).skipped_upgrade_report(generation)
    create_markdown_artifact(
        markdown=report.markdown, key="upgrade-report", description=report.title
    )
    return report.record


@flow_task("publish-lineage-report")
def publish_lineage_report(params_path: str, work_dir: str) -> dict[str, Any]:
    report = load_chain(params_path, work_dir).lineage_report()
    create_markdown_artifact(
        markdown=report.markdown, key="lineage-report", description=report.title
    )
    create_table_artifact(
        table=report.rows, key="compatibility-matrix", description=report.rows_title
    )
    return report.record


@flow_task("publish-backfill-report")
def publish_backfill_report(params_path: str, work_dir: str, outcome: dict[str, Any]) -> str:
    report = load_chain(params_path, work_dir).backfill_report(outcome)
    create_markdown_artifact(
        markdown=report.markdown, key="backfill-report", description=report.title
    )
    return str(report.path)
