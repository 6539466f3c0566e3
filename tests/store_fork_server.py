"""A process that runs store writers in forked children, for the fault-injection tests: it imports
the library once, then for each request (a JSON line on stdin) forks a child that opens the store
and runs one writer, with ``MODELUPGRADE_KILL_AT`` naming the commit boundary where the child
SIGKILLs itself (``modelupgrade.store.faults.boundary``); it answers with the child's exit status
(a JSON line on stdout: ``{"status": -9}`` for a kill). A child starts in milliseconds, not in the
seconds a new Python takes to import torch. The server itself never opens a store, so no child
inherits a connection (Milvus clients do not survive a fork).

    python -m tests.store_fork_server   # then {"action": …, "store": …, "kill_at": …} lines

The items' vectors are functions of their ids (``source_vector``), so a test knows what every
vector must be after any sequence of kills and recoveries.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback
from typing import Any

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.ordering import build_ordering
from modelupgrade.store import (
    BackendSettings,
    BackfillJob,
    GalleryStore,
    SpaceSpec,
    TransformStored,
)
from tests.store_helpers import NEW, OLD, psi

GEN2 = SpaceSpec("gen2", NEW.dim, upgrades_from=(NEW.name,), backward_compatible=True)
EXIT_REFUSED = 3  # the writer refused (a UserError): e.g. a step already done


def source_vector(item_id: str, version: int = 1) -> np.ndarray:
    """The gen0 vector of ``item_id`` in its ``version``-th content."""
    seed = int.from_bytes(hashlib.sha256(f"{item_id}/{version}".encode()).digest()[:8], "little")
    return np.random.default_rng(seed).normal(size=OLD.dim).astype(np.float32)


def psi2(vectors: np.ndarray) -> np.ndarray:
    """gen1 → gen2."""
    return np.ascontiguousarray(np.asarray(vectors, np.float32)[:, ::-1] * 0.5)


def _ingest(store: GalleryStore, ids: list[str]) -> None:
    with store.committing("ingest"):
        new = [i for i in ids if not store.known_item_ids([i])]
        if new:
            vectors = np.stack([source_vector(i) for i in new])
            store.ingest(new, vectors, OLD, scores={"old-confidence": vectors[:, 0] * 0 + 0.5})


def _job(store: GalleryStore, target: str, chunk: int) -> BackfillJob:
    spec, transform = (NEW, psi) if target == NEW.name else (GEN2, psi2)
    return BackfillJob(
        store,
        spec,
        TransformStored(transform),
        build_ordering("random"),
        chunk,
        seed=5,
        progress=False,
        max_group=1,
    )


def _passed() -> Any:
    from modelupgrade.registry.gates import GateCheck
    from modelupgrade.store.shadow import ShadowEvaluation

    evaluation = ShadowEvaluation("mAP", NEW.name, OLD.name, 1, 1, {}, {}, 0.0)
    evaluation.checks.append(GateCheck("shadow", True, 1.0, 0.0, "fault-injection test"))
    return evaluation


def run(request: dict[str, Any]) -> None:
    """One writer on the store of ``request`` (in the child)."""
    from modelupgrade.store import abort_backfill
    from modelupgrade.store.cutover import cleanup, cutover, rollback
    from modelupgrade.store.live import erase, update

    action, path = request["action"], request["store"]
    backend = BackendSettings(**request.get("backend", {}))
    if action == "ingest":
        store, _ = GalleryStore.open_or_create(path, backend)
    else:
        store = GalleryStore.open(path)
    with store:
        if action == "ingest":
            _ingest(store, request["ids"])
        elif action == "backfill":
            _job(store, request["target"], request["chunk"]).run(request.get("max_chunks"))
        elif action == "erase":
            erase(store, request["ids"], "a request to be forgotten")
        elif action == "update":
            ids = request["ids"]
            vectors = np.stack([source_vector(i, 2) for i in ids])
            update(store, ids, {OLD.name: vectors})
        elif action == "cutover":
            cutover(store, "shadow ok", 168.0, lambda backfill: _passed())
        elif action == "rollback":
            rollback(store, "back")
        elif action == "cleanup":
            cleanup(store, "tidy", force=True)
        elif action == "abort":
            abort_backfill(store)
        else:
            raise ValueError(f"unknown action {action!r}")


def _child(request: dict[str, Any]) -> int:
    if request.get("kill_at"):
        os.environ["MODELUPGRADE_KILL_AT"] = request["kill_at"]
    try:
        run(request)
    except UserError as err:
        print(f"refused: {err}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    except BaseException:  # noqa: BLE001 - reported to the test, which fails on it
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = _child(request)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"status": code}), flush=True)


if __name__ == "__main__":
    main()
