"""The serving-mode interface, exact distances and top-k, and the result type naming each hit's space."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.registry_util import Registry
from modelupgrade.store.spaces import SpaceSpec

Distance = Literal["cosine", "l2"]
TransformFn = Callable[[np.ndarray], np.ndarray]

SERVING_MODES: Registry[ServingMode] = Registry("serving mode")


@dataclass(frozen=True)
class GalleryPart:
    """The items of one snapshot whose authoritative vectors live in ``space``."""

    space: SpaceSpec
    slots: np.ndarray
    item_ids: np.ndarray
    read: Callable[[], np.ndarray]  # the part's vectors (rows in ``slots`` order), read lazily

    def __len__(self) -> int:
        return len(self.slots)


@dataclass
class SearchHits:
    """Top-k per query; row q lists ids, distances and the space each hit was matched in."""

    item_ids: np.ndarray
    distances: np.ndarray
    spaces: np.ndarray

    def records(self) -> list[list[dict[str, Any]]]:
        return [
            [
                {"item_id": str(item), "distance": float(dist), "space": str(space)}
                for item, dist, space in zip(ids, dists, spaces, strict=True)
            ]
            for ids, dists, spaces in zip(self.item_ids, self.distances, self.spaces, strict=True)
        ]


def _normalised(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def pairwise_distances(queries: np.ndarray, gallery: np.ndarray, distance: Distance) -> np.ndarray:
    """(Q, N) distances; cosine distance 1 − cos ∈ [0, 2] on L2-normalised rows, or Euclidean."""
    if distance == "cosine":
        return 1.0 - _normalised(queries) @ _normalised(gallery).T
    squared = (
        np.einsum("ij,ij->i", queries, queries)[:, None]
        - 2.0 * queries @ gallery.T
        + np.einsum("ij,ij->i", gallery, gallery)[None, :]
    )
    return np.sqrt(np.maximum(squared, 0.0))


def top_k(distances: np.ndarray, k: int, tie_break: np.ndarray | None = None) -> np.ndarray:
    """Column indices of the k smallest distances per row, ascending (ties: ``tie_break``, then index)."""
    n = distances.shape[1]
    k = min(k, n)
    if k == 0:
        return np.empty((len(distances), 0), dtype=np.int64)
    candidates = np.argpartition(distances, k - 1, axis=1)[:, :k] if k < n else np.tile(np.arange(n), (len(distances), 1))
    rows = np.arange(len(distances))[:, None]
    secondary = np.zeros(n) if tie_break is None else tie_break
    order = np.lexsort((candidates, secondary[candidates], distances[rows, candidates]), axis=1)
    return candidates[rows, order]


class ServingMode:
    """Answers queries given in the serving (newest) space against a gallery split across spaces."""

    registry_name: ClassVar[str]

    def __init__(self, forward: TransformFn | None = None, reverse: TransformFn | None = None) -> None:
        self.forward, self.reverse = forward, reverse

    def rank(
        self, queries: np.ndarray, serving: SpaceSpec, parts: list[GalleryPart], k: int, distance: Distance
    ) -> SearchHits:
        raise NotImplementedError

    @staticmethod
    def _checked(vectors: np.ndarray, rows: int, dim: int, what: str) -> np.ndarray:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.shape != (rows, dim):
            raise UserError(
                f"{what} has shape {vectors.shape}, expected ({rows}, {dim})",
                hint="the head does not connect the two embedding spaces of this store",
            )
        return vectors


def check_queries(queries: np.ndarray, serving: SpaceSpec) -> np.ndarray:
    array = np.asarray(queries)
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2 or array.shape[1] != serving.dim:
        raise UserError(
            f"query vectors have shape {np.asarray(queries).shape}, but the store serves space "
            f"{serving.name!r} with {serving.dim}-d vectors",
            hint=f"embed the queries with the model of {serving.name!r}",
        )
    array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(array).all():
        raise UserError("query vectors contain NaN or infinite values")
    return array


def build_serving_mode(name: str, forward: TransformFn | None = None, reverse: TransformFn | None = None) -> ServingMode:
    return SERVING_MODES.get(name)(forward=forward, reverse=reverse)
