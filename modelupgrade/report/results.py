"""What the study measured, read back from the files of the evaluate and simulate_backfill stages.

``metrics/<scenario>/summary.json``, ``backfill_summary.json`` and ``backfill_curves.parquet``,
``metrics/sequential/<strategy>/summary.json`` and the plots beside them; the names of the study's
strategies and heads come from params. The report computes nothing new from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelupgrade.backfill.summary import BackfillSummary, CurveSummary
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.layout import (
    BACKFILL_CURVES,
    BACKFILL_SUMMARY_FILE,
    SEQUENTIAL,
    SUMMARY,
    StudyLayout,
    head_name,
)

# The comparisons of an evaluation summary's rows (modelupgrade.evaluation): a new model against
# itself, its queries against the old gallery, through a forward head (ψ(old) gallery) or a
# reverse head (transformed queries).
SELF = "self"
BACKWARD = "backward"
FORWARD_HEAD = "forward-head"
REVERSE_HEAD = "reverse-head"
HEAD_COMPARISONS = (FORWARD_HEAD, REVERSE_HEAD)
# The metric the backfill curves are summarised in.
CURVE_METRIC = "mAP"


@dataclass
class ScenarioResults:
    name: str
    evaluation: dict[str, Any]
    backfill: BackfillSummary | None
    heatmap: Path | None
    curves_plot: Path | None
    curves: Any = None  # the tidy backfill_curves table (pandas), when simulated
    # A head's system in the backfill curves (``layout.head_name``) → the strategy it pairs with.
    head_systems: dict[str, str] = field(default_factory=dict)

    @property
    def metric(self) -> str:
        return str(self.evaluation["headline_metric"])

    def rows(self, strategy: str) -> list[dict[str, Any]]:
        return list(self.evaluation["strategies"].get(strategy, []))

    def value(self, strategy: str, comparison: str) -> float | None:
        values = [r["value"] for r in self.rows(strategy) if r["comparison"] == comparison]
        return max(values) if values else None

    def row(self, strategy: str, comparison: str) -> dict[str, Any] | None:
        return next((r for r in self.rows(strategy) if r["comparison"] == comparison), None)

    def curve(self, strategy: str, policy: str, mode: str) -> CurveSummary | None:
        """One backfill curve's summary (AUCs, Seo et al.'s conditions), None if not simulated."""
        return None if self.backfill is None else self.backfill.curve(strategy, policy, mode)

    def backfill_curves(self) -> list[CurveSummary]:
        return [] if self.backfill is None else list(self.backfill.curves)

    @property
    def primary_auc(self) -> str:
        return "auc_trapezoid" if self.backfill is None else self.backfill.primary_auc

    def curve_value(
        self, strategy: str, policy: str, mode: str, t: float, metric: str = CURVE_METRIC
    ) -> float | None:
        """A backfill curve's ``metric`` at backfilled fraction ``t``, None if not simulated."""
        if self.curves is None:
            return None
        curves = self.curves
        rows = curves[
            (curves.strategy == strategy) & (curves.policy == policy) & (curves["mode"] == mode)
        ]
        rows = rows[(rows.t - t).abs() < 1e-9]
        return float(rows[metric].iloc[0]) if len(rows) else None


@dataclass
class StudyResults:
    scenarios: list[ScenarioResults]
    sequential: dict[str, dict[str, Any]] = field(default_factory=dict)
    sequential_plots: dict[str, Path] = field(default_factory=dict)
    strategy_kinds: dict[str, str] = field(default_factory=dict)  # strategy name → its kind

    def strategies_of_kind(self, kind: str) -> list[str]:
        return [name for name, of_kind in self.strategy_kinds.items() if of_kind == kind]


def collect_results(params: Params, layout: StudyLayout) -> StudyResults:
    """Every scenario's and chain's results found in ``layout``'s metrics and plots."""
    import pandas as pd

    scenarios = []
    for name, scenario in params.scenarios.items():
        metrics, plots = layout.metrics(name), layout.plots(name)
        backfill = metrics / BACKFILL_SUMMARY_FILE
        heatmap = layout.heatmap(name)
        curves_plot = plots / f"{BACKFILL_CURVES}.png"
        curves = metrics / f"{BACKFILL_CURVES}.parquet"
        scenarios.append(
            ScenarioResults(
                name=name,
                evaluation=_read_json(metrics / f"{SUMMARY}.json"),
                backfill=BackfillSummary.read(backfill) if backfill.is_file() else None,
                heatmap=heatmap if heatmap.is_file() else None,
                curves_plot=curves_plot if curves_plot.is_file() else None,
                curves=pd.read_parquet(curves) if curves.is_file() else None,
                head_systems={head_name(h, s): s for h, s in scenario.heads.items()},
            )
        )
    study = StudyResults(
        scenarios, strategy_kinds={name: s.kind for name, s in params.strategies.items()}
    )
    for strategy in params.sequential.strategies:
        summary = layout.metrics(SEQUENTIAL, strategy) / f"{SUMMARY}.json"
        if summary.is_file():
            study.sequential[strategy] = _read_json(summary)
            plot = layout.heatmap(SEQUENTIAL, strategy)
            if plot.is_file():
                study.sequential_plots[strategy] = plot
    return study


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(
            f"{path} does not exist",
            hint="run the evaluate and simulate_backfill stages first (dvc repro)",
        )
    return json.loads(path.read_text(encoding="utf-8"))
