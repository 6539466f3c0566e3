"""Soak (issue 20, "Done when"; issue 29, item 3): a backfill runs while clients query two HTTP
service processes (replicas of one store); a second backfill is refused; items are ingested and
some of them erased while it runs; the backfill is SIGKILLed and resumed twice. Every query must be
answered (no 5xx, no dropped connection), every item must end in the target space exactly once,
the gallery's own items equal to an uninterrupted run vector for vector and chunk for chunk (the
items ingested meanwhile in the chunks after those), no erased item anywhere, and both services
give the same answers once the backfill is done. Loopback only, bounded in time; it prints what it
measured (queries served, p99 latency during the backfill, kills survived).

It runs on the embedded backend and on the Milvus server, and is skipped on Milvus Lite, which
serves one process at a time: the services and the backfill cannot all open its file.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from modelupgrade.errors import UserError
from modelupgrade.store import BackendSettings, GalleryStore
from modelupgrade.store.live import erase
from tests.store_helpers import (
    NEW,
    OLD,
    PROJECT_PARAMS,
    build_gallery,
    final_state,
    milvus_lite,
    plan_psi_backfill,
    psi_job,
    slow_backfill_script,
    spawn_backfill_worker,
    wait_for_chunks,
)

ROOT = Path(__file__).resolve().parents[1]
N_ITEMS, CHUNK, CLIENTS, KILLS, SERVICES, LIVE = 3000, 64, 4, 2, 2, 50
# The soak's own limit: it must end well within it, or it fails rather than run on. Three times its
# longest quiet run (the Milvus-server variant, 76–81 s beside the rest of `make test`): a machine
# that runs the stages 2.5× slower still passes (at 110 s it failed at 114 s with a `dvc repro`
# running beside the suite).
BUDGET_S = 250.0

# At most 4 chunks computed ahead of the commits (the job's default is 32): the hold pauses ψ, not
# the commits of chunks already computed, and where a commit is slow (a Milvus server on a slower
# 2-core machine) 32 covered the whole gallery, which then finished during the hold, before the
# live items it was to take in were ingested.
WORKER = slow_backfill_script(
    CHUNK, job_options="max_group=4", then="raise SystemExit(report.exit_code)"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Client(threading.Thread):
    """POSTs /search in a loop over one keep-alive connection; records each answer's status and
    latency, and any request that got no answer."""

    def __init__(self, port: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.port, self.seed = port, seed
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.statuses: dict[int, int] = {}
        self.failures: list[str] = []

    def run(self) -> None:
        rng = np.random.default_rng(self.seed)
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.is_set():
            body = json.dumps(
                {
                    "vectors": rng.normal(size=(2, NEW.dim)).tolist(),
                    "old_vectors": rng.normal(size=(2, OLD.dim)).tolist(),
                    "k": 10,
                }
            )
            started = time.perf_counter()
            try:
                connection.request("POST", "/search", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException) as err:
                self.failures.append(repr(err))
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                continue
            self.latencies.append(time.perf_counter() - started)
            self.statuses[response.status] = self.statuses.get(response.status, 0) + 1
            if response.status != 200:
                self.failures.append(f"{response.status}: {answer[:200]!r}")
            elif [len(row) for row in json.loads(answer)["results"]] != [10, 10]:
                self.failures.append(f"not 10 hits per query: {answer[:200]!r}")
        connection.close()


def _serve(store: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [
        str(Path(sys.executable).parent / "modelupgrade"),
        *("serve", "--params", str(PROJECT_PARAMS), "--store", str(store)),
        *("--mode", "rank-merge", "--host", "127.0.0.1", "--port", str(port)),
    ]
    env = {key: value for key, value in os.environ.items() if key != "MODELUPGRADE_SERVICE_TOKEN"}
    with open(log, "wb") as output:  # a file, not a pipe: the access log must never block it
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=output)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise AssertionError("the service did not listen within 60 s")


def _answers(port: int) -> list[list[str]]:
    """The ids one service answers five fixed queries with."""
    rng = np.random.default_rng(99)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    found = []
    for _ in range(5):
        body = json.dumps(
            {
                "vectors": rng.normal(size=(1, NEW.dim)).tolist(),
                "old_vectors": rng.normal(size=(1, OLD.dim)).tolist(),
                "k": 10,
            }
        )
        connection.request("POST", "/search", body, {"Content-Type": "application/json"})
        answer = json.loads(connection.getresponse().read())
        found.append([hit["item_id"] for hit in answer["results"][0]])
    connection.close()
    return found


def test_backfill_under_queries_kills_and_a_second_writer(
    tmp_path: Path, backend: BackendSettings
) -> None:
    if milvus_lite(backend):
        pytest.skip(
            "Milvus Lite serves one process at a time: the HTTP service cannot open the store's "
            "Milvus Lite file while a backfill process holds it (a Milvus server can)"
        )
    began = time.monotonic()
    # A Milvus server writes each chunk's rows twice (the moved items' source rows record the
    # move): half the gallery keeps the soak within its budget there.
    items = N_ITEMS if backend.kind == "embedded" else N_ITEMS // 2
    with build_gallery(tmp_path / "reference", items, backend=backend) as reference:
        assert psi_job(reference, chunk=CHUNK, seed=0).run().status == "complete"
        expected_states, expected_vectors, expected_chunks = final_state(reference)

    path = tmp_path / "store"
    with build_gallery(path, items, backend=backend) as store:
        # Planned before the clients start: they query the new serving space from the first.
        plan_psi_backfill(store, CHUNK)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    hold = tmp_path / "hold"
    ports = [_free_port() for _ in range(SERVICES)]
    servers = [_serve(path, port, tmp_path / f"serve{port}.log") for port in ports]
    clients = [_Client(ports[seed % SERVICES], seed) for seed in range(CLIENTS)]
    kills, refused, progress, live, erased = 0, 0, [], [], []
    rng = np.random.default_rng(2024)
    worker: subprocess.Popen[str] | None = None
    try:
        for client in clients:
            client.start()
        with GalleryStore.open(path) as watcher:
            for _ in range(KILLS):
                before = len(watcher.backfills.chunk_log())
                worker = spawn_backfill_worker(path, script, delay=0.02, hold=hold)
                wait_for_chunks(watcher, worker, before + 3, began + BUDGET_S - time.monotonic())
                # Paused inside ψ of its next chunk while this side writes: on a loaded machine a
                # free-running worker could finish the gallery before the kill (CI, stop 37).
                hold.touch()
                # A second backfill meets the lease, whatever it wants to do.
                with pytest.raises(UserError, match=f"being written by pid {worker.pid} "):
                    psi_job(watcher, chunk=CHUNK, seed=0).run()
                refused += 1
                # Live writes go on meanwhile: new items join the backfill, some are erased.
                batch = [f"live-{kills}-{i}" for i in range(LIVE)]
                vectors = np.random.default_rng(kills).normal(size=(LIVE, OLD.dim))
                scores = {"old-confidence": np.full(LIVE, 0.5)}
                watcher.ingest(batch, vectors.astype(np.float32), OLD, scores=scores)
                live += batch
                erase(watcher, batch[: LIVE // 5], "soak")
                erased += batch[: LIVE // 5]
                # Released, then killed at a random moment: inside ψ, between the vector write and
                # the commit, or inside the transaction.
                hold.unlink()
                time.sleep(float(rng.uniform(0.0, 0.1)))
                assert worker.poll() is None, worker.communicate()
                worker.send_signal(signal.SIGKILL)
                worker.wait(timeout=30)
                kills += 1
                progress.append(len(watcher.backfills.chunk_log()))
            worker = spawn_backfill_worker(path, script, delay=0.0)
            _, err = worker.communicate(timeout=60)
            assert worker.returncode == 0, err[-3000:]
        answers = [_answers(port) for port in ports]  # the backfill done: replicas agree
    finally:
        if worker is not None and worker.poll() is None:  # a failed soak leaves no writer behind
            worker.kill()
            worker.wait(timeout=30)
        for client in clients:
            client.stop.set()
        for client in clients:
            client.join(timeout=30)
        for server in servers:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    seconds = time.monotonic() - began

    latencies = np.concatenate([client.latencies for client in clients])
    statuses: dict[int, int] = {}
    for client in clients:
        for status, count in client.statuses.items():
            statuses[status] = statuses.get(status, 0) + count
    failures = [failure for client in clients for failure in client.failures]
    p50, p99 = (float(np.percentile(latencies, q)) * 1e3 for q in (50, 99))
    print(
        f"\nsoak ({backend.kind} {backend.uri or ''}): {len(latencies)} queries served by "
        f"{CLIENTS} clients of {SERVICES} services (statuses {statuses}), latency p50 "
        f"{p50:.1f} ms, p99 {p99:.1f} ms during the backfill; {kills} SIGKILLs survived, "
        f"{refused} second backfills refused, {len(live)} items ingested and {len(erased)} "
        f"erased meanwhile; chunks committed before each kill {progress}; {seconds:.1f} s in all"
    )
    assert not failures, failures[:5]
    assert statuses == {200: len(latencies)} and len(latencies) > 50
    assert kills == KILLS and 0 < progress[0] < progress[-1], progress
    assert seconds < BUDGET_S
    kept = len(live) - len(erased)
    assert answers[0] == answers[1] and len(answers[0]) == 5
    assert not {hit for row in answers[0] for hit in row} & set(erased)
    with GalleryStore.open(path) as store:
        states, vectors, chunks = final_state(store)
        assert store.status().items_by_space == {NEW.name: items + kept}
        assert store.status().backfill.status == "complete"
        assert not set(erased) & {item.item_id for item in store.items()}
        present = store.vectors.present_slots  # type: ignore[attr-defined]
        held = {item.slot for item in store.items()}
        for spec in store.spaces().values():
            assert set(present(spec).tolist()) <= held  # no erased vector left, in any space
    # the gallery's own items: as in an uninterrupted run, vector for vector, chunk for chunk
    assert states[:items] == expected_states
    np.testing.assert_array_equal(vectors[:items], expected_vectors)
    assert chunks[: len(expected_chunks)] == expected_chunks
    # each kill came before the backfill's last chunk: the items ingested meanwhile are chunks of
    # it too, after the gallery's own, so a kill among them is still a kill mid-backfill
    assert progress[-1] < len(chunks), (progress, len(chunks))
    assert {state[0] for state in states[items:]} == set(live) - set(erased)
    assert {state[1:3] for state in states[items:]} == {(NEW.name, "done")}
    # every item in exactly one committed chunk, every chunk once
    assert sorted(c[0] for c in chunks) == list(range(len(chunks)))
    assert sum(c[2] for c in chunks) == items + kept
