"""What the study measured, read back from the files of the evaluate and simulate_backfill stages.

``metrics/<scenario>/summary.json`` and ``backfill_summary.json``,
``metrics/sequential/<strategy>/summary.json`` and the plots beside them; the names and kinds of the
study's scenarios, strategies and heads come from params. The report computes nothing new from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from modelupgrade.backfill.summary import BackfillSummary, CurveSummary
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.evaluation.summary import ChainEvaluation, ComparisonRow, ScenarioEvaluation
from modelupgrade.layout import (
    BACKFILL_CURVES,
    BACKFILL_PER_QUERY_FILE,
    BACKFILL_SUMMARY_FILE,
    PER_QUERY_AP_FILE,
    SEQUENTIAL,
    SUMMARY,
    StudyLayout,
    head_name,
)
from modelupgrade.replicates import replicate_dir, replicate_layout, replicate_params
from modelupgrade.report.settings import SettingRow, settings_against_papers

# The metric the backfill curves are summarised in.
CURVE_METRIC = "mAP"


@dataclass
class ScenarioResults:
    name: str
    kind: str  # the scenario's kind in params (extended-data, open-class, …)
    evaluation: ScenarioEvaluation
    backfill: BackfillSummary | None
    heatmap: Path | None
    curves_plot: Path | None
    # A head's system in the backfill curves (``layout.head_name``) → the strategy it pairs with.
    head_systems: dict[str, str] = field(default_factory=dict)
    # A trained head (``layout.head_name``) → its kind in params (fct, fastfill, …).
    head_kinds: dict[str, str] = field(default_factory=dict)
    # Where the scenario's per-query files are (None: not kept; no query bootstrap).
    metrics_dir: Path | None = None

    def heads_of_kind(self, kind: str) -> dict[str, str]:
        """The scenario's trained heads of ``kind``: the strategy each pairs with → its name."""
        return {
            self.head_systems[name]: name
            for name, of_kind in self.head_kinds.items()
            if of_kind == kind and name in self.head_systems
        }

    def per_query_ap(self, query_set: str, gallery_set: str) -> np.ndarray | None:
        """Each query's AP of one evaluated pair (the evaluation's ``per_query_ap.parquet``)."""
        table = self._per_query(PER_QUERY_AP_FILE)
        if table is None:
            return None
        rows = table[(table.query_set == query_set) & (table.gallery_set == gallery_set)]
        return rows.sort_values("query").ap.to_numpy() if len(rows) else None

    def per_query_auc(
        self, strategy: str, policy: str, mode: str, metric: str, kind: str
    ) -> np.ndarray | None:
        """Each query's area under one backfill curve (the simulator's per-query file)."""
        table = self._per_query(BACKFILL_PER_QUERY_FILE)
        if table is None:
            return None
        # By item, not attribute: ``mode`` is also a DataFrame method.
        rows = table[
            (table["strategy"] == strategy)
            & (table["policy"] == policy)
            & (table["mode"] == mode)
            & (table["metric"] == metric)
            & (table["kind"] == kind)
        ]
        return rows.sort_values("query")["value"].to_numpy() if len(rows) else None

    def curve_points(self, strategy: str, policy: str, mode: str) -> pd.DataFrame | None:
        """One backfill curve's points in t order (the simulator's ``backfill_curves.parquet``);
        None where it was not simulated."""
        table = self._per_query(f"{BACKFILL_CURVES}.parquet")
        if table is None:
            return None
        chosen = (table.strategy == strategy) & (table.policy == policy) & (table["mode"] == mode)
        rows = table[chosen]
        return rows.sort_values("t") if len(rows) else None

    def _per_query(self, name: str) -> pd.DataFrame | None:
        if self.metrics_dir is None or not (self.metrics_dir / name).is_file():
            return None
        if name not in self._tables:
            self._tables[name] = pd.read_parquet(self.metrics_dir / name)
        return self._tables[name]

    _tables: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)

    @property
    def metric(self) -> str:
        return self.evaluation.headline_metric

    def rows(self, strategy: str) -> list[ComparisonRow]:
        return self.evaluation.rows(strategy)

    def value(self, strategy: str, comparison: str) -> float | None:
        values = [r.value for r in self.rows(strategy) if r.comparison == comparison]
        return max(values) if values else None

    def row(self, strategy: str, comparison: str) -> ComparisonRow | None:
        return self.evaluation.row(strategy, comparison)

    def curve(self, strategy: str, policy: str, mode: str) -> CurveSummary | None:
        """One backfill curve's summary (AUCs, Seo et al.'s conditions), None if not simulated."""
        return None if self.backfill is None else self.backfill.curve(strategy, policy, mode)

    def backfill_curves(self) -> list[CurveSummary]:
        return [] if self.backfill is None else list(self.backfill.curves)

    @property
    def primary_auc(self) -> str:
        return "auc_trapezoid" if self.backfill is None else self.backfill.primary_auc


@dataclass
class StudyResults:
    scenarios: list[ScenarioResults]
    sequential: dict[str, ChainEvaluation] = field(default_factory=dict)
    sequential_plots: dict[str, Path] = field(default_factory=dict)
    strategy_kinds: dict[str, str] = field(default_factory=dict)  # strategy name → its kind
    settings: list[SettingRow] = field(default_factory=list)  # where the params leave the papers
    seed: int | None = None  # the training seed the results are of

    def strategies_of_kind(self, kind: str) -> list[str]:
        return [name for name, of_kind in self.strategy_kinds.items() if of_kind == kind]


def collect_results(params: Params, layout: StudyLayout) -> StudyResults:
    """Every scenario's and chain's results found in ``layout``'s metrics and plots."""
    scenarios = []
    for name, scenario in params.studied.items():
        metrics, plots = layout.metrics(name), layout.plots(name)
        backfill = metrics / BACKFILL_SUMMARY_FILE
        heatmap = layout.heatmap(name)
        curves_plot = plots / f"{BACKFILL_CURVES}.png"
        scenarios.append(
            ScenarioResults(
                name=name,
                kind=scenario.kind,
                evaluation=ScenarioEvaluation.read(metrics / f"{SUMMARY}.json"),
                backfill=BackfillSummary.read(backfill) if backfill.is_file() else None,
                heatmap=heatmap if heatmap.is_file() else None,
                curves_plot=curves_plot if curves_plot.is_file() else None,
                head_systems={head_name(h, s): s for h, s in scenario.heads.items()},
                head_kinds={
                    head_name(h, s): params.heads[h].kind
                    for h, s in scenario.heads.items()
                    if h in params.heads
                },
                metrics_dir=metrics,
            )
        )
    study = StudyResults(
        scenarios,
        strategy_kinds={name: s.kind for name, s in params.strategies.items()},
        settings=settings_against_papers(params),
        seed=params.seed,
    )
    for strategy in params.sequential.strategies:
        summary = layout.metrics(SEQUENTIAL, strategy) / f"{SUMMARY}.json"
        if summary.is_file():
            study.sequential[strategy] = ChainEvaluation.read(summary)
            plot = layout.heatmap(SEQUENTIAL, strategy)
            if plot.is_file():
                study.sequential_plots[strategy] = plot
    return study


def collect_replicates(params: Params, root: Path) -> list[StudyResults]:
    """Each seed of ``replicates.seeds``'s results under ``root`` (the replicates stage's)."""
    found = []
    for seed in params.replicates.seeds:
        if not replicate_dir(root, seed).is_dir():
            raise UserError(
                f"replicates.seeds lists seed {seed}, but {replicate_dir(root, seed)} holds no "
                "results",
                hint="run the replicates stage first (dvc repro replicates), or remove the seed",
            )
        found.append(collect_results(replicate_params(params, seed), replicate_layout(root, seed)))
    return found
