"""What a team deciding an upgrade reads first: per scenario, over the training seeds, the best way
to serve the new model before any backfill and the best way to backfill.

Every option is weighed by its mean over the seeds that measured it (the study's own and the
replicates'), shown as mean ± sd with how many seeds beat the old system; a scenario where no head
or adapter was tried says so, since its best option is then among the strategies' own models only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from modelupgrade.evaluation.summary import (
    ADAPTER_COMPARISONS,
    BACKWARD,
    FORWARD_ADAPTER,
    FORWARD_HEAD,
    HEAD_COMPARISONS,
    REVERSE_ADAPTER,
    REVERSE_HEAD,
    SELF,
)
from modelupgrade.report.document import MISSING, Block, Heading, Paragraph, Table
from modelupgrade.report.numbers import M_DIGITS, PERCENT_DIGITS, spread
from modelupgrade.report.results import CURVE_METRIC, ScenarioResults, StudyResults

# What a search of the old gallery costs before any backfill, by how it searches it.
NO_BACKFILL_COST = {
    BACKWARD: "nothing: new queries on the stored vectors",
    FORWARD_HEAD: "ψ over every stored vector, once (no image)",
    FORWARD_ADAPTER: "the adapter over every stored vector, once (no image)",
    REVERSE_HEAD: "ψ_rev on every query",
    REVERSE_ADAPTER: "the adapter on every query",
}
KEEP_OLD = "none beats the old system on average: keep it serving until a backfill"
NOTHING_TRIED = "none: only the strategies' own models"


@dataclass
class Option:
    """One way of searching (a query set against a gallery set) or of backfilling (system ·
    order · serving mode), with its number on each seed that measured it."""

    name: str
    values: list[float] = field(default_factory=list)
    # Each seed's M(old, old), where it beat it (searches only).
    beats: list[bool] = field(default_factory=list)
    comparison: str = ""
    delta_up: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else -math.inf


def scenario_runs(seeds: Sequence[StudyResults], name: str) -> list[ScenarioResults]:
    """The scenario ``name`` on each seed that ran it (the study's own first)."""
    return [sc for study in seeds for sc in study.scenarios if sc.name == name]


def best_search(runs: Sequence[ScenarioResults]) -> Option | None:
    """The search of the old gallery with the highest mean M over the seeds (every strategy, head
    and adapter; not a model's self-test)."""
    options: dict[tuple[str, str], Option] = {}
    for sc in runs:
        old_self = sc.evaluation.old_self
        for strategy in sc.evaluation.strategies:
            for row in sc.rows(strategy):
                if row.comparison == SELF or not math.isfinite(row.value):
                    continue
                option = options.setdefault(
                    (row.query_set, row.gallery_set),
                    Option(f"{row.query_set} → {row.gallery_set}", comparison=row.comparison),
                )
                option.values.append(row.value)
                option.beats.append(row.value > old_self)
                option.delta_up.append(row.delta_up_pct)
    return max(options.values(), key=lambda o: o.mean, default=None)


def best_backfill(runs: Sequence[ScenarioResults]) -> Option | None:
    """The deployable backfill (system · order · serving mode) with the highest mean area under its
    curve over the seeds that simulated it."""
    options: dict[tuple[str, str, str], Option] = {}
    for sc in runs:
        for curve in sc.backfill_curves():
            auc = curve.auc(sc.primary_auc).get(CURVE_METRIC, math.nan)
            if curve.deployable and math.isfinite(auc):
                key = (curve.strategy, curve.policy, curve.mode)
                options.setdefault(key, Option(" · ".join(key))).values.append(auc)
    return max(options.values(), key=lambda o: o.mean, default=None)


def tried(sc: ScenarioResults) -> str:
    """The heads and training-free adapters the scenario evaluated, counted; or that none was."""
    heads, adapters = set(), set()
    for strategy in sc.evaluation.strategies:
        for row in sc.rows(strategy):
            name = (row.head_set or "").split("(")[0]
            if row.comparison in HEAD_COMPARISONS:
                heads.add(name)
            elif row.comparison in ADAPTER_COMPARISONS:
                adapters.add(name)
    if not heads and not adapters:
        return NOTHING_TRIED
    parts = [(len(heads), "head"), (len(adapters), "adapter")]
    return ", ".join(f"{n} {what}{'s' if n != 1 else ''}" for n, what in parts if n)


def _cost(best: Option, old_mean: float) -> str:
    if best.mean <= old_mean:
        return KEEP_OLD
    return NO_BACKFILL_COST.get(best.comparison, MISSING)


def _seeds(count: int) -> str:
    return f"{count} seed{'' if count == 1 else 's'}"


def _seeds_text(option: Option | None) -> str:
    if option is None:
        return MISSING
    return f"{sum(option.beats)}/{_seeds(len(option.beats))}"


def lead_row(runs: Sequence[ScenarioResults]) -> list[object]:
    first = runs[0]
    old = [sc.evaluation.old_self for sc in runs]
    new = [sc.evaluation.oracle_self for sc in runs if sc.evaluation.oracle_self is not None]
    search, backfill = best_search(runs), best_backfill(runs)
    old_mean = statistics.fmean(old)
    return [
        first.name,
        len(runs),
        spread(old, M_DIGITS),
        spread(new, M_DIGITS),
        MISSING if search is None else search.name,
        MISSING if search is None else spread(search.values, M_DIGITS),
        MISSING if search is None else spread(search.delta_up, PERCENT_DIGITS, sign=True),
        _seeds_text(search),
        MISSING if search is None else _cost(search, old_mean),
        MISSING if backfill is None else backfill.name,
        MISSING
        if backfill is None
        else f"{spread(backfill.values, M_DIGITS)} ({_seeds(len(backfill.values))})",
        tried(first),
    ]


def lead_blocks(seeds: Sequence[StudyResults]) -> list[Block]:
    """The lead table: one row per scenario of the study, over ``seeds`` (the study first)."""
    if not seeds or not seeds[0].scenarios:
        return []
    rows = [lead_row(scenario_runs(seeds, sc.name)) for sc in seeds[0].scenarios]
    untried = [row[0] for row in rows if row[-1] == NOTHING_TRIED]
    return [
        Heading("What to use, per scenario", 2),
        Paragraph(
            "Read this first. For each scenario, over the training seeds that ran it (the "
            "study's own and the replicates', mean ± sd): the old system's level M(old, old) "
            "and the independently trained new model's M(new, new); the best way to serve the "
            "new model before any backfill (the search of the old gallery with the highest mean "
            "M over every strategy, head and training-free adapter), its Δ↑ over M(old, old), on "
            "how many of the seeds that measured it it beat the old system, and what it costs; "
            "and the best deployable backfill (system · ordering · serving mode) by the mean "
            f"area under its {CURVE_METRIC} curve. The claims weigh differences with a paired "
            "test; the tables and curves below give every option."
            + (
                f" No head or adapter was tried in {', '.join(map(str, untried))}: the best "
                "option there is among the strategies' own models only, and a head or adapter "
                "might serve better."
                if untried
                else ""
            )
        ),
        Table(
            [
                "scenario",
                "seeds",
                "M(old, old)",
                "independent M(new, new)",
                "best without backfill",
                "M",
                "Δ↑ %",
                "beats M(old, old) on",
                "it costs",
                "best backfill",
                "AUC",
                "heads and adapters tried",
            ],
            rows,
        ),
    ]
