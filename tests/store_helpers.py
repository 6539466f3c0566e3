"""Fixtures shared by the store tests: a small synthetic gallery and a deterministic ψ."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from modelupgrade.store import (
    BackendSettings,
    BackfillJob,
    GalleryStore,
    HeadTransforms,
    ItemSources,
    Searcher,
    SpaceSpec,
    TransformStored,
    start_or_resume,
)

OLD = SpaceSpec("gen0", 16)
NEW = SpaceSpec("gen1", 12, upgrades_from=("gen0",), backward_compatible=False)
# A backward-compatible pair: the new space's vectors may be searched beside the old ones.
COMPATIBLE_OLD = SpaceSpec("gen0", 8)
COMPATIBLE_NEW = SpaceSpec("gen1", 8, upgrades_from=("gen0",), backward_compatible=True)
PROJECT_PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def psi_matrix() -> np.ndarray:
    return np.random.default_rng(7).normal(size=(OLD.dim, NEW.dim)).astype(np.float32)


def psi(vectors: np.ndarray) -> np.ndarray:
    """A deterministic forward map old → new (what a BiCT head does to stored vectors)."""
    return np.tanh(vectors @ psi_matrix())


def reverse(queries: np.ndarray) -> np.ndarray:
    """A deterministic reverse map new → old, for rank-merge-rqt serving."""
    return queries @ psi_matrix().T


def psi_searchers(store: GalleryStore) -> list[Searcher]:
    """Searchers of ``store`` in the two serving modes that use the ψ heads: rank-merge-rqt (the
    ``reverse`` map) and mixed (the forward ``psi``)."""
    from modelupgrade.serving import build_serving_mode

    return [
        Searcher(
            store, build_serving_mode("rank-merge-rqt"), heads=HeadTransforms(reverse=reverse)
        ),
        Searcher(store, build_serving_mode("mixed"), heads=HeadTransforms(forward=psi)),
    ]


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


def image_gallery(
    path: Path, n: int, seed: int = 0, backend: BackendSettings | None = None
) -> GalleryStore:
    """``build_gallery`` of items img0 … whose images are the files i.png (``write_images``)."""
    sources = ItemSources([f"{i}.png" for i in range(n)])
    return build_gallery(path, n, seed, item_id="img{}", sources=sources, backend=backend)


def backend_params(directory: Path, backend: BackendSettings) -> Path:
    """The project's params.yaml with ``store.backend`` set to ``backend``'s kind, written in
    ``directory``: the commands that create a store take its backend from there."""
    import yaml

    settings = yaml.safe_load(PROJECT_PARAMS.read_text())
    settings["store"] = {**settings.get("store", {}), "backend": backend.kind, "uri": backend.uri}
    path = directory / f"params-{backend.kind}{'-server' if backend.uri else ''}.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def ingest_skipping_an_image(directory: Path, backend: BackendSettings) -> list[str]:
    """The ``store-ingest`` command line (no ``--json``) of six 16×16 images it4 of which is
    missing, embedded by an untrained gen0 model into a new store ``directory``/s on ``backend``
    (params, images, items table and model written in ``directory``): it skips it4 and exits 1."""
    import pandas as pd
    import yaml

    from modelupgrade.models import save_model
    from tests.model_fixtures import tiny_model

    images = write_images(directory / "images", 6, 16)
    (images / "4.png").unlink()
    settings = yaml.safe_load(backend_params(directory, backend).read_text())
    settings["dataset"].update(loader="imagefolder", root=str(images), image_size=16)
    params = directory / "params.yaml"
    params.write_text(yaml.safe_dump(settings))
    pd.DataFrame(
        {"item_id": [f"it{i}" for i in range(6)], "path": [f"{i}.png" for i in range(6)]}
    ).to_parquet(directory / "items.parquet")
    model = directory / "gen0"
    save_model(tiny_model(OLD.dim).eval(), model, {"generation": 0})
    return [
        *("--params", str(params), "--store", str(directory / "s"), "--model", str(model)),
        *("--items", str(directory / "items.parquet"), "--score"),
    ]


def milvus_lite(backend: BackendSettings) -> bool:
    """Whether ``backend`` is Milvus Lite (a file one process at a time), not a Milvus server."""
    from modelupgrade.store.backends.milvus import is_server_uri

    return backend.kind == "milvus" and not is_server_uri(backend.uri)


def stored_spaces(store: GalleryStore) -> set[str]:
    """The spaces whose vectors the store's backend holds, as the backend itself lists them (its
    vector files; its Milvus collections), whether or not the store's tables name them: what a
    refused or undone write must not leave behind. A space the tables do not name shows as its
    storage name (its file stem, its collection's suffix)."""
    names = {spec.storage: name for name, spec in store.spaces().items()}
    return {names.get(storage, storage) for storage in store.vectors.stored()}


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


@contextmanager
def milvus_lite_held(store: Path) -> Iterator[None]:
    """Another process holds the Milvus Lite file of the store at ``store`` until the block ends,
    as a running backfill or service does: Milvus Lite serves one process at a time. The holder
    is bare pymilvus (no modelupgrade, no torch), so that it starts fast."""
    from modelupgrade.store.backends.milvus_client import LITE_FILE
    from modelupgrade.store.schema import VECTORS_DIR

    hold = (
        "import sys\n"
        "from pymilvus import MilvusClient\n"
        "MilvusClient(uri=sys.argv[1]).list_collections()\n"
        "print('holding', flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(store / VECTORS_DIR / LITE_FILE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        yield
    finally:
        holder.kill()  # the kernel drops its lock on the file when it dies
        holder.wait(timeout=30)


PROJECT_ROOT = Path(__file__).resolve().parents[1]


def python_child(*args: str) -> subprocess.Popen[str]:
    """``python ARGS`` in a child process that imports this project, its output piped."""
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def spawn_backfill_worker(
    store: Path, script: Path, delay: float, hold: Path | None = None
) -> subprocess.Popen[str]:
    """``script STORE DELAY [HOLD]`` in a child process of this project (to be SIGKILLed
    mid-backfill). While the file ``hold`` exists, the worker waits inside ψ: a test that must act
    while the backfill is surely still running (its lease held, chunks left) pauses it there."""
    return python_child(str(script), str(store), str(delay), *([str(hold)] if hold else []))


def wait_for_chunks(
    watcher: GalleryStore, worker: subprocess.Popen[str], chunks: int, within_s: float = 120.0
) -> None:
    """Wait until the backfill ``worker``, still running, has committed ``chunks`` chunks in all to
    the store ``watcher`` has open; fail, saying which, if it ends first or ``within_s`` passes.
    Generous by default: a worker's start (torch, the store) takes seconds on a quiet machine and
    several times that beside the rest of the suite, and a test that went on before the worker got
    going would test something else (a second backfill would run, not be refused)."""
    deadline = time.monotonic() + within_s
    while len(watcher.backfills.chunk_log()) < chunks:
        if worker.poll() is not None:
            pytest.fail(f"the backfill worker ended before {chunks} chunks: {worker.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"the backfill worker did not commit {chunks} chunks in {within_s:.0f} s")
        time.sleep(0.01)


# ``SCRIPT STORE DELAY [HOLD]``: backfill STORE into NEW in chunks of {chunk} with a ψ that sleeps
# DELAY s per chunk (and waits while the file HOLD exists), to be queried and killed part-way;
# {job_options} go to the job, {then} ends the script.
_SLOW_BACKFILL = """\
import os, sys, time
from modelupgrade.ordering import build_ordering
from modelupgrade.store import BackfillJob, GalleryStore, TransformStored
from tests.store_helpers import NEW, psi

def slow_psi(vectors):
    time.sleep(float(sys.argv[2]))
    while len(sys.argv) > 3 and os.path.exists(sys.argv[3]):
        time.sleep(0.005)
    return psi(vectors)

with GalleryStore.open(sys.argv[1]) as store:
    report = BackfillJob(
        store, NEW, TransformStored(slow_psi), build_ordering("old-confidence"), {chunk},
        progress=False,{job_options}
    ).run()
{then}
"""
PRINT_REPORT = "print(report.status, report.chunks_committed, flush=True)"


def slow_backfill_script(chunk: int, job_options: str = "", then: str = PRINT_REPORT) -> str:
    """The source of a backfill worker for ``spawn_backfill_worker`` (see ``_SLOW_BACKFILL``)."""
    options = f" {job_options}," if job_options else ""
    return _SLOW_BACKFILL.format(chunk=chunk, job_options=options, then=then)


def plan_psi_backfill(store: GalleryStore, chunk: int) -> None:
    """Plan, without running it, the backfill into ``NEW`` by ψ in old-confidence order in chunks
    of ``chunk`` that a ``slow_backfill_script`` worker runs and resumes: the store serves the new
    space from then on, before the first chunk is written."""
    from modelupgrade.ordering import build_ordering

    start_or_resume(store, NEW, "transform", build_ordering("old-confidence"), chunk)


def kill_after_a_commit(
    watcher: GalleryStore,
    script: Path,
    delay: float,
    rng: np.random.Generator,
    wait: float,
    jitter: float,
) -> bool:
    """Run the backfill worker ``script`` with ``delay`` on the store ``watcher`` has open
    (``spawn_backfill_worker``) and SIGKILL it only after this run has committed a chunk (waited
    for ``wait`` s at most), at a random moment up to ``jitter`` s after that: inside ψ, between the
    vector write and the commit, or inside the transaction. Whether it was still running to kill."""
    before = len(watcher.backfills.chunk_log())
    process = spawn_backfill_worker(watcher.path, script, delay)
    deadline = time.monotonic() + wait
    while (
        process.poll() is None
        and len(watcher.backfills.chunk_log()) == before
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    time.sleep(float(rng.uniform(0.0, jitter)))
    killed = process.poll() is None
    if killed:
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    return killed


def final_state(store: GalleryStore) -> tuple[list, np.ndarray, list]:
    """What a finished backfill into ``NEW`` left: item states, NEW's vectors, the chunk log."""
    items = store.backfills.item_states()  # slot order
    states = [(s["item_id"], s["space"], s["state"], s["committed_chunk"]) for s in items]
    vectors = store.read_vectors(NEW.name, np.array([s["slot"] for s in items], dtype=np.int64))
    chunks = [
        (c["chunk"], c["items"], c["written"], c["failed"], c["vectors_sha256"])
        for c in store.backfills.chunk_log()
    ]
    return states, vectors, chunks


def exit_code_and_output(
    capsys: pytest.CaptureFixture[str], command_line: Callable[[], object]
) -> tuple[int, str, str]:
    """Run ``command_line`` (one that exits through SystemExit on errors): its exit code, stdout
    and stderr."""
    try:
        command_line()
        code = 0
    except SystemExit as stop:
        code = int(stop.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def command_output(
    capsys: pytest.CaptureFixture[str], function: Callable[..., object], *argv: str
) -> tuple[int, str, str]:
    """``exit_code_and_output`` of ``function``'s command line with the project's params file."""
    from modelupgrade.cli.arguments import run_command

    return exit_code_and_output(
        capsys, lambda: run_command(function, ["--params", str(PROJECT_PARAMS), *argv])
    )
