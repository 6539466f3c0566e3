"""Fault injection (issue 30, "Done when"): every writer of a store is SIGKILLed at each of its
commit boundaries (``modelupgrade.store.faults.boundary``) on every backend, then ``store-verify``
runs: 0 inconsistencies, nothing lost (every live item's vector is the one its content and its space
give), nothing resurrected (an erased item is in no table, no search and no stored vector).

One store goes through a gallery's life, each step killed at each boundary in turn, then run again
to the end as the next writer would: ingest into a new store, a backfill, live ingests, erasures
and updates during it, the backfill's end, cutover, rollback, cutover, cleanup, and a second
backfill aborted. The writers run in children forked from one process (``store_fork_server``) that
imported the library once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelupgrade.errors import UserError
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import BackendSettings, GalleryStore, HeadTransforms, Searcher
from modelupgrade.store.verify import verify
from tests.store_fork_server import EXIT_REFUSED, GEN2, psi2, source_vector
from tests.store_helpers import NEW, PROJECT_ROOT, psi

KILLED = -9


class ForkServer:
    """The ``store_fork_server`` process: ``run`` one writer in a forked child."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.store_fork_server"],
            cwd=PROJECT_ROOT,
            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, **request: Any) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, "the fork server died"
        return int(json.loads(answer)["status"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture
def forks() -> Iterator[ForkServer]:
    server = ForkServer()
    yield server
    server.close()


@dataclass
class Expected:
    """What the store must hold: each live item's content version, the erased items and the
    slots they had."""

    versions: dict[str, int] = field(default_factory=dict)
    erased: dict[str, int] = field(default_factory=dict)

    def copy(self) -> Expected:
        return Expected(dict(self.versions), dict(self.erased))

    def vector(self, item_id: str, space: str) -> np.ndarray:
        vector = source_vector(item_id, self.versions[item_id])[None]
        if space in (NEW.name, GEN2.name):
            vector = psi(vector)
        if space == GEN2.name:
            vector = psi2(vector)
        return vector[0]


def _check(path: Path, *states: Expected) -> None:
    """``verify`` finds nothing wrong, and the store is in one of ``states`` (a killed writer's
    work done entirely or not at all): every live item holds its vector, and no erased item is in
    any table, any search or any stored vector (bar those still listed for the next writer to
    destroy)."""
    with GalleryStore.open(path) as store:
        report = verify(store)
        assert report.inconsistencies == 0, report.describe()
        items = {item.item_id: item for item in store.items()}
        problems = []
        for state in states:
            problem = _differs(store, items, state)
            if problem is None:
                _nothing_erased_left(store, state)
                return
            problems.append(problem)
        raise AssertionError(f"the store is in none of the states a kill may leave: {problems}")


def _differs(store: GalleryStore, items: dict[str, Any], state: Expected) -> str | None:
    """What about the store's items is not ``state`` (None: it is ``state``)."""
    if set(state.versions) != set(items):
        return f"items {sorted(set(items) ^ set(state.versions))[:5]} differ"
    by_space: dict[str, list[str]] = {}
    for item in items.values():
        by_space.setdefault(item.space, []).append(item.item_id)
    for space, ids in by_space.items():
        stored = store.read_vectors(space, np.array([items[i].slot for i in ids]))
        wanted = np.stack([state.vector(i, space) for i in ids])
        # float32 BLAS rounds a chunk's product and one row's differently (up to 7e-7 on an AMD
        # EPYC); a wrong version or space is off by far more than 1e-5
        wrong = ~np.isclose(stored, wanted, rtol=1e-5, atol=1e-5).all(axis=1)
        if wrong.any():
            return f"{int(wrong.sum())} vector(s) of {space}, e.g. {ids[int(np.argmax(wrong))]}"
    return None


def _nothing_erased_left(store: GalleryStore, state: Expected) -> None:
    waiting = {row[0] for row in store.db.query("SELECT slot FROM orphan_slots")}
    gone = set(state.erased.values()) - waiting
    present = getattr(store.vectors, "present_slots")  # noqa: B009 - both backends have it
    for spec in store.spaces().values():
        if spec.storage in store.vectors.stored():
            assert not set(present(spec).tolist()) & gone, f"an erased vector in {spec.name}"
    if state.erased and store.serving_space() is not None:
        _not_found(store, state)


def _not_found(store: GalleryStore, expected: Expected) -> None:
    serving = store.serving_space()
    mode = build_serving_mode("mixed")
    heads = HeadTransforms(forward=psi if serving == NEW.name else None)
    erased = list(expected.erased)
    queries = np.stack([source_vector(i)[None] for i in erased])[:, 0]
    if serving in (NEW.name, GEN2.name):
        queries = psi(queries)
    if serving == GEN2.name:
        queries = psi2(queries)
    try:
        hits = Searcher(store, mode, heads=heads).search(queries, 5)
    except UserError as err:  # a mode that cannot serve this state: nothing to see
        assert "backward compatible" in err.message, err
        return
    assert not set(hits.item_ids.ravel()) & set(erased)


class Sweep:
    """One store through a gallery's life, each writer killed at each of its boundaries."""

    def __init__(self, forks: ForkServer, path: Path) -> None:
        self.forks, self.path = forks, path
        self.state = Expected()
        self.kills = 0

    def step(
        self,
        request: dict[str, Any],
        kills: list[str],
        after: Expected | None = None,
        ends: tuple[int, ...] = (0,),
        then: dict[str, Any] | None = None,
    ) -> None:
        """``request`` killed at each boundary of ``kills`` in turn (the store checked after each:
        as before the request, or as ``after`` it), then run to its end by the next writer (exit
        status in ``ends``; a refusal: a step the recovery finished), with ``then`` over it."""
        after = after or self.state
        for boundary in kills:
            status = self.forks.run(**request, kill_at=boundary)
            assert status == KILLED, f"{request['action']} not killed at {boundary}: {status}"
            self.kills += 1
            if (self.path / "store.sqlite").exists():
                _check(self.path, self.state, after)
        status = self.forks.run(**{**request, **(then or {})})
        assert status in ends, f"{request['action']} ended with {status}"
        self.state = after
        _check(self.path, self.state)


def _slots(path: Path, ids: list[str]) -> dict[str, int]:
    with GalleryStore.open(path) as store:
        return {item.item_id: item.slot for item in store.items() if item.item_id in ids}


def test_every_writer_killed_at_each_commit_boundary_leaves_a_consistent_store(
    backend: BackendSettings, tmp_path: Path, forks: ForkServer
) -> None:
    path = tmp_path / "s"
    sweep = Sweep(forks, path)
    settings = {"kind": backend.kind, "uri": backend.uri}
    first = [f"item-{i:03d}" for i in range(120)]
    ingest = {"action": "ingest", "store": str(path), "backend": settings, "ids": first}
    after = Expected(dict.fromkeys(first, 1))
    sweep.step(ingest, ["create:database", "ingest:vectors", "ingest:committed"], after)

    backfill = {"action": "backfill", "store": str(path), "target": NEW.name, "chunk": 20}
    kills = ["backfill:planned", "backfill:vectors#2", "backfill:committed#2"]
    sweep.step(backfill, kills, then={"max_chunks": 1})  # 4 of its 6 chunks: it goes on running

    # live writes while the backfill runs: new items join it, some are erased, some updated
    late = [f"late-{i}" for i in range(15)]
    after = sweep.state.copy()
    after.versions.update(dict.fromkeys(late, 1))
    sweep.step({**ingest, "ids": late}, ["ingest:vectors", "ingest:committed"], after)
    for ids, kill in ((first[:2] + late[:1], "erase:recorded"), (first[60:62], "erase:destroyed")):
        after = sweep.state.copy()
        after.erased.update(_slots(path, ids))
        for item_id in ids:
            after.versions.pop(item_id)
        sweep.step({"action": "erase", "store": str(path), "ids": ids}, [kill], after)
    updated = [first[5], first[90], late[3]]
    after = sweep.state.copy()
    after.versions.update(dict.fromkeys(updated, 2))
    update = {"action": "update", "store": str(path), "ids": updated}
    sweep.step(update, ["update:vectors", "update:committed"], after)

    sweep.step(backfill, ["backfill:finished"])
    with GalleryStore.open(path) as store:
        assert store.status().backfill.status == "complete"

    refused = (0, EXIT_REFUSED)  # the recovery finished the step the kill interrupted
    for action in ("cutover", "rollback"):
        kills = [f"{action}:intent", f"{action}:backend", f"{action}:committed"]
        sweep.step({"action": action, "store": str(path)}, kills, ends=refused)
    sweep.step({"action": "cutover", "store": str(path)}, [])
    sweep.step({"action": "cleanup", "store": str(path)}, ["cleanup:recorded", "cleanup:dropped"])

    sweep.step({**backfill, "target": GEN2.name, "max_chunks": 2}, [])
    abort = {"action": "abort", "store": str(path)}
    sweep.step(abort, ["abort:ledger", "discard:dropped"], ends=refused)
    with GalleryStore.open(path) as store:
        assert store.serving_space() == NEW.name and GEN2.name not in store.spaces()
        assert store.status().erasures == 4  # each request recorded, its re-run too (0 items)
    assert sweep.kills == 23
