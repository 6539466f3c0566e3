"""Soak (issue 20, "Done when"): a backfill runs while clients query the HTTP service; a second
writer is refused; the backfill is SIGKILLed and resumed twice. Every query must be answered (no
5xx, no dropped connection), every item must end in the target space exactly once, and the store
must equal an uninterrupted run vector for vector and chunk for chunk. Loopback only, bounded in
time; it prints what it measured (queries served, p99 latency during the backfill, kills survived).

It runs on the embedded backend and is skipped on Milvus Lite, which serves one process at a time:
the service and the backfill cannot both open its file. (A Milvus server serves both; the
conformance suite queries a Milvus Lite store while a backfill writes, in one process.)
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
)

ROOT = Path(__file__).resolve().parents[1]
N_ITEMS, CHUNK, CLIENTS, KILLS = 3000, 64, 3, 2
# The soak's own limit: it must end well within it, or it fails rather than run on.
BUDGET_S = 110.0

WORKER = slow_backfill_script(CHUNK, then="raise SystemExit(report.exit_code)")


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


def test_backfill_under_queries_kills_and_a_second_writer(
    tmp_path: Path, backend: BackendSettings
) -> None:
    if milvus_lite(backend):
        pytest.skip(
            "Milvus Lite serves one process at a time: the HTTP service cannot open the store's "
            "Milvus Lite file while a backfill process holds it (a Milvus server can)"
        )
    began = time.monotonic()
    with build_gallery(tmp_path / "reference", N_ITEMS, backend=backend) as reference:
        assert psi_job(reference, chunk=CHUNK, seed=0).run().status == "complete"
        expected_states, expected_vectors, expected_chunks = final_state(reference)

    path = tmp_path / "store"
    with build_gallery(path, N_ITEMS, backend=backend) as store:
        # Planned before the clients start: they query the new serving space from the first.
        plan_psi_backfill(store, CHUNK)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = _free_port()
    server = _serve(path, port, tmp_path / "serve.log")
    clients = [_Client(port, seed) for seed in range(CLIENTS)]
    kills, refused, progress = 0, 0, []
    rng = np.random.default_rng(2024)
    try:
        for client in clients:
            client.start()
        with GalleryStore.open(path) as watcher:
            for _ in range(KILLS):
                before = len(watcher.backfills.chunk_log())
                worker = spawn_backfill_worker(path, script, delay=0.02)
                deadline = time.monotonic() + 30
                while (
                    len(watcher.backfills.chunk_log()) < before + 3
                    and worker.poll() is None
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.01)
                # A second writer meets the lock, whatever it wants to do.
                with pytest.raises(UserError, match=f"being written by pid {worker.pid} "):
                    psi_job(watcher, chunk=CHUNK, seed=0).run()
                refused += 1
                # Killed at a random moment: inside ψ, between the vector write and the commit, or
                # inside the transaction.
                time.sleep(float(rng.uniform(0.0, 0.1)))
                assert worker.poll() is None, worker.communicate()
                worker.send_signal(signal.SIGKILL)
                worker.wait(timeout=30)
                kills += 1
                progress.append(len(watcher.backfills.chunk_log()))
            worker = spawn_backfill_worker(path, script, delay=0.0)
            _, err = worker.communicate(timeout=60)
            assert worker.returncode == 0, err[-3000:]
    finally:
        for client in clients:
            client.stop.set()
        for client in clients:
            client.join(timeout=30)
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
        f"\nsoak: {len(latencies)} queries served by {CLIENTS} clients (statuses {statuses}), "
        f"latency p50 {p50:.1f} ms, p99 {p99:.1f} ms during the backfill; {kills} SIGKILLs "
        f"survived, {refused} second writers refused; chunks committed before each kill "
        f"{progress}; {seconds:.1f} s in all"
    )
    assert not failures, failures[:5]
    assert statuses == {200: len(latencies)} and len(latencies) > 50
    assert kills == KILLS and 0 < progress[0] < progress[-1] < len(expected_chunks), progress
    assert seconds < BUDGET_S
    with GalleryStore.open(path) as store:
        states, vectors, chunks = final_state(store)
        assert store.status().items_by_space == {NEW.name: N_ITEMS}
        assert store.status().backfill.status == "complete"
    assert states == expected_states
    np.testing.assert_array_equal(vectors, expected_vectors)
    # every item in exactly one committed chunk, every chunk once, its checksum as uninterrupted
    assert chunks == expected_chunks
    assert sorted(c[0] for c in chunks) == list(range(len(chunks)))
    assert sum(c[1] for c in chunks) == N_ITEMS
