"""Seeded per-class sampling: the building blocks every scenario and snapshot is made of.

Each purpose draws from its own stream of the params seed (``SeedSequence([seed, stream])``), so
changing one knob (say the evaluation split) leaves the training splits untouched, and scenarios
that share a definition (the old set of extended-data, open-data and identical-data) share rows.
Row keys are uniform random numbers; "a fraction p of each class" is "the rows whose key ranks
below k_c inside their class", which makes growing fractions nested by construction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

_STREAMS = {"cap": 1, "holdout": 2, "images": 3, "classes": 4, "queries": 5, "gallery": 6}


def stream(seed: int, purpose: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, _STREAMS[purpose]]))


def row_keys(seed: int, purpose: str, n: int) -> np.ndarray:
    return stream(seed, purpose).random(n)


def ranks_within_class(labels: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Rank (0 = smallest key) of every row among the rows of its class, vectorised."""
    n = len(labels)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((keys, labels))
    sorted_labels = labels[order]
    starts = np.flatnonzero(np.r_[True, sorted_labels[1:] != sorted_labels[:-1]])
    group_start = starts[np.searchsorted(starts, np.arange(n), side="right") - 1]
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = np.arange(n) - group_start
    return ranks


def fraction_count(total: np.ndarray | int, fraction: float) -> np.ndarray:
    """floor(total * fraction) as in the papers' toolbox, kept in [1, total-1] for fractions < 1.

    The bounds keep every class on both sides of a fractional split (the papers' 30%-data split
    keeps all classes); a class with a single image stays whole on the "fraction" side.
    """
    total = np.asarray(total, dtype=np.int64)
    if fraction >= 1.0:
        return total
    counts = np.floor(total * fraction + 1e-9).astype(np.int64)
    return np.clip(counts, 1, np.maximum(total - 1, 1))


def per_class_mask(labels: np.ndarray, keys: np.ndarray, per_class: np.ndarray) -> np.ndarray:
    """Rows whose within-class rank is below ``per_class[label]``."""
    return ranks_within_class(labels, keys) < per_class[labels]


def image_fraction_mask(frame: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
    """A per-class random fraction of the images of ``frame`` (every class keeps at least one)."""
    labels = frame["label"].to_numpy(dtype=np.int64)
    keys = row_keys(seed, "images", len(frame))
    counts = np.bincount(labels, minlength=int(labels.max()) + 1 if len(labels) else 0)
    return per_class_mask(labels, keys, fraction_count(counts, fraction))


def class_order(frame: pd.DataFrame, seed: int) -> np.ndarray:
    """The classes of ``frame`` in a seeded random order (prefixes are the class fractions)."""
    classes = np.unique(frame["label"].to_numpy(dtype=np.int64))
    return classes[stream(seed, "classes").permutation(len(classes))]


def class_fraction_mask(frame: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
    """All images of a random fraction of the classes of ``frame``."""
    order = class_order(frame, seed)
    chosen = order[: int(fraction_count(len(order), fraction))]
    return np.isin(frame["label"].to_numpy(dtype=np.int64), chosen)


def cap_per_class(frame: pd.DataFrame, cap: int | None, seed: int) -> pd.DataFrame:
    """At most ``cap`` random images per class (all when ``cap`` is None), in manifest order."""
    if cap is None or frame.empty:
        return frame
    labels = frame["label"].to_numpy(dtype=np.int64)
    keys = row_keys(seed, "cap", len(frame))
    return frame[ranks_within_class(labels, keys) < cap]
