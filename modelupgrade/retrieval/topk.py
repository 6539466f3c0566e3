"""The ranking rule of a gallery split between an old and a new part, and exact top-k under it.

During a backfill every gallery item answers a query from one side: before it is backfilled with
its old-side vector, after with its new-side one. Entries of both sides are ranked together by raw
distance; equal distances put the new side first, then the lower gallery index (the store's slot,
the simulator's gallery row). Seo et al. give ties to the new system; the index makes the order
total, so a result never depends on how the gallery was cut into parts.

The rule is encoded once, as an exact uint64 key per entry: the distance's float32 bits mapped to an
order-preserving integer, then one side bit, then 31 bits of gallery index. Sorting keys is
sorting by the rule. The backfill simulator sorts these keys for its curves; the store takes its
top-k from them, so both rank every entry identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from modelupgrade.errors import UserError

Side = Literal["new", "old"]
COLUMN_BITS = 31
MAX_GALLERY = (1 << COLUMN_BITS) - 1
COLUMN_MASK = np.uint64(MAX_GALLERY)
OLD_SIDE_BIT = np.uint64(1 << COLUMN_BITS)
DISTANCE_SHIFT = np.uint64(32)
_SIDE_BITS: dict[str, np.uint64] = {"new": np.uint64(0), "old": OLD_SIDE_BIT}


def orderable(values: np.ndarray) -> np.ndarray:
    """float32 → uint64 in [0, 2³²) whose integer order is the float order (negative values too)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.int32).astype(np.int64)
    return (np.where(bits < 0, -(bits & 0x7FFFFFFF), bits) + (1 << 31)).astype(np.uint64)


def ranking_keys(distances: np.ndarray, columns: np.ndarray, side: Side) -> np.ndarray:
    """(Q, N) keys of the entries of one side: ``distances[q, j]`` of gallery
    index ``columns[j]``."""
    columns = np.asarray(columns, dtype=np.int64)
    if len(columns) and (columns.min() < 0 or columns.max() > MAX_GALLERY):
        raise UserError(f"gallery indices must lie in [0, {MAX_GALLERY}] to be ranked")
    return (orderable(distances) << DISTANCE_SHIFT) | _SIDE_BITS[side] | columns.astype(np.uint64)


def key_columns(keys: np.ndarray) -> np.ndarray:
    return (keys & COLUMN_MASK).astype(np.int64)


def key_is_old_side(keys: np.ndarray) -> np.ndarray:
    return (keys & OLD_SIDE_BIT) != 0


@dataclass(frozen=True)
class RankedPart:
    """One part of a gallery as a query block sees it: distances (Q, N), indices, side."""

    distances: np.ndarray
    columns: np.ndarray
    side: Side


@dataclass(frozen=True)
class TopK:
    """Per query (rows), the k best entries in ranking order."""

    columns: np.ndarray  # (Q, k) int64 gallery indices
    distances: np.ndarray  # (Q, k) float32 backfill distances
    old_side: np.ndarray  # (Q, k) bool: the entry is an old-side vector


def merged_topk(parts: Sequence[RankedPart], k: int, queries: int) -> TopK:
    """The ``k`` best entries of all parts together, under the ranking rule of this module."""
    if k < 1:
        raise UserError(f"k must be at least 1, got {k}")
    parts = [p for p in parts if p.distances.shape[1]]
    if not parts:
        empty = np.empty((queries, 0))
        return TopK(empty.astype(np.int64), empty.astype(np.float32), empty.astype(bool))
    keys = np.concatenate([ranking_keys(p.distances, p.columns, p.side) for p in parts], axis=1)
    distances = np.concatenate([np.asarray(p.distances, dtype=np.float32) for p in parts], axis=1)
    width = min(k, keys.shape[1])
    if width < keys.shape[1]:
        best = np.argpartition(keys, width - 1, axis=1)[:, :width]
    else:
        best = np.broadcast_to(np.arange(width), (len(keys), width))
    best = np.take_along_axis(best, np.argsort(np.take_along_axis(keys, best, 1), axis=1), 1)
    chosen = np.take_along_axis(keys, best, 1)
    return TopK(
        key_columns(chosen), np.take_along_axis(distances, best, 1), key_is_old_side(chosen)
    )
