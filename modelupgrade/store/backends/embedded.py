"""The embedded vector backend: one float32 file per space beside the store's database, and one
file of checksums per space (``vectors/<space>.f32`` and ``vectors/<space>.sum``), searched by an
exact scan with the shared kernel. The default: nothing to install or start.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from modelupgrade.retrieval.distance import Distance
from modelupgrade.store.backends.base import (
    VECTOR_BACKENDS,
    BackendSettings,
    PartGallery,
    VectorBackend,
)
from modelupgrade.store.schema import VECTORS_DIR
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.vectors import VectorFile


class _ScannedPart(PartGallery):
    """Every vector of the part, read once per snapshot: the exact scan needs them all."""

    def __init__(self, slots: np.ndarray, vectors: np.ndarray) -> None:
        self.slots, self._vectors = slots, vectors  # slots ascending, as a snapshot lists them

    def nearest(
        self, queries: np.ndarray, k: int, distance: Distance
    ) -> tuple[np.ndarray, np.ndarray]:
        return self.slots, self._vectors

    def vectors(self, slots: np.ndarray) -> np.ndarray:
        return self._vectors[np.searchsorted(self.slots, slots)]


@VECTOR_BACKENDS.register("embedded")
class EmbeddedVectors(VectorBackend):
    def __init__(self, store_path: Path, settings: BackendSettings) -> None:
        super().__init__(store_path, settings)
        self.root = store_path / VECTORS_DIR
        self._files: dict[str, tuple[VectorFile, VectorFile]] = {}
        self._lock = threading.Lock()

    def _files_of(self, spec: SpaceSpec) -> tuple[VectorFile, VectorFile]:
        with self._lock:
            files = self._files.get(spec.name)
            if files is None:
                vectors = VectorFile(self.root / f"{spec.name}.f32", spec.dim)
                sums = VectorFile(self.root / f"{spec.name}.sum", 1, np.uint64)
                # A store written before checksums were kept: its rows read as unrecorded (0).
                sums.ensure_rows(vectors.rows_on_disk())
                files = self._files[spec.name] = (vectors, sums)
            return files

    def add_space(self, spec: SpaceSpec, rows: int) -> None:
        self.reserve([spec], rows)

    def reserve(self, specs: list[SpaceSpec], rows: int) -> None:
        for spec in specs:
            for file in self._files_of(spec):
                file.ensure_rows(rows)

    def write(
        self, spec: SpaceSpec, slots: np.ndarray, vectors: np.ndarray, checksums: np.ndarray
    ) -> None:
        vector_file, sums = self._files_of(spec)
        vector_file.write(slots, vectors, durable=False)
        sums.write(slots, checksums.reshape(-1, 1), durable=False)

    def sync(self, spec: SpaceSpec) -> None:
        for file in self._files_of(spec):
            file.sync()

    def read(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        return self._files_of(spec)[0].read(slots)

    def checksums(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        return self._files_of(spec)[1].read(slots).reshape(-1)

    def provenance(self, spec: SpaceSpec, slots: np.ndarray) -> list[tuple[str, str]]:
        """A space's file holds only that space's vectors: the spaces table records its model."""
        return [(spec.name, spec.model_ref)] * len(slots)

    def part(self, spec: SpaceSpec, slots: np.ndarray, items: int) -> PartGallery:
        return _ScannedPart(slots, self.read(spec, slots))

    def describe(self) -> dict[str, str]:
        return {"backend": self.registry_name, "location": str(self.root)}

    def discard(self, space: str) -> None:
        with self._lock:
            for file in self._files.pop(space, ()):
                file.close()
            for suffix in (".f32", ".sum"):
                (self.root / f"{space}{suffix}").unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            for files in self._files.values():
                for file in files:
                    file.close()
            self._files.clear()
