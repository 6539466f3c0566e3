"""What a flow run tells people: markdown reports and metric tables, written into the work directory
and published as Prefect artifacts (the flow run's Artifacts tab; the same key keeps a history).

Artifact keys: ``upgrade-report`` / ``upgrade-metrics`` (one upgrade cycle), ``lineage-report`` /
``compatibility-matrix`` (a lineage), ``backfill-progress`` / ``backfill-report`` (a gallery backfill).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.layout import FlowSettings, load_settings, model_key
from flows.tasks import open_registry, stage_task
from modelupgrade.io import read_json, write_json, write_text

def _number(value: Any) -> float | None:
    """JSON has no NaN; an unmeasured number is null."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else round(value, 6)


def _shown(value: Any) -> str:
    number = _number(value)
    return "n/a" if number is None else f"{number:.4f}"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "_(none)_"
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [_shown(v) if isinstance(v, float) else str(v) for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def facts_table(facts: Sequence[tuple[str, str]]) -> str:
    """A two-column table of labelled facts (markdown tables need a header row; this one is blank)."""
    return "\n".join(["|  |  |", "|---|---|", *(f"| {label} | {value} |" for label, value in facts)])


def new_model_rows(settings: FlowSettings, generation: int) -> list[dict[str, Any]]:
    """The new generation's queries against every gallery of the chain, one row per gallery."""
    import pandas as pd

    table = pd.read_parquet(settings.work.metrics(settings.strategy) / "cross_model.parquet")
    mine = table[table.query_set == f"gen{generation}"]
    rows = []
    for gallery in sorted(set(mine.gallery_set), key=lambda g: int(g[3:])):
        values = mine[mine.gallery_set == gallery].set_index("metric").value
        rows.append({"query": f"gen{generation}", "gallery": gallery,
                     **{metric: _number(v) for metric, v in values.items()}})
    return rows


def compatibility(settings: FlowSettings) -> dict[str, Any]:
    """The chain's compatibility matrix and its summary numbers in the headline metric."""
    summary = read_json(settings.work.metrics(settings.strategy) / "summary.json")
    metric = settings.params.evaluation.headline_metric
    return {"metric": metric, **summary["compatibility"][metric]}


def matrix_rows(compat: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per query generation, one column per gallery generation (None above the diagonal)."""
    generations = compat["generations"]
    return [
        {"query": q, **{g: (_number(compat["matrix"][i][j]) if j <= i else None) for j, g in enumerate(generations)}}
        for i, q in enumerate(generations)
    ]


def _matrix_markdown(compat: dict[str, Any]) -> str:
    rows = [{k: ("" if v is None else v) for k, v in row.items()} for row in matrix_rows(compat)]
    numbers = ", ".join(f"{name} {_shown(compat.get(key))}" for name, key in
                        (("AC(<)", "ac_lt"), ("AC(≤)", "ac_le"), ("AM", "am"), ("BC", "bc"), ("FC", "fc")))
    return (f"M(query generation, gallery generation) in {compat['metric']}; "
            f"lower triangle: a newer model searching an older gallery.\n\n{markdown_table(rows)}\n\n{numbers}")


def _verdict(outcome: dict[str, Any]) -> str:
    key = outcome["model_key"]
    if outcome["gates"] == "first-generation":
        return f"{key} is the first generation and the champion"
    if "candidate" in outcome["aliases"]:
        return f"{key} passed the gates and is the candidate"
    if outcome["gates"] == "pass":
        return f"{key} passed the gates (another version is the candidate)"
    return f"{key} is registered but failed the gates: {', '.join(outcome['failed_gates'])}"


def upgrade_report(settings: FlowSettings, generation: int, registration: dict[str, Any]) -> tuple[str, list]:
    """The cycle's markdown report and its metrics table."""
    import pandas as pd

    from modelupgrade.registry import format_lineage

    key = model_key(settings.strategy, generation)
    outcome = next(o for o in registration["generations"] if o["model_key"] == key)
    registry = open_registry(settings)
    version = registry.version(outcome["version"])
    gates = [
        {"gate": name[len("gate."):], "verdict": value.split(":", 1)[0], "detail": value.split(":", 1)[-1].strip()}
        for name, value in sorted(version.tags.items())
        if name.startswith("gate.") and name.count(".") == 1
    ]
    against = version.tags.get("gates.against_version", "none")
    snapshot = pd.read_parquet(settings.work.snapshot(generation), columns=["label"])
    rows = new_model_rows(settings, generation)
    work = settings.work
    lines = [
        f"# Upgrade cycle gen{generation}: {_verdict(outcome)}",
        "",
        facts_table([
            ("registered model", f"`{registration['registered_model']}` v{version.version} "
                                 f"(parent {'v' + str(version.parent_version) if version.parent_version else 'none'})"),
            ("strategy", settings.strategy if generation else "initial"),
            ("training data", f"`{work.snapshot(generation)}`: {len(snapshot)} images, "
                              f"{snapshot.label.nunique()} classes"),
            ("champion", f"v{registration['champion']}"),
            ("candidate", f"v{registration['candidate']}" if registration["candidate"] else "none"),
            ("MLflow", f"`{registration['tracking_uri']}`"),
        ]),
        "",
        f"## Gates against the champion (v{against})",
        "",
        markdown_table(gates) if gates else "The first generation of a chain has nothing to be compatible with.",
        "",
        f"## gen{generation} queries against every gallery of the chain",
        "",
        markdown_table(rows),
        "",
        "## Compatibility matrix",
        "",
        _matrix_markdown(compatibility(settings)),
        "",
        "## Lineage",
        "",
        "```text",
        format_lineage(registry.name, registry.versions()),
        "```",
        "",
        "## Files",
        "",
        f"- metrics: `{work.metrics(settings.strategy)}`",
        f"- heatmap: `{work.heatmap(settings.strategy)}`",
        f"- registration: `{work.registration(generation)}`",
    ]
    return "\n".join(lines) + "\n", rows


@stage_task("publish-upgrade-report")
def publish_upgrade_report(params_path: str, work_dir: str, generation: int,
                           registration: dict[str, Any]) -> dict[str, Any]:
    settings = load_settings(params_path, work_dir)
    markdown, rows = upgrade_report(settings, generation, registration)
    report = settings.work.reports / f"upgrade-gen{generation}.md"
    write_text(report, markdown)
    key = model_key(settings.strategy, generation)
    outcome = next(o for o in registration["generations"] if o["model_key"] == key)
    result = {
        "status": "registered",
        "generation": generation,
        "model_key": key,
        "registered_model": registration["registered_model"],
        "version": outcome["version"],
        "gates": outcome["gates"],
        "failed_gates": outcome["failed_gates"],
        "aliases": outcome["aliases"],
        "champion": registration["champion"],
        "candidate": registration["candidate"],
        "tracking_uri": registration["tracking_uri"],
        "report": str(report),
        "metrics": rows,
    }
    write_json(report.with_suffix(".json"), result)
    create_markdown_artifact(markdown=markdown, key="upgrade-report",
                             description=f"{key} of {registration['registered_model']}")
    create_table_artifact(table=rows, key="upgrade-metrics",
                          description=f"{key}: its queries against every gallery of the chain")
    return result


@stage_task("publish-skipped-upgrade")
def publish_skipped_upgrade(params_path: str, work_dir: str, generation: int) -> dict[str, Any]:
    settings = load_settings(params_path, work_dir)
    planned = len(settings.params.sequential.fractions)
    markdown = (
        f"# Upgrade cycle gen{generation}: no new data\n\n"
        f"There is no data snapshot for gen{generation} in `{settings.work.splits}` (sequential.fractions "
        f"plans {planned} generations), so nothing was trained or registered. Give the next snapshot with "
        f"`python -m flows.upgrade --snapshot <parquet>` or the deployment's `snapshot` parameter.\n"
    )
    create_markdown_artifact(markdown=markdown, key="upgrade-report", description=f"gen{generation}: no new data")
    return {"status": "skipped", "generation": generation, "reason": "no data snapshot"}


@stage_task("publish-lineage-report")
def publish_lineage_report(params_path: str, work_dir: str) -> dict[str, Any]:
    from modelupgrade.registry import format_lineage, lineage_rows

    settings = load_settings(params_path, work_dir)
    registry = open_registry(settings)
    versions = registry.versions()
    compat = compatibility(settings)
    heatmap = settings.work.heatmap(settings.strategy)
    markdown = "\n".join([
        f"# Lineage of `{registry.name}`: {len(compat['generations'])} generations ({settings.strategy})",
        "",
        "```text",
        format_lineage(registry.name, versions),
        "```",
        "",
        "## Compatibility matrix",
        "",
        _matrix_markdown(compat),
        "",
        f"Heatmap: `{heatmap}`",
    ]) + "\n"
    report = settings.work.reports / "lineage.md"
    write_text(report, markdown)
    matrix = matrix_rows(compat)
    result = {
        "registered_model": registry.name,
        "tracking_uri": registry.tracker.config.tracking_uri,
        "lineage": lineage_rows(versions),
        "compatibility": {k: (_number(v) if isinstance(v, float) else v) for k, v in compat.items()
                          if k != "matrix"} | {"matrix": matrix},
        "report": str(report),
        "heatmap": str(heatmap),
        "metrics_dir": str(settings.work.metrics(settings.strategy)),
    }
    write_json(report.with_suffix(".json"), result)
    create_markdown_artifact(markdown=markdown, key="lineage-report", description=registry.name)
    create_table_artifact(table=matrix, key="compatibility-matrix",
                          description=f"{registry.name}: M(query generation, gallery generation), {compat['metric']}")
    return result


def backfill_report(summary: dict[str, Any]) -> str:
    status = summary.get("store_status") or {}
    lines = [f"# Gallery store `{summary['store']}`: {summary['outcome']}", ""]
    backfill = summary.get("backfill")
    if backfill:
        lines += [
            facts_table([
                ("from → to", f"{summary['source_space']} → {backfill['target_space']}"),
                ("status", backfill["status"]),
                ("items written", str(backfill["items_written"])),
                ("items failed", str(backfill["items_failed"])),
                ("seconds", f"{backfill['seconds']:.1f}"),
                ("items/s", f"{backfill['items_per_second']:.1f}"),
            ]),
            "",
        ]
    lines += [
        f"Serving space: `{status.get('serving_space')}`; items per space: {status.get('items_by_space')}; "
        f"champion: v{summary['champion_version']} ({summary['champion_key']}).",
    ]
    if status.get("failed"):
        lines += ["", "Failed items (still served from the old space):", "",
                  markdown_table([{"item": f["item_id"], "reason": f["reason"]} for f in status["failed"]])]
    return "\n".join(lines) + "\n"


@stage_task("publish-backfill-report")
def publish_backfill_report(params_path: str, work_dir: str, summary: dict[str, Any]) -> str:
    settings = load_settings(params_path, work_dir)
    markdown = backfill_report(summary)
    report = settings.work.reports / "backfill.md"
    write_text(report, markdown)
    write_json(report.with_suffix(".json"), summary)
    create_markdown_artifact(markdown=markdown, key="backfill-report", description=summary["store"])
    return str(report)
