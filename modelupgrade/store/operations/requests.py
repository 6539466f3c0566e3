"""Typed requests of the store's operations (``modelupgrade.store.operations``): what a command
line, a Prefect flow or the Ray executor asks of the store, checked once, resolved against
params.yaml once (``*.of(params, ...)``), and passed to the operation whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.store.sources import ChangedSources


def vector_flags(
    model: Path | None,
    transform_head: Path | None,
    table: Path | None,
    items: Path | None = None,
    rho_head: Path | None = None,
) -> list[str]:
    """The command-line flags naming a backfill's new vectors that are set."""
    flags = (
        ("--model", model),
        ("--transform-head", transform_head),
        ("--vectors", table),
        ("--items", items),
        ("--rho-head", rho_head),
    )
    return [name for name, value in flags if value is not None]


@dataclass(frozen=True)
class NewVectors:
    """Where a backfill's new vectors come from: exactly one of a model that re-embeds each image,
    a forward head ψ applied to the stored vectors, or a table computed elsewhere (vectors and the
    items naming their rows); optionally stored as ρ of them (``rho_head``, Seo et al.'s full
    method)."""

    model: Path | None = None
    transform_head: Path | None = None
    table: Path | None = None
    items: Path | None = None
    rho_head: Path | None = None
    changed_sources: ChangedSources = "refuse"

    def __post_init__(self) -> None:
        given = vector_flags(self.model, self.transform_head, self.table)
        if len(given) != 1:
            raise UserError(
                f"give exactly one source of new vectors, got {', '.join(given) or 'none'}",
                hint="--model (re-embed images), --transform-head (ψ on stored vectors) "
                "or --vectors (a table)",
            )
        from modelupgrade.data.vector_table import is_vector_table

        named = self.table is not None and is_vector_table(self.table)  # ids in the table
        if self.items is not None and (self.table is None or named):
            raise UserError(
                "--items names the rows of a .npy --vectors matrix only",
                hint="an item_id + embedding table names its own rows: drop --items",
            )
        if self.table is not None and not named and self.items is None:
            raise UserError(
                "--vectors as a .npy matrix needs --items",
                hint="the items table names the item of each row (or give an item_id + "
                "embedding parquet table)",
            )

    @property
    def form(self) -> Literal["new", "rho"]:
        return "rho" if self.rho_head is not None else "new"


@dataclass(frozen=True)
class Chunking:
    """In which order and how many items a backfill moves per atomic commit."""

    policy: str
    chunk_size: int
    seed: int

    @classmethod
    def of(
        cls, params: Params, policy: str | None, chunk_size: int | None, seed: int | None
    ) -> Chunking:
        """The command line's settings over params.yaml's (``store.policy``, ``store.chunk_size``,
        the seed)."""
        return cls(
            policy or params.store.policy,
            chunk_size or params.store.chunk_size,
            params.seed if seed is None else seed,
        )


@dataclass(frozen=True)
class Serving:
    """How the store is searched meanwhile: a serving mode and whether it has a forward head."""

    mode: str
    forward_head: Path | None = None

    @classmethod
    def of(cls, params: Params, mode: str | None, forward_head: Path | None) -> Serving:
        return cls(mode or params.store.serving_mode, forward_head)


@dataclass(frozen=True)
class RayPlacement:
    """Where the Ray executor computes chunks: the cluster and its workers."""

    address: str | None = None
    workers: int | None = None
    gpus_per_worker: float | None = None
    cpus_per_worker: float = 1.0


@dataclass(frozen=True)
class BackfillRequest:
    """Move the store at ``store`` into a new space (``space``, default: the model's name)."""

    store: Path
    vectors: NewVectors
    chunking: Chunking
    serving: Serving
    space: str | None = None
    upgrades_from: tuple[str, ...] = ()
    device: str = "cpu"
    progress: bool = True
    ray: RayPlacement | None = None
    retry_failed: bool = False


@dataclass(frozen=True)
class IngestRequest:
    """Add items (a manifest or split table) and their vectors in one space to the store at
    ``store`` (created when absent)."""

    store: Path
    items: Path
    model: Path
    vectors: Path | None = None
    space: str | None = None
    scores: tuple[str, ...] = ("old-confidence", "old-entropy")
    score_files: tuple[str, ...] = ()
    fastfill_head: Path | None = None
    device: str = "cpu"


@dataclass(frozen=True)
class UpdateRequest:
    """New content of existing items (a manifest or split table naming them, and where their new
    images are): their vectors in each space that keeps one, from ``vectors`` (space → .npy, row i
    = row i of the table) or embedded by ``models`` (model directories, each its space's)."""

    store: Path
    items: Path
    vectors: dict[str, Path] = field(default_factory=dict)
    models: tuple[Path, ...] = ()
    device: str = "cpu"


@dataclass(frozen=True)
class EraseRequest:
    """Erase items by id, with the reason recorded."""

    store: Path
    item_ids: tuple[str, ...]
    reason: str

    @classmethod
    def of(
        cls, store: Path, item_ids: Sequence[str], ids_file: Path | None, reason: str
    ) -> EraseRequest:
        ids = [str(i) for i in item_ids]
        if ids_file is not None:
            from modelupgrade.store.ingest import read_item_table

            frame = read_item_table(ids_file)
            if "item_id" not in frame.columns:
                raise UserError(f"{ids_file} has no item_id column")
            ids += frame["item_id"].astype(str).tolist()
        if not ids:
            raise UserError(
                "name the items to erase",
                hint="--item-id ID … or --items TABLE (an item_id column)",
            )
        return cls(store, tuple(ids), reason)
