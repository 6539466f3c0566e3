"""Fixtures shared by the store tests: a small synthetic gallery and a deterministic ψ."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelupgrade.store import BackfillJob, GalleryStore, SpaceSpec, TransformStored

OLD = SpaceSpec("gen0", 16)
NEW = SpaceSpec("gen1", 12, upgrades_from=("gen0",), backward_compatible=False)
PROJECT_PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def psi_matrix() -> np.ndarray:
    return np.random.default_rng(7).normal(size=(OLD.dim, NEW.dim)).astype(np.float32)


def psi(vectors: np.ndarray) -> np.ndarray:
    """A deterministic forward map old → new (what a BiCT head does to stored vectors)."""
    return np.tanh(vectors @ psi_matrix())


def reverse(queries: np.ndarray) -> np.ndarray:
    """A deterministic reverse map new → old, for rank-merge-rqt serving."""
    return queries @ psi_matrix().T


def build_gallery(path: Path, n: int, seed: int = 0) -> GalleryStore:
    """``n`` items with gen0 vectors and an old-confidence score each."""
    rng = np.random.default_rng(seed)
    store = GalleryStore.create(path)
    store.ingest(
        [f"item-{i:05d}" for i in range(n)],
        rng.normal(size=(n, OLD.dim)).astype(np.float32),
        OLD,
        scores={"old-confidence": rng.random(n)},
    )
    return store


def psi_job(
    store: GalleryStore,
    policy: str = "old-confidence",
    chunk: int = 32,
    target: SpaceSpec = NEW,
    seed: int = 3,
) -> BackfillJob:
    from modelupgrade.ordering import build_ordering

    return BackfillJob(
        store,
        target,
        TransformStored(psi),
        build_ordering(policy),
        chunk,
        seed=seed,
        progress=False,
    )
