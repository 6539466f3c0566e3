"""Typed evaluation summaries: what ``metrics/<scenario>/summary.json`` holds, for its readers.

A two-model scenario's summary is a ``ScenarioEvaluation``: per strategy, one ``ComparisonRow``
per way of searching (the new model against itself, against the old gallery, through a forward or a
reverse head) with M, Δ↑, Δ↓ and the negative-flip rate. A sequential chain's is a
``ChainEvaluation``: its compatibility matrices (AC, AM, BC, FC) per metric and Δ↓ per generation;
``SequentialEvaluation`` gathers the chains' headline matrices. The report, the registry's gates and
the flows read these records, never the JSON by string keys.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject

R = TypeVar("R", bound="_Summary")

# The comparisons of a strategy's rows: the new model against itself, its queries against the old
# gallery, through a forward head (ψ(old) gallery) or a reverse head (transformed queries), and the
# same through a training-free adapter (Drift-Adapter, SLERP), kept apart from the trained heads.
SELF, BACKWARD, FORWARD_HEAD, REVERSE_HEAD = "self", "backward", "forward-head", "reverse-head"
FORWARD_ADAPTER, REVERSE_ADAPTER = "forward-adapter", "reverse-adapter"
HEAD_COMPARISONS = (FORWARD_HEAD, REVERSE_HEAD)
ADAPTER_COMPARISONS = (FORWARD_ADAPTER, REVERSE_ADAPTER)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Summary(_Record):
    def as_dict(self) -> JsonObject:
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def read(cls, path: str | Path) -> Self:
        path = Path(path)
        if not path.is_file():
            raise UserError(
                f"{path} does not exist", hint="run the evaluate stage first (dvc repro)"
            )
        try:
            return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except ValueError as err:
            first = str(err).splitlines()[0]
            raise UserError(
                f"{path} is not an evaluation summary this version reads: {first}"
            ) from None


class ComparisonRow(_Record):
    comparison: Literal[
        "self", "backward", "forward-head", "reverse-head", "forward-adapter", "reverse-adapter"
    ]
    query_set: str
    gallery_set: str
    metric: str
    value: float
    delta_up_pct: float
    delta_down_pct: float
    negative_flip_rate: float

    @property
    def head_set(self) -> str | None:
        """The evaluation set a head produced: ψ(old) gallery, or ψ_rev(new) queries."""
        return {
            FORWARD_HEAD: self.gallery_set,
            REVERSE_HEAD: self.query_set,
            FORWARD_ADAPTER: self.gallery_set,
            REVERSE_ADAPTER: self.query_set,
        }.get(self.comparison)

    @property
    def key(self) -> str:
        """``backward``; a head's comparison also names the head: ``forward-head.bict-bct``."""
        head = self.head_set
        return self.comparison if head is None else f"{self.comparison}.{head.split('(')[0]}"


class Convergence(_Record):
    """Whether a model or a head the scenario evaluates trained (the convergence gate of
    ``evaluation.convergence``): its statistics, the verdict, and each threshold it missed."""

    kind: Literal["model", "head"]
    statistics: dict[str, float]
    passed: bool
    reasons: list[str] = []

    @property
    def text(self) -> str:
        return "converged" if self.passed else "did not converge: " + "; ".join(self.reasons)


class ScenarioEvaluation(_Summary):
    """The cross-model evaluation of a two-model scenario (old gen0, new gen1-<strategy>)."""

    scenario: str
    protocol: JsonObject
    headline_metric: str
    old_model: str
    oracle: str | None
    device: str
    strategies: dict[str, list[ComparisonRow]]
    old_self: float
    oracle_self: float | None
    # Δ↓ per new model against the oracle strategy's model: what the registry's gates read.
    delta_down_pct: dict[str, float] = {}
    sources: dict[str, JsonObject] = {}
    # Every model (gen0, gen1-<strategy>) and trained head (by directory name) that was measured:
    # did it train? A claim resting on one that did not is not tested.
    convergence: dict[str, Convergence] = {}

    def converged(self, system: str) -> bool | None:
        """Whether ``system`` (a model, a head, or an evaluation set named after one such as
        ``fct-independent(gen0)``) passed the gate; None where it was not measured."""
        record = self.convergence.get(system.split("(")[0])
        return None if record is None else record.passed

    def rows(self, strategy: str) -> list[ComparisonRow]:
        return list(self.strategies.get(strategy, []))

    def row(self, strategy: str, comparison: str) -> ComparisonRow | None:
        return next((r for r in self.rows(strategy) if r.comparison == comparison), None)

    def headline_metrics(self) -> dict[str, float]:
        """Flat: M per comparison, Δ↑, Δ↓ and the negative-flip rate; not-applicable values
        (NaN, e.g. Δ↑ of a model against itself) left out."""
        metric = self.headline_metric
        metrics: dict[str, float | None] = {
            f"old_self.{metric}": self.old_self,
            f"oracle_self.{metric}": self.oracle_self,
        }
        for strategy, rows in self.strategies.items():
            for row in rows:
                key = f"{strategy}.{row.key}"
                metrics[f"{key}.{metric}"] = row.value
                metrics[f"{key}.delta_up_pct"] = row.delta_up_pct
                metrics[f"{key}.negative_flip_rate"] = row.negative_flip_rate
                metrics[f"{strategy}.delta_down_pct"] = row.delta_down_pct
        return _finite(metrics)


class Compatibility(_Record):
    """A chain's compatibility matrix in one metric and its summaries (AC with
    < and ≤, AM, BC, FC)."""

    generations: list[str]
    metric: str
    matrix: list[list[float]]
    # None: not measurable for this chain (e.g. FC of a chain of one generation).
    ac_lt: float | None
    ac_le: float | None
    am: float | None
    bc: float | None
    fc: float | None

    def numbers(self) -> dict[str, float | None]:
        return {
            "ac_lt": self.ac_lt,
            "ac_le": self.ac_le,
            "am": self.am,
            "bc": self.bc,
            "fc": self.fc,
        }


class GalleryRefresh(BaseModel):
    """Generation ``generation`` of a chain goes live: its queries first search the gallery as the
    chain left it (``current``: gen0's vectors for a chain without heads, else F_{i−1}, BiCT's
    M_BCT), then, for a chain with a forward head, the gallery ψ_i refreshed (``refreshed``: F_i,
    BiCT's M_FCT)."""

    model_config = ConfigDict(extra="forbid")

    generation: int
    current_gallery: str
    on_current: float
    refreshed_gallery: str | None = None
    on_refreshed: float | None = None


class ChainEvaluation(_Summary):
    """The evaluation of one sequential chain (``metrics/sequential/<strategy>/summary.json``)."""

    scenario: Literal["sequential"] = "sequential"
    strategy: str
    protocol: JsonObject
    headline_metric: str
    compatibility: dict[str, Compatibility]
    oracle: str | None
    # Δ↓ per generation against the oracle chain's same generation: what the gates read.
    delta_down_pct: dict[str, float] = {}
    # Per metric, each upgrade along the chain as BiCT's Table 6 reads it (``GalleryRefresh``).
    refreshes: dict[str, list[GalleryRefresh]] = {}

    @property
    def headline(self) -> Compatibility | None:
        return self.compatibility.get(self.headline_metric)


class SequentialEvaluation(_Summary):
    """Every chain's headline compatibility (``metrics/sequential/summary.json``)."""

    scenario: Literal["sequential"] = "sequential"
    protocol: JsonObject
    strategies: dict[str, Compatibility | None] = Field(default_factory=dict)

    def headline_metrics(self) -> dict[str, float]:
        metrics: dict[str, float | None] = {
            f"{strategy}.{name}": value
            for strategy, compat in self.strategies.items()
            if compat is not None
            for name, value in compat.numbers().items()
        }
        return _finite(metrics)


def read_evaluation(path: str | Path) -> ScenarioEvaluation | ChainEvaluation:
    """The summary at ``path``: a two-model scenario's or a sequential chain's."""
    path = Path(path)
    try:
        scenario = (
            json.loads(path.read_text(encoding="utf-8")).get("scenario") if path.is_file() else None
        )
    except ValueError:
        scenario = None  # read() says what is wrong with the file
    return (ChainEvaluation if scenario == "sequential" else ScenarioEvaluation).read(path)


def _finite(metrics: dict[str, float | None]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)}
