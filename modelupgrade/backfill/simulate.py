"""Public entry points: one backfill curve, one gallery state, and the naive per-point loop."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from modelupgrade.backfill.engine import (
    DEFAULT_MEMORY_BYTES,
    CurveResult,
    SearchSystems,
    backfill_curve,
)
from modelupgrade.backfill.grid import BackfillGrid, fastfill_grid, fraction_grid
from modelupgrade.errors import UserError
from modelupgrade.retrieval.distance import Distance


def resolve_grid(steps: int | Sequence[float] | BackfillGrid, n: int) -> BackfillGrid:
    """An int is FastFill's B (B + 2 points); a sequence is the fractions t themselves."""
    if isinstance(steps, BackfillGrid):
        return steps
    if isinstance(steps, (int, np.integer)):
        return fastfill_grid(int(steps), n)
    return fraction_grid(list(steps), n)


def _query_side(
    leave_one_out: bool,
    labels: np.ndarray,
    query_labels: np.ndarray | None,
    n_queries: int,
    n_gallery: int,
) -> tuple[np.ndarray, np.ndarray | None]:
    if leave_one_out:
        if n_queries != n_gallery:
            raise UserError(
                f"leave-one-out needs one query per gallery item, got {n_queries} queries "
                f"for {n_gallery} items",
                hint="pass leave_one_out=False with query_labels for a separate query set",
            )
        return labels, np.arange(n_gallery, dtype=np.int64)
    if query_labels is None:
        raise UserError("a separate query set needs query_labels", hint="or use leave_one_out=True")
    return np.asarray(query_labels, dtype=np.int64), None


def simulate_curve(
    old_gallery: np.ndarray,
    new_gallery: np.ndarray,
    new_query: np.ndarray,
    labels: np.ndarray,
    ordering: np.ndarray,
    steps: int | Sequence[float] | BackfillGrid,
    leave_one_out: bool = True,
    distance: Distance = "l2",
    *,
    query_labels: np.ndarray | None = None,
    old_side_query: np.ndarray | None = None,
    topk: tuple[int, ...] = (1, 5),
    map_at_k: int | None = None,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
) -> CurveResult:
    """The backfill curve of a gallery moving from ``old_gallery`` to ``new_gallery`` rows.

    Item ``ordering[0]`` is backfilled first. ``steps``: FastFill's B (B + 2 points, cutoff
    floor(i·n/(B+1))) or a list of fractions t. ``labels`` are the gallery labels (and the query
    labels under leave-one-out, where query i is gallery item i and never retrieves itself). The
    un-backfilled part is searched with ``new_query`` (a mixed index) unless ``old_side_query`` is
    given (rank merge: those query vectors search the old part, ranked by raw distance).
    Returns a ``CurveResult`` (``.top1``, ``.top5``, ``.mAP`` arrays, one value per point).
    """
    labels = np.asarray(labels, dtype=np.int64)
    new_query = np.asarray(new_query)
    grid = resolve_grid(steps, len(labels))
    q_labels, self_index = _query_side(
        leave_one_out, labels, query_labels, len(new_query), len(labels)
    )
    systems = SearchSystems(
        query_old_side=new_query if old_side_query is None else old_side_query,
        gallery_old_side=old_gallery,
        query_new_side=new_query,
        gallery_new_side=new_gallery,
    )
    return backfill_curve(
        systems,
        q_labels,
        labels,
        ordering,
        grid.cutoffs,
        grid.t,
        self_index=self_index,
        distance=distance,
        topk=topk,
        map_at_k=map_at_k,
        memory_bytes=memory_bytes,
    )


def evaluate_state(
    query: np.ndarray,
    gallery: np.ndarray,
    labels: np.ndarray,
    leave_one_out: bool = True,
    distance: Distance = "l2",
    *,
    query_labels: np.ndarray | None = None,
    topk: tuple[int, ...] = (1, 5),
    map_at_k: int | None = None,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
) -> CurveResult:
    """Metrics of ONE gallery state (a curve of one point): the single evaluation."""
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    q_labels, self_index = _query_side(leave_one_out, labels, query_labels, len(query), n)
    systems = SearchSystems(query, gallery, query, gallery)
    return backfill_curve(
        systems,
        q_labels,
        labels,
        np.arange(n),
        np.array([n]),
        np.array([1.0]),
        self_index=self_index,
        distance=distance,
        topk=topk,
        map_at_k=map_at_k,
        memory_bytes=memory_bytes,
    )


def naive_curve(
    systems: SearchSystems,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    ordering: np.ndarray,
    grid: BackfillGrid,
    *,
    leave_one_out: bool,
    distance: Distance = "l2",
    topk: tuple[int, ...] = (1, 5),
    map_at_k: int | None = None,
) -> dict[str, np.ndarray]:
    """The straightforward loop: rebuild the gallery state and evaluate it anew at every point.

    Only the mixed index (same query on both sides) can be rebuilt as one gallery; this is the
    baseline the benchmark times against ``backfill_curve``.
    """
    if systems.query_old_side is not systems.query_new_side:
        raise UserError(
            "the naive loop rebuilds one mixed gallery; it needs the same query on both sides"
        )
    ordering = np.asarray(ordering)
    metrics: dict[str, list[float]] = {}
    for cutoff in grid.cutoffs:
        state = np.array(systems.gallery_old_side, dtype=np.float32, copy=True)
        backfilled = ordering[:cutoff]
        state[backfilled] = systems.gallery_new_side[backfilled]
        point = evaluate_state(
            systems.query_new_side,
            state,
            gallery_labels,
            leave_one_out,
            distance,
            query_labels=None if leave_one_out else query_labels,
            topk=topk,
            map_at_k=map_at_k,
        )
        for name, values in point.as_dict().items():
            if name in ("t", "cutoff", "nfr", "pfr"):
                continue
            metrics.setdefault(name, []).append(float(values[0]))
    return {name: np.asarray(values) for name, values in metrics.items()}
