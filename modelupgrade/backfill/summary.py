"""Curve summaries: AUC (FastFill's mean of the points; the trapezoid integral), Seo et al.'s three
conditions for online backfilling, and the typed summary of a scenario's study
(``backfill_summary.json``) that the report and the registry read."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, computed_field, model_validator

from modelupgrade.errors import UserError


def auc_mean(values: np.ndarray) -> float:
    """FastFill's backfilling metric: the plain mean over the evaluation points."""
    return float(np.mean(values))


def auc_trapezoid(t: np.ndarray, values: np.ndarray) -> float:
    """∫₀¹ M_t dt by the trapezoid rule over the points (Seo et al.'s AUC)."""
    t = np.asarray(t, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    return float(np.sum((t[1:] - t[:-1]) * (v[1:] + v[:-1]) / 2.0))


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BackfillConditions(_Record):
    """Seo et al. Eqs. 6–8: start ≥ M(old, old), end ≥ M(new, new) of the independently trained
    new model (Eq. 7; None when the study has no such model), non-decreasing in t."""

    starts_at_or_above_old: bool
    ends_at_or_above_new: bool | None
    monotone: bool
    largest_drop: float
    # The largest drop's standard error over the test queries (``modelupgrade.backfill.
    # per_query``; where the curve never drops, its smallest rise's): NaN where the queries were
    # not kept.
    largest_drop_se: float = float("nan")

    @model_validator(mode="before")
    @classmethod
    def _written_with_all_met(cls, data: object) -> object:
        # all_met is derived, and written for readers of the JSON: it is not read back.
        return {k: v for k, v in data.items() if k != "all_met"} if isinstance(data, dict) else data

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented computed property
    @property
    def all_met(self) -> bool:
        return self.starts_at_or_above_old and self.ends_at_or_above_new is True and self.monotone

    def as_dict(self) -> dict[str, object]:
        return self.model_dump()


def check_conditions(
    values: np.ndarray,
    old_old: float,
    new_new: float | None,
    tolerance: float = 1e-9,
    drop_se: float = float("nan"),
) -> BackfillConditions:
    """``new_new`` is M(new, new) of the independently trained new model, not of the system's own
    new model: against its own, the end condition would hold by construction for every mode
    whose end point is its new model searching its new gallery."""
    values = np.asarray(values, dtype=np.float64)
    drops = values[:-1] - values[1:]
    return BackfillConditions(
        starts_at_or_above_old=bool(values[0] >= old_old - tolerance),
        ends_at_or_above_new=None if new_new is None else bool(values[-1] >= new_new - tolerance),
        monotone=bool(np.all(drops <= tolerance)),
        largest_drop=float(max(drops.max(initial=0.0), 0.0)),
        largest_drop_se=drop_se,
    )


Metrics = dict[str, float]


class CurveSummary(_Record):
    """One (system, ordering policy, serving mode) curve of a study."""

    strategy: str
    policy: str
    mode: str
    deployable: bool
    auc_mean: Metrics
    auc_trapezoid: Metrics
    conditions: dict[str, BackfillConditions]
    start: Metrics
    end: Metrics
    start_single_system: Metrics
    end_single_system: Metrics
    endpoints_match: bool
    max_negative_flip_rate: float
    new_new: Metrics
    # How many orders the curve is the mean of: several for a policy that draws from the seed.
    permutations: int = 1

    def auc(self, kind: str) -> Metrics:
        """The AUCs of each metric by ``kind``: ``auc_mean`` or ``auc_trapezoid``."""
        return self.auc_mean if kind == "auc_mean" else self.auc_trapezoid


class GridRecord(_Record):
    kind: str
    t: list[float]
    cutoffs: list[int]


class BackfillSummary(_Record):
    """What ``simulate_backfill`` found for one scenario (``backfill_summary.json``)."""

    scenario: str
    protocol: str
    distance: str
    grid: GridRecord
    gallery_size: int
    queries: int
    old_old: Metrics
    # Seo et al.'s Eq. 7 reference: M(new, new) of the independently trained new model
    # (``evaluation.oracle_strategy``); None when the study does not include it.
    reference_system: str | None = None
    reference_new_new: Metrics | None = None
    primary_auc: Literal["auc_mean", "auc_trapezoid"]
    curves: list[CurveSummary]
    skipped: list[dict[str, str]]
    policies_known: list[str]
    serving_modes_known: list[str]

    def curve(self, strategy: str, policy: str, mode: str) -> CurveSummary | None:
        return next(
            (c for c in self.curves if (c.strategy, c.policy, c.mode) == (strategy, policy, mode)),
            None,
        )

    def headline_metrics(self) -> dict[str, float]:
        """Flat: per curve (``<strategy>.<policy>.<mode>``) the primary AUC of each metric and the
        largest negative-flip rate, and old/old for reference; finite numbers only."""
        metrics = {f"old_old.{m}": v for m, v in self.old_old.items()}
        for curve in self.curves:
            key = f"{curve.strategy}.{curve.policy}.{curve.mode}"
            metrics.update(
                {f"{key}.{self.primary_auc}.{m}": v for m, v in curve.auc(self.primary_auc).items()}
            )
            metrics[f"{key}.max_negative_flip_rate"] = curve.max_negative_flip_rate
        return {k: float(v) for k, v in metrics.items() if math.isfinite(v)}

    def as_dict(self) -> dict[str, object]:
        return self.model_dump(mode="json")

    @classmethod
    def read(cls, path: str | Path) -> BackfillSummary:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"{path} does not exist", hint="run the simulate_backfill stage first")
        try:
            return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, json.JSONDecodeError) as err:
            raise UserError(
                f"{path} is not a backfill summary this version reads: {err}".splitlines()[0]
            ) from None
