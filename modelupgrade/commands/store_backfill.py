"""The ``backfill`` command's flags as one record (``BackfillFlags``), checked together and turned
into the store's typed request: what ``modelupgrade.commands.store.backfill`` runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.store import operations
from modelupgrade.store.ledger import AbortRecord
from modelupgrade.store.operations.requests import (
    BackfillRequest,
    Chunking,
    NewVectors,
    RayPlacement,
    Serving,
    vector_flags,
)
from modelupgrade.store.preview import BackfillPreview
from modelupgrade.store.report import BackfillReport
from modelupgrade.store.sources import ChangedSources


@dataclass(frozen=True)
class BackfillFlags:
    """``backfill``'s arguments (see its docstring), the params file apart."""

    store: Path | None
    model: Path | None
    transform_head: Path | None
    vectors: Path | None
    items: Path | None
    rho_head: Path | None
    space: str | None
    upgrades_from: Sequence[str]
    policy: str | None
    chunk_size: int | None
    retry_failed: bool
    abort: bool
    dry_run: bool
    mode: str | None
    forward_head: Path | None
    seed: int | None
    changed_sources: ChangedSources
    device: str
    progress: bool
    executor: Literal["local", "ray"]
    ray_address: str | None
    workers: int | None
    gpus_per_worker: float | None
    cpus_per_worker: float

    def run(self, params: Params) -> BackfillReport | BackfillPreview | AbortRecord:
        """The abort, the preview or the backfill the flags ask for."""
        store_path = Path(self.store) if self.store is not None else Path(params.store.path)
        if self.dry_run and (self.abort or self.retry_failed):
            raise UserError(
                "--dry-run previews a backfill; it takes no "
                + ("--abort" if self.abort else "--retry-failed"),
                hint="preview first, then run the command without --dry-run",
            )
        if self.abort:
            self.check_abort_alone(store_path)
            return operations.abort(store_path)
        request = self.request(params, store_path)
        if self.dry_run:
            return operations.preview(params, request)
        return operations.run_backfill(params, request)

    def check_abort_alone(self, store_path: Path) -> None:
        """--abort takes none of the flags that say what a backfill computes."""
        extra = vector_flags(
            self.model, self.transform_head, self.vectors, self.items, self.rho_head
        ) + (["--retry-failed"] if self.retry_failed else [])
        if extra:
            raise UserError(
                f"--abort undoes the running backfill; it takes no {', '.join(extra)}",
                hint=f"run `modelupgrade backfill --store {store_path} --abort` alone",
            )

    def request(self, params: Params, store_path: Path) -> BackfillRequest:
        """The typed request of the store's backfill operation."""
        ray = RayPlacement(
            self.ray_address, self.workers, self.gpus_per_worker, self.cpus_per_worker
        )
        vectors = NewVectors(
            self.model,
            self.transform_head,
            self.vectors,
            self.items,
            self.rho_head,
            self.changed_sources,
        )
        return BackfillRequest(
            store=store_path,
            vectors=vectors,
            chunking=Chunking.of(params, self.policy, self.chunk_size, self.seed),
            serving=Serving.of(params, self.mode, self.forward_head),
            space=self.space,
            upgrades_from=tuple(self.upgrades_from),
            device=self.device,
            progress=self.progress,
            ray=ray if self.executor == "ray" else None,
            retry_failed=self.retry_failed,
        )
