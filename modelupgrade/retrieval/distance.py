"""Distances of the whole project: how a query vector and a gallery vector are compared.

Evaluation names a *similarity* (higher = closer: ``cosine``, ``inner``, ``euclidean``,
``sqeuclidean``, the last two negated); online backfilling and the gallery store name a *distance*
(``cosine`` or ``l2``). Both are computed by ``score_block`` on vectors made ready by ``prepare``,
so a simulated backfill, the cross-model evaluation and the store rank the very same numbers.

A backfill distance is the negated score, exact in float32: ``cosine`` ranks by −cos on
L2-normalised vectors (the order of 1 − cos without its float32 rounding of distinct small cosines
to one value), ``l2`` by the squared Euclidean distance (a monotone map of the Euclidean one). What
a person reads (``reported_distance``) is 1 − cos or the Euclidean distance.
"""

from __future__ import annotations

from typing import Literal, cast

import numpy as np
import torch

from modelupgrade.errors import UserError

Similarity = Literal["cosine", "inner", "euclidean", "sqeuclidean"]
SIMILARITIES: tuple[str, ...] = ("cosine", "inner", "euclidean", "sqeuclidean")
Distance = Literal["cosine", "l2"]
DISTANCES: tuple[str, ...] = ("cosine", "l2")
_SIMILARITY_OF: dict[str, Similarity] = {"cosine": "cosine", "l2": "sqeuclidean"}


def as_feature_tensor(
    features: np.ndarray | torch.Tensor, what: str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    if isinstance(features, torch.Tensor):
        tensor = features
    else:
        array = np.ascontiguousarray(features)
        # torch.from_numpy cannot share read-only memory (np.load with mmap, pandas buffers).
        tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
    if tensor.ndim != 2:
        raise UserError(f"{what} must be a 2-D array (N, D), got shape {tuple(tensor.shape)}")
    if not bool(torch.isfinite(tensor).all()):
        raise UserError(f"{what} contain NaN or infinite values", hint="re-run the embedding stage")
    if dtype is None:
        dtype = torch.float64 if tensor.dtype == torch.float64 else torch.float32
    return tensor.to(dtype)


def l2_normalise(features: torch.Tensor) -> torch.Tensor:
    return features / features.norm(dim=1, keepdim=True).clamp(min=1e-12)


def prepare(features: torch.Tensor, similarity: Similarity) -> torch.Tensor:
    if similarity not in SIMILARITIES:
        raise UserError(
            f"unknown similarity {similarity!r}", hint=f"use one of: {', '.join(SIMILARITIES)}"
        )
    return l2_normalise(features) if similarity == "cosine" else features


def score_block(
    queries: torch.Tensor, gallery: torch.Tensor, similarity: Similarity
) -> torch.Tensor:
    """Scores of prepared query rows against prepared gallery rows (see ``prepare``)."""
    if similarity in ("cosine", "inner"):
        return queries @ gallery.T
    squared = (
        (queries * queries).sum(1, keepdim=True)
        - 2.0 * (queries @ gallery.T)
        + (gallery * gallery).sum(1)[None, :]
    ).clamp_(min=0.0)
    return -squared.sqrt_() if similarity == "euclidean" else -squared


def check_distance(distance: str) -> Distance:
    if distance not in DISTANCES:
        raise UserError(
            f"unknown distance {distance!r}", hint=f"use one of: {', '.join(DISTANCES)}"
        )
    return cast(Distance, distance)


class DistanceBlock:
    """Backfill distances of query rows to one fixed gallery (float32, smaller = closer)."""

    def __init__(self, queries: np.ndarray, gallery: np.ndarray, distance: Distance) -> None:
        if queries.shape[1] != gallery.shape[1]:
            raise UserError(
                f"query vectors are {queries.shape[1]}-d but gallery vectors are "
                f"{gallery.shape[1]}-d",
                hint="a query and the gallery it searches must live in one space "
                "(apply the head first)",
            )
        self.similarity = _SIMILARITY_OF[check_distance(distance)]
        self.queries = prepare(
            as_feature_tensor(queries, "query vectors", torch.float32), self.similarity
        )
        self.gallery = prepare(
            as_feature_tensor(gallery, "gallery vectors", torch.float32), self.similarity
        )

    def __len__(self) -> int:
        return len(self.gallery)

    def __call__(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Distances of the query ``rows`` (all queries when None) to every gallery vector."""
        queries = self.queries if rows is None else self.queries[torch.from_numpy(np.asarray(rows))]
        return score_block(queries, self.gallery, self.similarity).neg_().numpy()


def reported_distance(distances: np.ndarray, distance: Distance) -> np.ndarray:
    """What a person reads for backfill distances: 1 − cos, or the Euclidean distance."""
    distances = np.asarray(distances, dtype=np.float32)
    if check_distance(distance) == "cosine":
        return 1.0 + distances
    return np.sqrt(np.maximum(distances, 0.0))
