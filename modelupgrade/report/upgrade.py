"""What automated upgrades tell people: one cycle's report, a chain's lineage, a gallery backfill.

Each report is a markdown document (written with ``modelupgrade.report.document``) saved with a
JSON record beside it, plus, for the first two, the rows of a metrics table. The Prefect flows
publish them as artifacts and return their records; the functions here only need the chain's
registered model and the paths of its files. ``CycleOutcome``, ``LineageOutcome`` and
``BackfillOutcome`` tell the same records to a person at the shell (``python -m flows.<name>``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelupgrade.evaluation.summary import ChainEvaluation, Compatibility
from modelupgrade.io import write_json, write_text
from modelupgrade.json_data import JsonObject, object_at, objects_at, strings_at
from modelupgrade.layout import CROSS_MODEL, SUMMARY
from modelupgrade.registry import ModelRegistry, format_lineage, lineage_rows
from modelupgrade.registry.forms import ADOPTED_STRATEGY
from modelupgrade.registry.gates import read_gate_verdicts
from modelupgrade.registry.study import RegistrationOutcome, RegistrationSummary
from modelupgrade.registry.versions import TAG_GATES_AGAINST, TAG_STRATEGY, VersionInfo
from modelupgrade.report.document import (
    Block,
    BulletList,
    CodeBlock,
    Heading,
    Paragraph,
    Table,
    format_cell,
    render_markdown,
)

# The summary numbers of a compatibility matrix, as the reports name them.
COMPATIBILITY_NUMBERS = (
    ("AC(<)", "ac_lt"),
    ("AC(≤)", "ac_le"),
    ("AM", "am"),
    ("BC", "bc"),
    ("FC", "fc"),
)

# A row of a report's metrics table: its labels (query, gallery) and its numbers, None where
# nothing was measured. The flows publish these rows as Prefect table artifacts.
TableRow = dict[str, str | float | None]


@dataclass(frozen=True)
class Chain:
    """One upgrade chain as its reports see it: its registered model, its strategy, its files."""

    registry: ModelRegistry
    strategy: str
    metric: str  # the headline metric of its compatibility matrix
    metrics_dir: Path  # the chain's evaluation (cross-model table and summary)
    heatmap: Path
    reports_dir: Path


@dataclass(frozen=True)
class WrittenReport:
    """A markdown report written to ``path``, with the JSON ``record`` written beside it."""

    markdown: str
    path: Path
    record: Any
    rows: list[TableRow] = field(default_factory=list)  # its metrics table, if any
    title: str = ""  # one line: what the report is about
    rows_title: str = ""  # one line: what its metrics table holds


def json_number(value: Any) -> float | None:
    """A number for JSON, which has no NaN: an unmeasured number is null."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else round(value, 6)


def chain_compatibility(chain: Chain) -> Compatibility:
    """The chain's compatibility matrix and its summary numbers in the headline metric."""
    summary = ChainEvaluation.read(chain.metrics_dir / f"{SUMMARY}.json")
    return summary.compatibility[chain.metric].model_copy(update={"metric": chain.metric})


def matrix_rows(compat: Compatibility) -> list[TableRow]:
    """One row per query generation, one column per gallery generation (None above the diagonal)."""
    generations = compat.generations
    return [
        {
            "query": q,
            **{
                g: (json_number(compat.matrix[i][j]) if j <= i else None)
                for j, g in enumerate(generations)
            },
        }
        for i, q in enumerate(generations)
    ]


def generation_rows(chain: Chain, generation: int) -> list[TableRow]:
    """The generation's queries against every gallery of the chain, one row per gallery."""
    import pandas as pd

    table = pd.read_parquet(chain.metrics_dir / f"{CROSS_MODEL}.parquet")
    own = f"gen{generation}"
    # Its own queries, and its queries through a reverse head (``<head>(gen<i>)``); a gallery
    # through a forward head is ``<head>(gen<j>)``: the path to an older gallery of another
    # dimension.
    mine = table[(table.query_set == own) | table.query_set.str.endswith(f"({own})")]
    rows: list[TableRow] = []
    for query, gallery in sorted(
        set(zip(mine.query_set, mine.gallery_set, strict=True)), key=_generation_order
    ):
        pair = mine[(mine.query_set == query) & (mine.gallery_set == gallery)]
        values = pair.set_index("metric").value
        rows.append(
            {
                "query": query,
                "gallery": gallery,
                **{metric: json_number(v) for metric, v in values.items()},
            }
        )
    return rows


def _generation_order(pair: tuple[str, str]) -> tuple[int, str, str]:
    """Rows by the gallery's generation (``gen2`` and ``bict(gen2)`` are generation 2), then by
    name."""
    query, gallery = pair
    model = gallery[:-1].split("(", 1)[1] if gallery.endswith(")") else gallery
    return int(model[3:]), gallery, query


def write_upgrade_report(
    chain: Chain,
    generation: int,
    model_key: str,
    registration: RegistrationSummary,
    snapshot: Path,
    registration_file: Path,
) -> WrittenReport:
    """The report of the cycle that registered ``model_key`` (generation ``generation``, trained on
    ``snapshot``): its gates against the champion, its queries against every gallery, the
    compatibility matrix and the lineage. ``registration`` is what the register stage returned."""
    outcome = registration.outcome(model_key)
    registry = chain.registry
    version = registry.version(outcome.version)
    gates = [verdict.as_row() for verdict in read_gate_verdicts(version.tags)]
    against = version.tags.get(TAG_GATES_AGAINST, "none")
    rows = generation_rows(chain, generation)
    candidate = registration.candidate
    blocks: list[Block] = [
        _facts(_registration_facts(chain, generation, registration, version, snapshot)),
        Heading(f"Gates against the champion (v{against})"),
        _rows_table(gates)
        if gates
        else Paragraph("The first generation of a chain has nothing to be compatible with."),
        Heading(f"gen{generation} queries against every gallery of the chain"),
        _rows_table(rows),
        Heading("Compatibility matrix"),
        *_matrix_blocks(chain_compatibility(chain)),
        Heading("Lineage"),
        CodeBlock(format_lineage(registry.name, registry.versions())),
        Heading("Files"),
        BulletList(
            [
                f"metrics: `{chain.metrics_dir}`",
                f"heatmap: `{chain.heatmap}`",
                f"registration: `{registration_file}`",
            ]
        ),
    ]
    markdown = render_markdown(f"Upgrade cycle gen{generation}: {_verdict(outcome)}", blocks)
    path = chain.reports_dir / f"upgrade-gen{generation}.md"
    record = {
        "status": "registered",
        "generation": generation,
        "model_key": model_key,
        "registered_model": registration.registered_model,
        "version": outcome.version,
        "gates": outcome.gates,
        "failed_gates": outcome.failed_gates,
        "aliases": outcome.aliases,
        "champion": registration.champion,
        "candidate": candidate,
        "tracking_uri": registration.tracking_uri,
        "report": str(path),
        "metrics": rows,
    }
    return _write(
        markdown,
        path,
        record,
        rows,
        title=f"{model_key} of {registration.registered_model}",
        rows_title=f"{model_key}: its queries against every gallery of the chain",
    )


def _registration_facts(
    chain: Chain,
    generation: int,
    registration: RegistrationSummary,
    version: VersionInfo,
    snapshot: Path,
) -> list[tuple[str, str]]:
    """The registered version, its strategy and training data, the champion and the candidate."""
    import pandas as pd

    labels = pd.read_parquet(snapshot, columns=["label"]).label
    parent = f"v{version.parent_version}" if version.parent_version else "none"
    candidate = registration.candidate
    registered = f"`{registration.registered_model}` v{version.version} (parent {parent})"
    # The version's own strategy: a model adopted from elsewhere was not trained on the snapshot.
    strategy = version.tags.get(TAG_STRATEGY, chain.strategy if generation else "initial")
    trained_on = f"`{snapshot}`: {len(labels)} images, {labels.nunique()} classes"
    if strategy == ADOPTED_STRATEGY:
        source = version.tags.get("adopted.source", "?")
        trained_on = f"unknown: adopted from `{source}` (made elsewhere; its card lists what else"
        trained_on += " is unknown)"
    return [
        ("registered model", registered),
        ("strategy", strategy),
        ("training data", trained_on),
        ("champion", f"v{registration.champion}"),
        ("candidate", f"v{candidate}" if candidate else "none"),
        ("MLflow", f"`{registration.tracking_uri}`"),
    ]


def skipped_upgrade_report(generation: int, splits_dir: Path, planned_generations: int) -> str:
    """The report of a cycle that found no data snapshot for ``generation`` in ``splits_dir``."""
    return render_markdown(
        f"Upgrade cycle gen{generation}: no new data",
        [
            Paragraph(
                f"There is no data snapshot for gen{generation} in `{splits_dir}` "
                f"(sequential.fractions plans {planned_generations} generations), so nothing was "
                "trained or registered. Give the next snapshot with `python -m flows.upgrade "
                "--snapshot <parquet>` or the deployment's `snapshot` parameter."
            )
        ],
    )


def write_skipped_upgrade_report(
    generation: int, splits_dir: Path, planned_generations: int, reports_dir: Path
) -> WrittenReport:
    """``skipped_upgrade_report``, written as the report of the cycle for ``generation``."""
    path = reports_dir / f"upgrade-gen{generation}.md"
    record = {
        "status": "skipped",
        "generation": generation,
        "reason": "no data snapshot",
        "report": str(path),
    }
    markdown = skipped_upgrade_report(generation, splits_dir, planned_generations)
    return _write(markdown, path, record, title=f"gen{generation}: no new data")


def write_lineage_report(chain: Chain) -> WrittenReport:
    """The chain's lineage tree and its compatibility matrix over every generation."""
    registry = chain.registry
    versions = registry.versions()
    compat = chain_compatibility(chain)
    generations = len(compat.generations)
    markdown = render_markdown(
        f"Lineage of `{registry.name}`: {generations} generations ({chain.strategy})",
        [
            CodeBlock(format_lineage(registry.name, versions)),
            Heading("Compatibility matrix"),
            *_matrix_blocks(compat),
            Paragraph(f"Heatmap: `{chain.heatmap}`"),
        ],
    )
    path = chain.reports_dir / "lineage.md"
    matrix = matrix_rows(compat)
    numbers = {
        k: (json_number(v) if isinstance(v, float) else v)
        for k, v in compat.model_dump().items()
        if k != "matrix"
    }
    record = {
        "registered_model": registry.name,
        "tracking_uri": registry.tracker.config.tracking_uri,
        "lineage": lineage_rows(versions),
        "compatibility": numbers | {"matrix": matrix},
        "report": str(path),
        "heatmap": str(chain.heatmap),
        "metrics_dir": str(chain.metrics_dir),
    }
    return _write(
        markdown,
        path,
        record,
        matrix,
        title=registry.name,
        rows_title=f"{registry.name}: M(query generation, gallery generation), {chain.metric}",
    )


def backfill_report(summary: JsonObject) -> str:
    """What a backfill run of the gallery store did (``summary``: the backfill flow's outcome)."""
    status = object_at(summary, "store_status")
    blocks: list[Block] = []
    backfill = object_at(summary, "backfill")
    if backfill:
        blocks.append(
            _facts(
                [
                    ("from → to", f"{summary['source_space']} → {backfill['target_space']}"),
                    ("status", str(backfill["status"])),
                    ("items written", str(backfill["items_written"])),
                    ("items failed", str(backfill["items_failed"])),
                    ("seconds", f"{backfill['seconds']:.1f}"),
                    ("items/s", f"{backfill['items_per_second']:.1f}"),
                ]
            )
        )
    blocks.append(
        Paragraph(
            f"Serving space: `{status.get('serving_space')}`; items per space: "
            f"{status.get('items_by_space')}; champion: v{summary['champion_version']} "
            f"({summary['champion_key']})."
        )
    )
    failed = [{"item": f["item_id"], "reason": f["reason"]} for f in objects_at(status, "failed")]
    if failed:
        blocks += [
            Paragraph("Failed items (still served from the old space):"),
            _rows_table(failed),
        ]
    return render_markdown(f"Gallery store `{summary['store']}`: {summary['outcome']}", blocks)


def write_backfill_report(summary: JsonObject, reports_dir: Path) -> WrittenReport:
    path = reports_dir / "backfill.md"
    return _write(backfill_report(summary), path, summary, title=str(summary["store"]))


def _write(
    markdown: str,
    path: Path,
    record: Any,
    rows: list[TableRow] | None = None,
    title: str = "",
    rows_title: str = "",
) -> WrittenReport:
    write_text(path, markdown)
    write_json(path.with_suffix(".json"), record)
    return WrittenReport(markdown, path, record, rows or [], title, rows_title)


@dataclass
class RecordedOutcome:
    """What a flow did, as the record of its report: ``as_dict`` is the record, ``describe`` what a
    person reads of it."""

    record: JsonObject

    def as_dict(self) -> JsonObject:
        return self.record

    def describe(self) -> str:
        raise NotImplementedError


class CycleOutcome(RecordedOutcome):
    """What one upgrade cycle did: the record of its report (registered, or skipped)."""

    def describe(self) -> str:
        r = self.record
        if r["status"] == "skipped":
            return f"gen{r['generation']}: no new data snapshot, nothing trained or registered"
        failed_gates = strings_at(r, "failed_gates")
        failed = f", failed: {', '.join(failed_gates)}" if failed_gates else ""
        aliases = ", ".join(strings_at(r, "aliases")) or "none"
        registered = f"{r['model_key']} as {r['registered_model']} v{r['version']}"
        lineage = f"modelupgrade lineage --model {r['registered_model']}"
        return "\n".join(
            [
                f"registered {registered} (gates: {r['gates']}{failed}; aliases: {aliases})",
                f"report:   {r['report']}",
                f"MLflow:   {r['tracking_uri']}  ({lineage})",
            ]
        )


class LineageOutcome(RecordedOutcome):
    """A chain's lineage and compatibility matrix: the record of ``write_lineage_report``."""

    def describe(self) -> str:
        r = self.record
        rows = objects_at(r, "lineage")
        lines = [f"{r['registered_model']} ({r['tracking_uri']}): {len(rows)} versions"]
        lines += [
            f"  v{row['version']} {row['model']}  parent={row['parent']}  gates={row['gates']}  "
            f"compatible_with={row['compatible_with']}  aliases={row['aliases']}"
            for row in rows
        ]
        compat = object_at(r, "compatibility")
        generations = strings_at(compat, "generations")
        lines.append(
            f"compatibility matrix, {compat['metric']} "
            "(rows: query generation, columns: gallery generation):"
        )
        lines.append("        " + "".join(f"{g:>8}" for g in generations))
        for row in objects_at(compat, "matrix"):
            cells = "".join(
                f"{row[g]:8.4f}" if row[g] is not None else " " * 8 for g in generations
            )
            lines.append(f"  {row['query']:<6}{cells}")
        lines.append(f"report:  {r['report']}")
        lines.append(f"heatmap: {r['heatmap']}")
        lines.append(f"metrics: {r['metrics_dir']}")
        return "\n".join(lines)


class BackfillOutcome(RecordedOutcome):
    """What keeping the gallery store on the champion did: the record of its backfill report."""

    def describe(self) -> str:
        lines = [f"store {self.record['store']}: {self.record['outcome']}"]
        if "report" in self.record:
            lines.append(f"report: {self.record['report']}")
        return "\n".join(lines)


def _verdict(outcome: RegistrationOutcome) -> str:
    key = outcome.model_key
    if outcome.gates == "first-generation":
        return f"{key} is the first generation and the champion"
    if "candidate" in outcome.aliases:
        return f"{key} passed the gates and is the candidate"
    if outcome.gates == "pass":
        return f"{key} passed the gates (another version is the candidate)"
    return f"{key} is registered but failed the gates: {', '.join(outcome.failed_gates)}"


def _facts(facts: Sequence[tuple[str, str]]) -> Table:
    """A two-column table of labelled facts (markdown tables need a header row: a blank one)."""
    return Table(["", ""], facts)


def _rows_table(rows: Sequence[Mapping[str, object]]) -> Block:
    if not rows:
        return Paragraph("_(none)_")
    return Table(list(rows[0]), [list(row.values()) for row in rows])


def _matrix_blocks(compat: Compatibility) -> list[Block]:
    # Above the diagonal nothing was measured on purpose: blank, not "missing".
    rows = [{k: ("" if v is None else v) for k, v in row.items()} for row in matrix_rows(compat)]
    numbers = ", ".join(
        f"{name} {format_cell(json_number(getattr(compat, key)))}"
        for name, key in COMPATIBILITY_NUMBERS
    )
    return [
        Paragraph(
            f"M(query generation, gallery generation) in {compat.metric}; lower triangle: a "
            "newer model searching an older gallery."
        ),
        _rows_table(rows),
        Paragraph(numbers),
    ]
