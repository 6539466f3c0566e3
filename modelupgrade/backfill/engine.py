"""The whole backfill curve from two query×gallery distance blocks, computed once.

During a backfill every gallery item g answers a query from one of two "systems": before it is
backfilled with its old-side vector (distance ``a[q, g]`` to the query's old-side vector), after it
with its new-side vector (``b[q, g]``). Every serving mode reduces to this: a mixed index uses the
same new query on both sides, rank merge uses different query vectors and merges by raw distance.

Per query the state of item g changes exactly once, at its first step f(g). So instead of rebuilding
and re-ranking the gallery at each of K points, each query's 2n candidate entries (a and b of every
item) are sorted ONCE as the exact keys of ``modelupgrade.retrieval.topk`` (distance bits,
new-before-old on equal distance, gallery index: the store ranks by the same keys), and every point
is read from that one order:

- the positive entries split the order into buckets; a negative entry of item g counts at step i iff
  it is active (old entry: i < f(g); new entry: i ≥ f(g)), so three ±1 updates per item on a
  (steps × buckets) table and two prefix sums give, for every positive entry and every step, the
  number of active negatives ranked before it;
- the active positives before it are a prefix sum of the positives' own activity.

Work per query: one sort of 2n keys plus O(n + P·K), instead of K distance blocks and K sorts.
Queries are processed class by class (all rows of a block share their positive columns) in row
blocks sized to a memory budget. The order of the backfill only decides when each entry is active,
so several orders over the same systems (``backfill_curves``) share each block's distances and
sort.

Ranking semantics (those of ``modelupgrade.metrics``): distances ascending; equal distances keep
gallery order (a new-side entry before an old-side one, Seo et al.'s tie rule for rank merge);
CMC top-k and AP@k read that order; step AP is scikit-learn's ``average_precision_score``, so tied
distances form one threshold (rows with such ties are finished by an exact per-step pass).
Queries without a positive count as misses for CMC, are left out of mAP and count 0 for AP@k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np
import torch

from modelupgrade.arrays import label_vectors, vector_rows
from modelupgrade.errors import UserError
from modelupgrade.retrieval.distance import Distance, DistanceBlock, check_distance
from modelupgrade.retrieval.topk import (
    DISTANCE_SHIFT,
    MAX_GALLERY,
    key_columns,
    key_is_old_side,
    ranking_keys,
)

DEFAULT_MEMORY_BYTES = 384 * 1024 * 1024


@dataclass(frozen=True)
class SearchSystems:
    """Query and gallery vectors of the two systems a backfilling gallery serves from."""

    query_old_side: np.ndarray
    gallery_old_side: np.ndarray
    query_new_side: np.ndarray
    gallery_new_side: np.ndarray


@dataclass(frozen=True)
class PerQueryCurve:
    """Per query (rows) and point (columns): 0-based rank of the first positive (−1: none),
    step AP (NaN without positives) and AP@k (0 without positives; NaN when not asked for)."""

    first_hit: np.ndarray
    average_precision: np.ndarray
    ap_at_k: np.ndarray
    num_positives: np.ndarray

    def correct_at(self, k: int) -> np.ndarray:
        return (self.first_hit >= 0) & (self.first_hit < k)


@dataclass(frozen=True)
class CurveResult:
    """A backfill curve: one value per evaluation point."""

    t: np.ndarray
    cutoffs: np.ndarray
    topk: dict[int, np.ndarray]
    mAP: np.ndarray
    map_at_k: np.ndarray | None
    map_k: int | None
    negative_flip_rate: np.ndarray
    positive_flip_rate: np.ndarray
    per_query: PerQueryCurve = field(repr=False)

    @property
    def top1(self) -> np.ndarray:
        return self.topk[1]

    @property
    def top5(self) -> np.ndarray:
        return self.topk[5]

    def as_dict(self) -> dict[str, np.ndarray]:
        out = {
            "t": self.t,
            "cutoff": self.cutoffs,
            "mAP": self.mAP,
            "nfr": self.negative_flip_rate,
            "pfr": self.positive_flip_rate,
        }
        out.update({f"top{k}": v for k, v in self.topk.items()})
        if self.map_at_k is not None:
            out[f"mAP@{self.map_k}"] = self.map_at_k
        return out


def mean_curve(curves: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The pointwise mean of curves taken at the same points (``CurveResult.as_dict()`` of several
    orders of one policy): the expected curve of an order drawn from a seed."""
    first = curves[0]
    for curve in curves[1:]:
        if curve.keys() != first.keys() or not np.array_equal(curve["cutoff"], first["cutoff"]):
            raise ValueError("only curves of the same metrics at the same points can be averaged")
    return {
        key: first[key] if key in ("t", "cutoff") else np.mean([c[key] for c in curves], axis=0)
        for key in first
    }


def first_new_step(ordering: np.ndarray, cutoffs: np.ndarray, n: int) -> np.ndarray:
    """Per gallery item, the first point at which it holds its new vector (len(cutoffs) = never)."""
    ordering = np.asarray(ordering)
    if ordering.shape != (n,) or not np.array_equal(np.sort(ordering), np.arange(n)):
        raise UserError(
            f"the backfill ordering must be a permutation of the {n} gallery rows",
            hint="pass every gallery row index exactly once, first backfilled first",
        )
    cutoffs = np.asarray(cutoffs, dtype=np.int64)
    if (
        cutoffs.ndim != 1
        or len(cutoffs) == 0
        or np.any(np.diff(cutoffs) < 0)
        or cutoffs[0] < 0
        or cutoffs[-1] > n
    ):
        raise UserError(
            f"cutoffs must be non-decreasing item counts in [0, {n}], got {cutoffs.tolist()}"
        )
    position = np.empty(n, dtype=np.int64)
    position[ordering] = np.arange(n)
    return np.searchsorted(cutoffs, position, side="right").astype(np.int64)


def backfill_curve(
    systems: SearchSystems,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    ordering: np.ndarray,
    cutoffs: np.ndarray,
    t: np.ndarray | None = None,
    **options: Any,
) -> CurveResult:
    """Metrics at every point of a backfill; see the module docstring for the algorithm and rules.

    ``options`` are those of ``backfill_curves``: ``self_index[q]``, the gallery row that is query
    q's own item (leave-one-out) or −1; ``distance``; ``topk``; ``map_at_k``; ``memory_bytes``.
    """
    curves = backfill_curves(
        systems, query_labels, gallery_labels, [ordering], cutoffs, t, **options
    )
    return curves[0]


def backfill_curves(
    systems: SearchSystems,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    orderings: Sequence[np.ndarray],
    cutoffs: np.ndarray,
    t: np.ndarray | None = None,
    *,
    self_index: np.ndarray | None = None,
    distance: Distance = "l2",
    topk: tuple[int, ...] = (1, 5),
    map_at_k: int | None = None,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
) -> list[CurveResult]:
    """``backfill_curve`` of each of ``orderings`` over the same systems, in that order.

    The ranking of a query block does not depend on the order the gallery is backfilled in, so
    each block is ranked (distances and the sort of its 2n keys) once and read once per order:
    a policy's random draws and the policies of one serving mode share that cost.
    """
    check_distance(distance)
    if not topk or min(topk) < 1:
        raise UserError(f"top-k values must be ≥ 1, got {list(topk)}")
    if len(orderings) == 0:
        raise UserError("no backfill ordering was given", hint="pass at least one ordering")
    qa, ga, qb, gb = _system_vectors(systems)
    nq, n = len(qa), len(ga)
    query_labels, gallery_labels = label_vectors(query_labels, gallery_labels, nq, n)
    self_index = (
        np.full(nq, -1, dtype=np.int64)
        if self_index is None
        else np.asarray(self_index, dtype=np.int64)
    )
    cutoffs = np.asarray(cutoffs, dtype=np.int64)
    steps = len(cutoffs)
    t = cutoffs / max(n, 1) if t is None else np.asarray(t, dtype=np.float64)
    first_new = [first_new_step(ordering, cutoffs, n) for ordering in orderings]
    uses_old = any(f.max(initial=0) > 0 for f in first_new)
    uses_new = any(f.min(initial=steps) < steps for f in first_new)

    old_block = DistanceBlock(qa, ga, distance) if uses_old else None
    new_block = DistanceBlock(qb, gb, distance) if uses_new else None
    curves = [_PerQueryArrays.empty(nq, steps, map_at_k) for _ in orderings]
    num_positives = np.zeros(nq, dtype=np.int64)

    columns_of = {int(c): np.flatnonzero(gallery_labels == c) for c in np.unique(query_labels)}
    for label, columns in columns_of.items():
        rows_of_label = np.flatnonzero(query_labels == label)
        own = self_index[rows_of_label]
        has_self = (own >= 0) & np.isin(own, columns)
        for self_group in (False, True):
            rows = rows_of_label[has_self == self_group]
            positives = len(columns) - int(self_group)
            if len(rows) == 0:
                continue
            num_positives[rows] = positives
            if positives == 0:
                continue
            sides = int(uses_old) + int(uses_new)
            pos_entries = positives * sides
            block = _block_rows(n * sides, pos_entries, steps, memory_bytes)
            for start in range(0, len(rows), block):
                chunk = rows[start : start + block]
                ranked = _rank_block(
                    chunk, int(label), gallery_labels, self_index[chunk], old_block, new_block
                )
                for curve, first in zip(curves, first_new, strict=True):
                    curve.fill(chunk, *_curve_block(ranked, first, steps, pos_entries, map_at_k))

    return [_curve_result(curve, num_positives, t, cutoffs, topk, map_at_k) for curve in curves]


def _system_vectors(
    systems: SearchSystems,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The old-side query and gallery vectors, then the new side's, checked to agree in size."""
    qa = vector_rows(systems.query_old_side, "old-side query vectors")
    ga = vector_rows(systems.gallery_old_side, "old-side gallery vectors")
    qb = vector_rows(systems.query_new_side, "new-side query vectors")
    gb = vector_rows(systems.gallery_new_side, "new-side gallery vectors")
    if len(qb) != len(qa) or len(gb) != len(ga):
        raise UserError(
            f"the two systems disagree on sizes: {len(qa)}/{len(qb)} queries, "
            f"{len(ga)}/{len(gb)} gallery items",
            hint="old-side and new-side arrays hold the same queries / gallery "
            "items in the same order",
        )
    if len(ga) > MAX_GALLERY:
        raise UserError(
            f"a gallery of {len(ga)} items is too large for one simulation (limit {MAX_GALLERY})"
        )
    return qa, ga, qb, gb


def _block_rows(entries: int, pos_entries: int, steps: int, memory_bytes: int) -> int:
    """Query rows ranked at once within ``memory_bytes``: each row holds ``entries`` ranked keys
    and, at each of ``steps`` points, its ``pos_entries`` positives' ranks."""
    per_row = entries * 72 + (steps + 1) * (pos_entries + 1) * 4 * 2 + steps * pos_entries * 24
    return max(1, int(memory_bytes // per_row))


@dataclass
class _PerQueryArrays:
    first_hit: np.ndarray
    average_precision: np.ndarray
    ap_at_k: np.ndarray

    @classmethod
    def empty(cls, queries: int, steps: int, map_at_k: int | None) -> _PerQueryArrays:
        return cls(
            np.full((queries, steps), -1, dtype=np.int64),
            np.full((queries, steps), np.nan, dtype=np.float64),
            np.full((queries, steps), np.nan if map_at_k is None else 0.0, dtype=np.float64),
        )

    def fill(
        self, rows: np.ndarray, first_hit: np.ndarray, ap: np.ndarray, ap_at_k: np.ndarray | None
    ) -> None:
        self.first_hit[rows], self.average_precision[rows] = first_hit, ap
        if ap_at_k is not None:
            self.ap_at_k[rows] = ap_at_k


def _curve_result(
    arrays: _PerQueryArrays,
    num_positives: np.ndarray,
    t: np.ndarray,
    cutoffs: np.ndarray,
    topk: tuple[int, ...],
    map_at_k: int | None,
) -> CurveResult:
    per_query = PerQueryCurve(
        arrays.first_hit, arrays.average_precision, arrays.ap_at_k, num_positives
    )
    with_positive = num_positives > 0
    mean_ap = (
        arrays.average_precision[with_positive].mean(axis=0)
        if with_positive.any()
        else np.full(len(cutoffs), np.nan)
    )
    hit1 = per_query.correct_at(1)
    return CurveResult(
        t=t,
        cutoffs=cutoffs,
        topk={k: per_query.correct_at(k).mean(axis=0) for k in sorted(set(topk))},
        mAP=mean_ap,
        map_at_k=None if map_at_k is None else arrays.ap_at_k.mean(axis=0),
        map_k=map_at_k,
        negative_flip_rate=(hit1[:, :1] & ~hit1).mean(axis=0),
        positive_flip_rate=(~hit1[:, :1] & hit1).mean(axis=0),
        per_query=per_query,
    )


@dataclass(frozen=True)
class _RankedBlock:
    """One query block's 2n entries in rank order, and what of them does not depend on the
    backfill order: which item and side each entry is, which entries are positives, and the
    groups of tied distances."""

    column: np.ndarray  # (b, entries) gallery item of each ranked entry
    old_side: np.ndarray
    positive: np.ndarray
    before: np.ndarray  # positives ranked at or before each entry
    sides: int  # 2 when both systems' entries are ranked, else 1
    tie_rows: np.ndarray  # each entry that ties with the one before it: its row...
    tie_at: np.ndarray  # ...its position...
    tie_start: np.ndarray  # ...and where its group of equal distances starts

    @cached_property
    def bucket(self) -> np.ndarray:
        """Positives ranked strictly before each entry."""
        return self.before - self.positive

    @cached_property
    def positive_entries(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, positions) of the positive entries, row by row."""
        rows, positions = np.nonzero(self.positive)
        return rows, positions


def _rank_block(
    rows: np.ndarray,
    label: int,
    gallery_labels: np.ndarray,
    self_index: np.ndarray,
    old_block: DistanceBlock | None,
    new_block: DistanceBlock | None,
) -> _RankedBlock:
    n = len(gallery_labels)
    columns = np.arange(n)
    has_self = self_index >= 0
    parts = []
    sides: tuple[tuple[DistanceBlock | None, Literal["new", "old"]], ...] = (
        (new_block, "new"),
        (old_block, "old"),
    )
    for block, side in sides:
        if block is None:
            continue
        dist = block(rows)
        if has_self.any():
            dist[np.flatnonzero(has_self), self_index[has_self]] = np.inf
        parts.append(ranking_keys(dist, columns, side))
    keys = np.sort(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1), axis=1)

    column = key_columns(keys)
    positive = gallery_labels[column] == label
    if has_self.any():
        positive &= column != self_index[:, None]
    before = np.cumsum(positive, axis=1, dtype=np.int32)

    distance_bits = keys >> DISTANCE_SHIFT
    same_as_previous = distance_bits[:, 1:] == distance_bits[:, :-1]
    tie_rows, tie_at = np.nonzero(same_as_previous)
    tie_at = tie_at + 1  # the position of an entry that ties with the one before it
    start = tie_at - 1
    while len(tie_rows):  # walk each tie back to the start of its group
        extends = (start > 0) & same_as_previous[tie_rows, np.maximum(start - 1, 0)]
        if not extends.any():
            break
        start = np.where(extends, start - 1, start)
    old_side = key_is_old_side(keys)
    return _RankedBlock(column, old_side, positive, before, len(parts), tie_rows, tie_at, start)


def _curve_block(
    ranked: _RankedBlock,
    first_new: np.ndarray,
    steps: int,
    pos_entries: int,
    map_at_k: int | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One query block's first hits, step AP and AP@k at every point of one backfill order."""
    b = len(ranked.column)
    old_side, positive = ranked.old_side, ranked.positive
    step_of = first_new[ranked.column]

    # Negatives: bucket = number of positive entries ranked before them.
    negatives_before = _active_negatives_before(
        ranked.bucket, ~positive, old_side, step_of, steps, pos_entries
    )

    pos_rows, pos_cols = ranked.positive_entries
    pos_step = torch.from_numpy(step_of[pos_rows, pos_cols].reshape(b, pos_entries))
    pos_new = torch.from_numpy(~old_side[pos_rows, pos_cols].reshape(b, pos_entries))
    step_index = torch.arange(steps)[None, :, None]
    active = (step_index >= pos_step[:, None, :]) == pos_new[:, None, :]  # (b, K, E)
    positives_through = active.cumsum(dim=2, dtype=torch.int32)
    rank = positives_through + negatives_before  # 1-based position of each positive entry
    precision = torch.where(
        active, positives_through.to(torch.float32) / rank.to(torch.float32), 0.0
    )
    num_pos = pos_entries // ranked.sides

    big = torch.iinfo(torch.int32).max
    nearest = torch.where(active, negatives_before, big).min(dim=2).values.to(torch.int64)
    first_hit = torch.where(nearest == big, -1, nearest).numpy()

    ap_at_k = None
    if map_at_k is not None:
        ap_at_k = (
            torch.where(rank <= map_at_k, precision, 0.0).sum(dim=2, dtype=torch.float64)
            / min(num_pos, map_at_k)
        ).numpy()

    # Step AP reads a group of equal distances as one threshold: every item of the group counts as
    # ranked at or before each of its positives. Groups are rare and small, so only the (positive,
    # later entry of its group) pairs are visited: each later entry that is active at a step adds
    # one to the positive's rank there (and one to its positives when it is a positive itself).
    tie_rows, tie_at, start = ranked.tie_rows, ranked.tie_at, ranked.tie_start
    if len(tie_rows):
        extra_rank = torch.zeros((b, steps, pos_entries), dtype=torch.int32)
        extra_positives = torch.zeros((b, steps, pos_entries), dtype=torch.int32)
        later_step = step_of[tie_rows, tie_at]
        later_new = ~old_side[tie_rows, tie_at]
        later_positive = positive[tie_rows, tie_at]
        step_range = np.arange(steps)
        for offset in range(1, int((tie_at - start).max()) + 1):
            earlier = tie_at - offset
            pair = (earlier >= start) & positive[tie_rows, np.maximum(earlier, 0)]
            if not pair.any():
                continue
            rows_p, at_p = tie_rows[pair], earlier[pair]
            index_p = ranked.before[rows_p, at_p] - 1  # which positive entry of its row
            later_active = (step_range[None, :] >= later_step[pair][:, None]) == later_new[pair][
                :, None
            ]
            add = torch.from_numpy(later_active.astype(np.int32))
            cells = (
                torch.from_numpy(rows_p.astype(np.int64))[:, None],
                torch.arange(steps)[None, :],
                torch.from_numpy(index_p.astype(np.int64))[:, None],
            )
            extra_rank.index_put_(cells, add, accumulate=True)
            later_is_positive = torch.from_numpy(later_positive[pair].astype(np.int32))[:, None]
            extra_positives.index_put_(cells, add * later_is_positive, accumulate=True)
        tie_positives = positives_through + extra_positives
        tie_rank = rank + extra_rank
        precision = torch.where(
            active, tie_positives.to(torch.float32) / tie_rank.to(torch.float32), 0.0
        )
    average_precision = (precision.sum(dim=2, dtype=torch.float64) / num_pos).numpy()
    return first_hit, average_precision, ap_at_k


def _active_negatives_before(
    bucket: np.ndarray,
    negative: np.ndarray,
    old_side: np.ndarray,
    step_of: np.ndarray,
    steps: int,
    pos_entries: int,
) -> torch.Tensor:
    """(rows, K, E): active negative entries with bucket ≤ j at step i, for every positive entry j.

    An old-side entry is active at steps [0, f), a new-side one at [f, K): ±1 at the step where its
    activity starts/ends, then prefix sums over steps and over buckets.
    """
    b, entries = bucket.shape
    width = pos_entries + 1
    trash = steps * width + pos_entries  # a cell of the row past the last step: never read
    bucket = bucket.astype(np.int64)
    step_cell = step_of * width
    opens = np.where(old_side, 0, step_cell)
    opens += bucket
    opens[~negative] = trash
    closes = step_cell
    closes += bucket
    closes[~(negative & old_side)] = trash
    table = torch.zeros((b, (steps + 1) * width), dtype=torch.int32)
    table.scatter_add_(
        1, torch.from_numpy(opens), torch.ones(1, 1, dtype=torch.int32).expand(b, entries)
    )
    table.scatter_add_(
        1, torch.from_numpy(closes), torch.full((1, 1), -1, dtype=torch.int32).expand(b, entries)
    )
    table = table.view(b, steps + 1, width)[:, :steps]
    table = table.cumsum(dim=1, dtype=torch.int32).cumsum(dim=2, dtype=torch.int32)
    return table[:, :, :pos_entries]
