"""One upgraded system's backfill curves: every (ordering policy, serving mode) of one variant.

``StudyArrays`` is what every variant of a scenario's study shares: the evaluation splits' labels,
the old model's vectors (and logits), the grid and the metrics' settings. ``variant_curves``
simulates one variant against it: its serving arrays (new embeddings and head outputs), the orders
each available policy draws, each serving mode's curves (every order of every policy of a mode over
the same ranked query blocks), and returns the tidy tables and summaries of its curves with the
combinations it could not run and why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from modelupgrade.arrays import load_array
from modelupgrade.backfill.engine import SearchSystems, backfill_curves, mean_curve
from modelupgrade.backfill.grid import BackfillGrid
from modelupgrade.backfill.per_query import (
    largest_drop_se,
    mean_over_orders,
    per_query_table,
    per_query_values,
)
from modelupgrade.backfill.serving_arrays import ServingArrays
from modelupgrade.backfill.simulate import evaluate_state
from modelupgrade.backfill.summary import CurveSummary, auc_mean, auc_trapezoid, check_conditions
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.ordering import OrderingInputs, OrderingPolicy, build_ordering
from modelupgrade.serving import ServingMode, build_serving_mode
from modelupgrade.serving.base import ServingPlan

log = logging.getLogger(__name__)

# A variant's head outputs whose rows are the query split's (the others are the gallery's).
QUERY_FIELDS = ("reverse_query", "rho_query", "rho_reverse_query")

Metrics = dict[str, float]
Curve = dict[str, np.ndarray]  # a curve's columns: t, cutoff, each metric, nfr, pfr


def checked_rows(array: np.ndarray, count: int, what: str) -> np.ndarray:
    """``array``, refused unless it has one row per item of its split."""
    if len(array) != count:
        raise UserError(
            f"{what} has {len(array)} rows but its split has {count}",
            hint="embeddings must be computed on the same split files, in their order",
        )
    return array


@dataclass(frozen=True)
class StudyArrays:
    """The evaluation splits of a study and the old model's arrays, shared by every variant."""

    params: Params
    leave_one_out: bool
    query_labels: np.ndarray
    gallery_labels: np.ndarray
    query_file: str  # a model's embedding file of the queries (the gallery's, leave-one-out)
    gallery_file: str
    old_query: np.ndarray
    old_gallery: np.ndarray
    old_logits: np.ndarray | None
    grid: BackfillGrid

    @property
    def n(self) -> int:
        return len(self.gallery_labels)

    @property
    def nq(self) -> int:
        return len(self.query_labels)

    @property
    def self_index(self) -> np.ndarray | None:
        return np.arange(self.n) if self.leave_one_out else None

    @property
    def topk(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.params.backfill.topk)))

    @property
    def memory_bytes(self) -> int:
        return self.params.backfill.memory_mb * 1024 * 1024

    def evaluate(self, query: np.ndarray, gallery: np.ndarray) -> Metrics:
        """The metrics of one single-system search (a curve's end point)."""
        cfg = self.params.backfill
        result = evaluate_state(
            query,
            gallery,
            self.gallery_labels,
            self.leave_one_out,
            cfg.distance,
            query_labels=self.query_labels,
            topk=self.topk,
            map_at_k=cfg.map_at_k,
            memory_bytes=self.memory_bytes,
        )
        return {
            k: float(v[0])
            for k, v in result.as_dict().items()
            if k not in ("t", "cutoff", "nfr", "pfr")
        }

    def new_embeddings(self, variant: str, new_dir: Path) -> tuple[np.ndarray, np.ndarray]:
        """A variant's new model's (query, gallery) embeddings from its directory."""
        query = load_array(new_dir / self.query_file, f"{variant} query embeddings")
        gallery = load_array(new_dir / self.gallery_file, f"{variant} gallery embeddings")
        return checked_rows(query, self.nq, "new query"), checked_rows(
            gallery, self.n, "new gallery"
        )


@dataclass(frozen=True)
class ReferenceLevels:
    """M(old, old), and M(new, new) of the independently trained new model where the study has it
    (Seo et al.'s Eq. 7 compares a curve's end with it)."""

    old_old: Metrics
    new_new: Metrics | None


@dataclass
class VariantCurves:
    """What one variant's simulation found: its curves as tidy tables (in the order of its
    policies and modes), their per-query areas and summaries, and what was skipped and why."""

    tables: list[pd.DataFrame] = field(default_factory=list)
    per_query: list[pd.DataFrame] = field(default_factory=list)
    curves: list[CurveSummary] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class _ModeCurves:
    """One serving mode's curves of a variant: per policy the mean curve over its orders and its
    per-query values, and the mode's single-system ends (the same for every policy)."""

    ends: tuple[Metrics, Metrics]
    curves: dict[str, Curve]
    per_query: dict[str, dict[str, np.ndarray]]


def serving_arrays(
    study: StudyArrays, variant: str, new_dir: Path, arrays: dict[str, str]
) -> tuple[ServingArrays, np.ndarray | None]:
    """The variant's serving arrays (its new embeddings and head outputs), and FastFill's σ² per
    gallery item where its head gives one (it orders the backfill; no mode serves it)."""
    extra = {
        name: load_array(path, f"{variant} {name}", ndim=None) for name, path in arrays.items()
    }
    for name, value in extra.items():
        checked_rows(value, study.nq if name in QUERY_FIELDS else study.n, f"{variant} {name}")
    sigma2 = extra.pop("sigma2", None)
    new_query, new_gallery = study.new_embeddings(variant, new_dir)
    serving = ServingArrays(
        old_query=study.old_query,
        old_gallery=study.old_gallery,
        new_query=new_query,
        new_gallery=new_gallery,
    )
    return replace(serving, **extra), sigma2


def ordering_inputs(
    study: StudyArrays, serving: ServingArrays, sigma2: np.ndarray | None, compatible: bool
) -> OrderingInputs:
    """What the policies order the gallery by: the old logits, σ², and the vectors of the mixed
    mode's old state (in the new space when ψ maps it there or the model is ``compatible``)."""
    mixed = build_serving_mode("mixed").plan(serving.forms())
    return OrderingInputs(
        n=study.n,
        old_logits=study.old_logits,
        sigma2=None if sigma2 is None else np.asarray(sigma2).reshape(-1),
        old_state_vectors=serving.systems(mixed).gallery_old_side,
        new_vectors=serving.new_gallery,
        old_state_in_new_space=mixed.old_part.gallery == "forward" or compatible,
    )


def draw_orderings(
    study: StudyArrays, policies: dict[str, OrderingPolicy], inputs: OrderingInputs
) -> dict[str, list[np.ndarray]]:
    """Each available policy's orders: ``backfill.random_permutations`` of them for a policy that
    draws from the seed, one otherwise."""
    cfg = study.params.backfill
    return {
        name: [
            policy.order_items(inputs, study.params.seed + i)
            for i in range(cfg.random_permutations if policy.draws_from_seed else 1)
        ]
        for name, policy in policies.items()
        if policy.available(inputs)
    }


def mode_curves(
    study: StudyArrays,
    systems: SearchSystems,
    served: list[tuple[str, list[np.ndarray]]],
) -> _ModeCurves:
    """Every order of every ``served`` policy over one mode's ``systems``, each query block ranked
    once, and the mode's single-system ends."""
    cfg = study.params.backfill
    ends = (
        study.evaluate(systems.query_old_side, systems.gallery_old_side),
        study.evaluate(systems.query_new_side, systems.gallery_new_side),
    )
    results = iter(
        backfill_curves(
            systems,
            study.query_labels,
            study.gallery_labels,
            [ordering for _, orderings in served for ordering in orderings],
            study.grid.cutoffs,
            study.grid.t,
            self_index=study.self_index,
            distance=cfg.distance,
            topk=study.topk,
            map_at_k=cfg.map_at_k,
            memory_bytes=study.memory_bytes,
        )
    )
    curves, per_query = {}, {}
    for name, orderings in served:
        drawn = [next(results) for _ in orderings]
        curves[name] = mean_curve([r.as_dict() for r in drawn])
        per_query[name] = mean_over_orders([per_query_values(r) for r in drawn])
    return _ModeCurves(ends, curves, per_query)


def curve_table(
    variant: str, policy_name: str, policy: OrderingPolicy, mode: str, values: Curve, orders: int
) -> pd.DataFrame:
    """One curve's tidy rows: strategy, policy, mode, deployable, permutations, then its columns."""
    table = pd.DataFrame(values)
    table.insert(0, "permutations", orders)
    table.insert(0, "deployable", policy.deployable)
    table.insert(0, "mode", mode)
    table.insert(0, "policy", policy_name)
    table.insert(0, "strategy", variant)
    return table


def curve_summary(
    variant: str,
    policy_name: str,
    policy: OrderingPolicy,
    mode: str,
    curves: _ModeCurves,
    levels: ReferenceLevels,
    new_new: Metrics,
    orders: int,
) -> CurveSummary:
    """A curve's AUCs both ways, Seo et al.'s conditions (with the largest dip's query noise), its
    ends against the mode's single systems and its largest negative-flip rate."""
    values, per_query = curves.curves[policy_name], curves.per_query[policy_name]
    start, end = curves.ends
    return CurveSummary(
        strategy=variant,
        policy=policy_name,
        mode=mode,
        deployable=policy.deployable,
        auc_mean={m: auc_mean(values[m]) for m in start},
        auc_trapezoid={m: auc_trapezoid(values["t"], values[m]) for m in start},
        conditions={
            m: check_conditions(
                values[m],
                levels.old_old[m],
                None if levels.new_new is None else levels.new_new[m],
                drop_se=largest_drop_se(per_query[m]),
            )
            for m in ("top1", "mAP")
        },
        start={m: float(values[m][0]) for m in start},
        end={m: float(values[m][-1]) for m in start},
        start_single_system=start,
        end_single_system=end,
        endpoints_match=all(
            abs(values[m][0] - start[m]) < 1e-9 and abs(values[m][-1] - end[m]) < 1e-9
            for m in start
        ),
        max_negative_flip_rate=float(values["nfr"].max()),
        new_new=new_new,
        permutations=orders,
    )


def _skip_reason(
    policy_name: str,
    policy: OrderingPolicy,
    mode_name: str,
    mode: ServingMode,
    plan: ServingPlan | None,
) -> str | None:
    """Why a (policy, mode) of an available policy has no curve; None when it has one."""
    if not policy.orders_for(mode_name):
        return f"the {policy_name} order is meant for {policy.serving_modes} only"
    return mode.description if plan is None else None


def variant_curves(
    study: StudyArrays,
    variant: str,
    new_dir: Path,
    arrays: dict[str, str],
    compatible: bool,
    levels: ReferenceLevels,
) -> VariantCurves:
    """Every configured (policy, serving mode) curve of one variant whose inputs are present;
    ``compatible``: its new model was trained to be compared with the old vectors."""
    cfg = study.params.backfill
    serving, sigma2 = serving_arrays(study, variant, new_dir, arrays)
    assert serving.new_query is not None and serving.new_gallery is not None
    new_new = study.evaluate(serving.new_query, serving.new_gallery)
    policies = {name: build_ordering(name) for name in cfg.policies}
    orderings_of = draw_orderings(
        study, policies, ordering_inputs(study, serving, sigma2, compatible)
    )
    modes = {name: build_serving_mode(name) for name in cfg.serving_modes}
    plans = {name: mode.try_plan(serving.forms()) for name, mode in modes.items()}
    by_mode = _curves_by_mode(study, serving, plans, policies, orderings_of)
    found = VariantCurves()
    for policy_name, policy in policies.items():
        if policy_name not in orderings_of:
            found.skipped.append(
                {"strategy": variant, "policy": policy_name, "reason": policy.description}
            )
            continue
        orders = len(orderings_of[policy_name])
        for mode_name, mode in modes.items():
            reason = _skip_reason(policy_name, policy, mode_name, mode, plans[mode_name])
            if reason is not None:
                found.skipped.append(
                    {
                        "strategy": variant,
                        "policy": policy_name,
                        "mode": mode_name,
                        "reason": reason,
                    }
                )
                continue
            log.info(
                "%s / %s / %s: %d points over %d items, %d order(s)",
                variant,
                policy_name,
                mode_name,
                len(study.grid),
                study.n,
                orders,
            )
            curves = by_mode[mode_name]
            values = curves.curves[policy_name]
            found.per_query.append(
                per_query_table(
                    variant, policy_name, mode_name, values["t"], curves.per_query[policy_name]
                )
            )
            found.tables.append(
                curve_table(variant, policy_name, policy, mode_name, values, orders)
            )
            found.curves.append(
                curve_summary(
                    variant, policy_name, policy, mode_name, curves, levels, new_new, orders
                )
            )
    return found


def _curves_by_mode(
    study: StudyArrays,
    serving: ServingArrays,
    plans: dict[str, ServingPlan | None],
    policies: dict[str, OrderingPolicy],
    orderings_of: dict[str, list[np.ndarray]],
) -> dict[str, _ModeCurves]:
    """Each serving mode's curves of the policies that order for it (modes without a plan, or
    without such a policy, have none)."""
    by_mode = {}
    for mode_name, plan in plans.items():
        served = [
            (name, orderings)
            for name, orderings in orderings_of.items()
            if plan is not None and policies[name].orders_for(mode_name)
        ]
        if plan is None or not served:
            continue
        by_mode[mode_name] = mode_curves(study, serving.systems(plan), served)
    return by_mode
