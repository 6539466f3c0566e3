"""The backfill curve of a plan's option (``backfill_curve_of``): the study's simulator on the
sample, under one serving mode and ordering policy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.plan.sample import PlanSample
from modelupgrade.retrieval.distance import Distance

Curve = tuple[float | None, dict[str, list[float]] | None, str]


@dataclass(frozen=True)
class CurveSettings:
    """How the backfill curves are drawn: serving mode, ordering policy, grid, AUC."""

    mode: str
    policy: str
    metric: str
    points: int
    auc: str
    distance: Distance
    seed: int
    topk: tuple[int, ...]

    def describe(self) -> JsonObject:
        """The settings that shape the curve (the seed and top-k do not)."""
        return {k: v for k, v in json_record(self).items() if k not in ("seed", "topk")}


def backfill_curve_of(
    settings: CurveSettings,
    sample: PlanSample,
    old_query: np.ndarray,
    old_gallery: np.ndarray,
    new_query: np.ndarray,
    new_gallery: np.ndarray,
    old_logits: np.ndarray | None,
    compatible: bool,
) -> tuple[float | None, dict[str, list[float]] | None, str]:
    """(AUC, curve, note) of a gallery moving from ``old_gallery`` to ``new_gallery`` rows under
    the chosen serving mode and order (the study's simulator); no curve when the mode cannot
    serve this system, with the reason."""
    from modelupgrade.backfill import ServingArrays, auc_mean, auc_trapezoid, backfill_curve
    from modelupgrade.backfill.grid import uniform_grid
    from modelupgrade.ordering import OrderingInputs, build_ordering
    from modelupgrade.serving import build_serving_mode

    n = len(sample.gallery)
    serving = ServingArrays(
        old_query=old_query, old_gallery=old_gallery, new_query=new_query, new_gallery=new_gallery
    )
    mode = build_serving_mode(settings.mode)
    plan = mode.try_plan(serving.forms())
    if plan is None:
        return None, None, f"no backfill curve: {mode.description}"
    policy = build_ordering(settings.policy)
    inputs = OrderingInputs(
        n=n,
        old_logits=old_logits,
        old_state_vectors=old_gallery,
        new_vectors=new_gallery,
        old_state_in_new_space=compatible,
    )
    if not policy.available(inputs):
        return (
            None,
            None,
            f"no backfill curve: the {settings.policy} order needs {policy.description}",
        )
    grid = uniform_grid(settings.points, n)
    query_labels = sample.query["label"].to_numpy(np.int64)
    gallery_labels = sample.gallery["label"].to_numpy(np.int64)
    curve = backfill_curve(
        serving.systems(plan),
        query_labels,
        gallery_labels,
        policy.order_items(inputs, settings.seed),
        grid.cutoffs,
        grid.t,
        self_index=np.arange(n) if sample.leave_one_out else None,
        distance=settings.distance,
        topk=settings.topk,
    )
    values = curve.as_dict()
    metric = settings.metric if settings.metric in values else "top1"
    series = np.asarray(values[metric], dtype=np.float64)
    auc = auc_mean(series) if settings.auc == "auc_mean" else auc_trapezoid(curve.t, series)
    shown = {"t": [float(t) for t in curve.t], metric: series.tolist()}
    return float(auc), shown, ""
