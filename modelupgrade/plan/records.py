"""The plan's records: what is measured per option (``OptionMeasure``, ``PlanMeasurements``) and
the table for one gallery size (``PlanRow``, ``Recommendation``, ``UpgradePlan``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pandas as pd

OptionKind = Literal["keep", "reembed", "query-adapter", "gallery-adapter", "compatible"]


@dataclass(frozen=True)
class OptionMeasure:
    """One option as measured on the sample: its quality and its unit costs on this machine.

    ``metrics`` is None for an option that was not run (compatible fine-tuning not trained).
    """

    name: str
    kind: OptionKind
    description: str
    metrics: dict[str, float] | None = None
    negative_flip_rate: float | None = None
    # One-time costs per gallery item: embedding one image, transforming one stored vector.
    seconds_per_image: float | None = None
    seconds_per_vector: float | None = None
    # Added to every query (a query-side adapter), measured per vector in batches.
    query_overhead_us: float | None = None
    # One-time: fitting the adapter (measured) or training the model (measured or estimated).
    training_seconds: float = 0.0
    training_note: str = ""
    backfill_auc: float | None = None
    backfill_curve: dict[str, list[float]] | None = None
    note: str = ""


@dataclass(frozen=True)
class PlanMeasurements:
    """Everything ``plan_table`` needs: the options and how they were measured."""

    metric: str
    options: list[OptionMeasure]
    device: str
    protocol: dict[str, Any]
    backfill: dict[str, Any]
    models: dict[str, str]

    def option(self, name: str) -> OptionMeasure:
        for option in self.options:
            if option.name == name:
                return option
        raise KeyError(name)


@dataclass(frozen=True)
class PlanRow:
    """One option costed for the gallery: the table's row."""

    option: str
    kind: str
    description: str
    M: float | None
    delta_vs_old_pct: float | None
    of_new_new_pct: float | None
    negative_flip_rate: float | None
    images_to_embed: int
    vectors_to_transform: int
    backfill_seconds: float
    training_seconds: float
    one_time_seconds: float
    query_overhead_us: float | None
    backfill_auc: float | None
    note: str


@dataclass(frozen=True)
class Recommendation:
    option: str
    reason: str
    eligible: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class UpgradePlan:
    """The table for one gallery size, its recommendation, and what was measured."""

    gallery_size: int
    tolerance_pct: float
    metric: str
    rows: list[PlanRow]
    recommendation: Recommendation
    measurements: PlanMeasurements

    def row(self, option: str) -> PlanRow:
        for row in self.rows:
            if row.option == option:
                return row
        raise KeyError(option)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(row) for row in self.rows])

    def as_dict(self) -> dict[str, Any]:
        return {
            "gallery_size": self.gallery_size,
            "tolerance_pct": self.tolerance_pct,
            "metric": self.metric,
            "device": self.measurements.device,
            "recommendation": asdict(self.recommendation),
            "rows": [asdict(row) for row in self.rows],
            "measurements": asdict(self.measurements),
        }

    def markdown(self) -> str:
        m = self.metric
        header = (
            f"| option | {m} | Δ vs old | of M(new,new) | neg. flips | images to re-embed | "
            "vectors to transform | backfill time | fit / training | per query | backfill AUC |"
        )
        lines = [
            f"# Upgrade plan for a gallery of {self.gallery_size:,} images",
            "",
            (
                f"Measured on {self.measurements.device}; {m} on "
                f"{self.measurements.protocol['description']}."
            ),
            "",
            header,
            "|" + "---|" * 11,
        ]
        for r in self.rows:
            lines.append(
                f"| {r.option} | {number(r.M)} | {percent(r.delta_vs_old_pct, signed=True)} | "
                f"{percent(r.of_new_new_pct)} | {number(r.negative_flip_rate)} | "
                f"{r.images_to_embed:,} | {r.vectors_to_transform:,} | "
                f"{duration(r.backfill_seconds)} | {duration(r.training_seconds)} | "
                f"{'' if r.query_overhead_us is None else f'{r.query_overhead_us:.2f} µs'} | "
                f"{number(r.backfill_auc)} |"
            )
        lines += [
            "",
            f"**Recommended: {self.recommendation.option}.** {self.recommendation.reason}",
        ]
        notes = [f"- {r.option}: {r.note}" for r in self.rows if r.note]
        if notes:
            lines += ["", "Notes:", *notes]
        backfill = self.measurements.backfill
        lines += [
            "",
            (
                f"Backfill curves: {backfill['mode']} serving, {backfill['policy']} order, "
                f"{backfill['points']} points; AUC ({backfill['auc']}) of {backfill['metric']}."
            ),
        ]
        return "\n".join(lines) + "\n"


def number(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.4f}"


def percent(value: float | None, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return ""
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"


def duration(seconds: float) -> str:
    """A duration a person reads at a glance: µs to days."""
    if seconds == 0:
        return "0"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds * 1e3:.3g} ms"
