"""Where a backfill's new vectors come from (``VectorSource``): the new model re-embedding each
item's image, ψ applied to its stored vector, or a table computed elsewhere. Each computes a chunk's
vectors and the items it could not compute, with the reason; none writes anything.

Re-embedding records the hash of each image it read (``vectors.content_hashes``) beside the vector
it makes, and compares it with the hash recorded with the item's vector in its current space: an
image that changed since that vector was made is refused (the item fails, with the reason) unless
the backfill accepts changed sources (``changed_sources="accept"``), which re-embeds it and
records the new content.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.images import ImageSource
from modelupgrade.store.schema import Chunk, ChunkCommit
from modelupgrade.store.spaces import SpaceSpec, TransformFn
from modelupgrade.store.vectors import UNRECORDED, content_hashes

EmbedFn = Callable[[np.ndarray], np.ndarray]
ChangedSources = Literal["refuse", "accept"]


@dataclass
class ChunkVectors:
    """A chunk's computed vectors (row i is slot i's), the hash of the content each was made from
    (None: the source reads no content), and the items it could not compute, with the reason."""

    slots: np.ndarray
    vectors: np.ndarray
    failures: dict[int, str] = field(default_factory=dict)
    content: np.ndarray | None = None

    def restricted_to(self, members: set[int]) -> ChunkVectors:
        """What of these vectors and failures is for the items of ``members``."""
        keep = np.fromiter((int(s) in members for s in self.slots), bool, len(self.slots))
        return ChunkVectors(
            self.slots[keep],
            self.vectors[keep],
            {slot: why for slot, why in self.failures.items() if slot in members},
            None if self.content is None else self.content[keep],
        )

    def commit_of(self, chunk: Chunk) -> ChunkCommit:
        """What commits ``chunk`` once these vectors are durable: its slots, failures, digest."""
        return ChunkCommit(
            chunk, self.slots, self.failures, vectors_digest(self.slots, self.vectors)
        )


class VectorSource(Protocol):
    """Computes the target-space vectors of a chunk's items."""

    method: str

    def compute(self, store: GalleryStore, chunk: Chunk, target: SpaceSpec) -> ChunkVectors: ...


class ReEmbedImages:
    """Decode each item's image and run the new model on it, recording the image's content hash
    with the vector; an image whose hash is not the one recorded with the item's current vector
    changed since that vector was made: refused (the item fails, with the reason), or with
    ``changed_sources="accept"`` re-embedded from its new content (and counted)."""

    method = "embed"

    def __init__(
        self, images: ImageSource, embed_fn: EmbedFn, changed_sources: ChangedSources = "refuse"
    ) -> None:
        self.images, self.embed_fn, self.changed_sources = images, embed_fn, changed_sources
        self.changed: set[int] = set()  # slots of the items whose image had changed

    def compute(self, store: GalleryStore, chunk: Chunk, target: SpaceSpec) -> ChunkVectors:
        loaded = self.images.load(chunk.items)
        if len(loaded.slots) == 0:
            return ChunkVectors(
                loaded.slots, np.empty((0, target.dim), dtype=np.float32), loaded.failures
            )
        content = content_hashes(loaded.images)
        failures = dict(loaded.failures)
        keep = self._unchanged(store, chunk, loaded.slots, content, failures)
        if not keep.any():
            return ChunkVectors(
                loaded.slots[keep], np.empty((0, target.dim), np.float32), failures, content[keep]
            )
        vectors = np.asarray(self.embed_fn(loaded.images[keep]))
        if vectors.ndim != 2 or len(vectors) != int(keep.sum()):
            raise UserError(
                f"the embedding function returned shape {vectors.shape} for "
                f"{int(keep.sum())} images",
                hint="it must return one (D,) vector per image",
            )
        return _drop_non_finite(
            ChunkVectors(loaded.slots[keep], vectors, failures, content[keep]),
            target,
            "the new model",
        )

    def _unchanged(
        self,
        store: GalleryStore,
        chunk: Chunk,
        slots: np.ndarray,
        content: np.ndarray,
        failures: dict[int, str],
    ) -> np.ndarray:
        """Which of the loaded images to embed: all but those whose content changed since the
        item's current vector was made, unless changed sources are accepted."""
        space_of = {item.slot: item.space for item in chunk.items}
        recorded = np.zeros(len(slots), dtype=np.uint64)
        for space in sorted(set(space_of.values())):
            mine = np.fromiter((space_of[int(s)] == space for s in slots), bool, len(slots))
            if space and mine.any():
                recorded[mine] = store.vectors.sources(store.space(space), slots[mine])
        changed = (recorded != UNRECORDED) & (recorded != content)
        keep = np.ones(len(slots), dtype=bool)
        for row in np.flatnonzero(changed):
            slot = int(slots[row])
            self.changed.add(slot)
            if self.changed_sources == "accept":
                continue
            keep[row] = False
            failures[slot] = (
                f"its image changed since its vector in {space_of[slot]!r} was made (content "
                f"{int(recorded[row]):016x}, now {int(content[row]):016x}); `modelupgrade "
                "store-update` records new content, or --changed-sources accept re-embeds it"
            )
        return keep


class TransformStored:
    """Apply ψ to the items' stored vectors: the path for galleries whose images are gone (BiCT)."""

    method = "transform"

    def __init__(self, transform_fn: TransformFn) -> None:
        self.transform_fn = transform_fn

    def compute(self, store: GalleryStore, chunk: Chunk, target: SpaceSpec) -> ChunkVectors:
        spaces = {item.space for item in chunk.items}
        if len(spaces) != 1:
            raise RuntimeError(f"chunk {chunk.index} mixes items of spaces {sorted(spaces)}")
        slots = chunk.slots
        vectors = np.asarray(self.transform_fn(store.read_vectors(spaces.pop(), slots)))
        if vectors.ndim != 2 or len(vectors) != len(slots):
            raise UserError(
                f"the transformation returned shape {vectors.shape} for {len(slots)} vectors",
                hint="ψ must map each stored vector to one target-space vector",
            )
        return _drop_non_finite(ChunkVectors(slots, vectors), target, "the transformation")


class TableVectors:
    """Take each item's new vector from a table computed elsewhere (e.g. an offline batch job)."""

    method = "table"

    def __init__(self, item_ids: Sequence[str], vectors: np.ndarray) -> None:
        if len(item_ids) != len(vectors):
            raise UserError(f"{len(vectors)} vectors for {len(item_ids)} item ids")
        self.rows = {str(item_id): row for row, item_id in enumerate(item_ids)}
        if len(self.rows) != len(item_ids):
            raise UserError("the item ids of the vector table are not unique")
        self.vectors = np.asarray(vectors)

    def compute(self, store: GalleryStore, chunk: Chunk, target: SpaceSpec) -> ChunkVectors:
        found = [item for item in chunk.items if item.item_id in self.rows]
        failures = {
            item.slot: f"the vector table has no row for item {item.item_id}"
            for item in chunk.items
            if item.item_id not in self.rows
        }
        vectors = self.vectors[[self.rows[item.item_id] for item in found]].reshape(len(found), -1)
        slots = np.array([item.slot for item in found], dtype=np.int64)
        return _drop_non_finite(ChunkVectors(slots, vectors, failures), target, "the vector table")


def _drop_non_finite(result: ChunkVectors, target: SpaceSpec, producer: str) -> ChunkVectors:
    if result.vectors.shape[1] != target.dim:
        raise UserError(
            f"{producer} produces {result.vectors.shape[1]}-d vectors, but space {target.name!r} "
            f"holds {target.dim}-d vectors",
            hint="the model (or head) does not belong to this embedding space; "
            "check which one was given",
        )
    finite = np.isfinite(result.vectors).all(axis=1)
    failures = dict(result.failures)
    for slot in result.slots[~finite]:
        failures[int(slot)] = f"{producer} produced NaN or infinite values"
    return ChunkVectors(
        result.slots[finite],
        np.ascontiguousarray(result.vectors[finite], np.float32),
        failures,
        None if result.content is None else result.content[finite],
    )


def vectors_digest(slots: np.ndarray, vectors: np.ndarray) -> str:
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(slots, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(vectors, dtype=np.float32).tobytes())
    return digest.hexdigest()
