"""Fixtures shared by the store tests: a small synthetic gallery and a deterministic ψ."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import numpy as np

from modelupgrade.store import (
    BackendSettings,
    BackfillJob,
    GalleryStore,
    ItemSources,
    SpaceSpec,
    TransformStored,
)

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


def build_gallery(
    path: Path,
    n: int,
    seed: int = 0,
    space: SpaceSpec = OLD,
    item_id: str = "item-{:05d}",
    sources: ItemSources | None = None,
    backend: BackendSettings | None = None,
) -> GalleryStore:
    """``n`` items (ids ``item_id`` of 0 … n − 1) with random ``space`` vectors and an
    old-confidence score each, their vectors in ``backend`` (default: embedded)."""
    rng = np.random.default_rng(seed)
    store = GalleryStore.create(path, backend)
    store.ingest(
        [item_id.format(i) for i in range(n)],
        rng.normal(size=(n, space.dim)).astype(np.float32),
        space,
        sources,
        scores={"old-confidence": rng.random(n)},
    )
    return store


def write_images(root: Path, n: int, size: int, corrupt: Collection[int] = ()) -> Path:
    """Random grey PNGs ``root``/0.png … (n − 1).png; those in ``corrupt`` are not images."""
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        if i in corrupt:
            (root / f"{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
        else:
            Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8)).save(
                root / f"{i}.png"
            )
    return root


def image_gallery(path: Path, n: int, seed: int = 0) -> GalleryStore:
    """``build_gallery`` of items img0 … whose images are the files i.png (``write_images``)."""
    sources = ItemSources([f"{i}.png" for i in range(n)])
    return build_gallery(path, n, seed, item_id="img{}", sources=sources)


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
