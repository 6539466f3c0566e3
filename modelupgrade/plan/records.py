"""The plan's records: what is measured per option (``OptionMeasure``, ``PlanMeasurements``) and
the table for one gallery size (``PlanRow``, ``Recommendation``, ``UpgradePlan``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pandas as pd

from modelupgrade.json_data import JsonObject, json_record

# Timing rounds whose slowest is more than this factor of the fastest make a cost unstable.
UNSTABLE_SPREAD = 1.5

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
    # How stable its unit cost was: the slowest timing round over the fastest (1.0: steady).
    timing_spread: float | None = None
    # The fitted adapter, saved as a head directory (relative to the plan's directory).
    head: str | None = None


@dataclass(frozen=True)
class MachineLoad:
    """How busy the machine was while the plan timed its costs: the 1-minute load average
    before and after, against the cores this process may use."""

    cores: int
    load_before: float
    load_after: float

    # A load above this share of the cores means other work competed with the timings.
    BUSY_SHARE = 0.75

    @property
    def busy(self) -> bool:
        return max(self.load_before, self.load_after) > self.BUSY_SHARE * self.cores


@dataclass(frozen=True)
class PlanMeasurements:
    """Everything ``plan_table`` needs: the options and how they were measured."""

    metric: str
    options: list[OptionMeasure]
    device: str
    protocol: JsonObject
    backfill: JsonObject
    models: dict[str, str]
    machine: MachineLoad | None = None

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
    # The share of the way from M(old, old) to M(new, new) this option covers.
    gap_closed_pct: float | None
    negative_flip_rate: float | None
    images_to_embed: int
    vectors_to_transform: int
    backfill_seconds: float
    training_seconds: float
    one_time_seconds: float
    query_overhead_us: float | None
    backfill_auc: float | None
    note: str
    timing_spread: float | None = None
    head: str | None = None


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

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> UpgradePlan:
        """The plan as ``as_dict`` wrote it (plan.json)."""
        measured = saved["measurements"]
        machine = measured.get("machine")
        measurements = PlanMeasurements(
            **{
                **measured,
                "options": [OptionMeasure(**option) for option in measured["options"]],
                "machine": None if machine is None else MachineLoad(**machine),
            }
        )
        return cls(
            gallery_size=saved["gallery_size"],
            tolerance_pct=saved["tolerance_pct"],
            metric=saved["metric"],
            rows=[PlanRow(**row) for row in saved["rows"]],
            recommendation=Recommendation(**saved["recommendation"]),
            measurements=measurements,
        )

    def as_dict(self) -> JsonObject:
        return {
            "gallery_size": self.gallery_size,
            "tolerance_pct": self.tolerance_pct,
            "metric": self.metric,
            "device": self.measurements.device,
            "recommendation": json_record(self.recommendation),
            "rows": [json_record(row) for row in self.rows],
            "measurements": json_record(self.measurements),
        }

    def table_columns(self) -> list[str]:
        return [
            "option",
            self.metric,
            "Δ vs old",
            "of M(new,new)",
            "of the gap",
            "neg. flips",
            "images to re-embed",
            "vectors to transform",
            "backfill time",
            "fit / training",
            "per query",
            "backfill AUC",
        ]

    def table_cells(self) -> list[list[str]]:
        """Each option's row as the plan shows it: plan.md and the upgrade's report both print
        these cells, so the two cannot disagree."""
        return [
            [
                r.option,
                number(r.M),
                percent(r.delta_vs_old_pct, signed=True),
                percent(r.of_new_new_pct),
                percent(r.gap_closed_pct),
                number(r.negative_flip_rate),
                f"{r.images_to_embed:,}",
                f"{r.vectors_to_transform:,}",
                duration(r.backfill_seconds),
                duration(r.training_seconds),
                "" if r.query_overhead_us is None else f"{r.query_overhead_us:.2f} µs",
                number(r.backfill_auc),
            ]
            for r in self.rows
        ]

    def measured_on(self) -> str:
        return (
            f"Measured on {self.measurements.device}; {self.metric} on "
            f"{self.measurements.protocol['description']}."
        )

    def markdown(self) -> str:
        columns = self.table_columns()
        lines = [
            f"# Upgrade plan for a gallery of {self.gallery_size:,} images",
            "",
            self.measured_on(),
            "",
            "| " + " | ".join(columns) + " |",
            "|" + "---|" * len(columns),
            *("| " + " | ".join(cells) + " |" for cells in self.table_cells()),
        ]
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
            "",
            *self.timing_lines(),
        ]
        return "\n".join(lines) + "\n"

    def timing_lines(self) -> list[str]:
        """How far the costs can be trusted: the timing rounds' spread, and the machine's load."""
        spreads = {r.option: r.timing_spread for r in self.rows if r.timing_spread is not None}
        lines = []
        if spreads:
            worst = max(spreads, key=lambda name: spreads[name])
            shown = ", ".join(f"{name} {spread:.2f}×" for name, spread in spreads.items())
            verdict = "stable" if spreads[worst] <= UNSTABLE_SPREAD else "**unstable**"
            lines.append(
                f"Costs: each is the fastest of several timing rounds on "
                f"{self.measurements.device}; the slowest round over the fastest: {shown} "
                f"({verdict}: {worst} varied most)."
            )
        machine = self.measurements.machine
        if machine is not None and machine.busy:
            lines.append(
                f"**The machine was busy while timing** (load average "
                f"{max(machine.load_before, machine.load_after):.1f} on {machine.cores} cores): "
                "other work competed with the measurements, so the costs are likely too high; "
                "plan again on a quiet machine for firm numbers."
            )
        elif machine is not None:
            lines.append(
                f"The machine was quiet while timing (load average "
                f"{max(machine.load_before, machine.load_after):.1f} on {machine.cores} cores)."
            )
        return lines


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
