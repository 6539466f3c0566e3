"""Shared fixtures: CPU-forced, single-threaded, deterministic; GPU tests skipped without a GPU."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

# Set before torch is imported anywhere: tests must not touch a GPU by accident or fight over cores.
os.environ.setdefault("MODELUPGRADE_DEVICE", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MLFLOW_TRACKING_URI", "sqlite:///:memory:")
# One Prefect home per pytest-xdist worker: the workers' temporary servers must not share files.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
os.environ.setdefault(
    "PREFECT_HOME",
    os.path.join(os.environ.get("TMPDIR", "/tmp"), f"modelupgrade-prefect-tests-{_WORKER}"),
)

from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from modelupgrade.store import BackendSettings
    from tests.milvus_server import MilvusServer

torch.set_num_threads(1)


# The longest tests, scheduled first: `make test` runs the files on three workers (pytest-xdist,
# --dist loadfile in file order), so the other workers run the rest of the suite beside them.
LONGEST_FIRST = ("test_pipeline_dag.py", "test_flows.py", "test_adopt_registry.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _no_stale_log_handler() -> Iterator[None]:
    """A command run in-process (``run_command`` calls ``setup_logging``) binds the root log
    handler to this test's captured stderr, which is closed after the test; a later test's logs
    from outside a command (a Milvus Lite engine's threads log on their own) would then print
    "--- Logging error ---" into that test's stderr. Drop the handlers a test added."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if handler not in before and type(handler) is logging.StreamHandler:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    from modelupgrade.runtime import seed_everything

    seed_everything(0)


@pytest.fixture
def cpu_device() -> torch.device:
    return torch.device("cpu")


@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusServer]:
    """The session's Milvus 2.3.5 standalone server on loopback (``tests/milvus_server``), shared
    by pytest-xdist workers and stopped when the session ends."""
    from tests.milvus_server import start_or_join, stop

    pytest.importorskip("pymilvus")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    shared = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    server = start_or_join(shared, os.getppid() if worker else os.getpid())
    yield server
    if not worker:
        stop(server)


@pytest.fixture(params=["embedded", "milvus", "milvus-server"])
def backend(request: pytest.FixtureRequest) -> Iterator[BackendSettings]:
    """Each vector backend of the gallery store in turn (a test taking it runs once per backend):
    the embedded files, Milvus Lite in a file inside the store, and the session's Milvus
    standalone server (``milvus_server``; the test's collections dropped after it). Skipped for
    Milvus where pymilvus or milvus-lite is not installed (both are optional extras)."""
    from modelupgrade.store import BackendSettings

    if request.param == "milvus-server":
        from tests.milvus_server import PREFIX_ENV, drop_collections

        server = request.getfixturevalue("milvus_server")
        monkeypatch = request.getfixturevalue("monkeypatch")
        prefix = f"t{os.getpid()}_{abs(hash(request.node.nodeid)) % 10**8}_"
        monkeypatch.setenv("MILVUS_TOKEN", server.token)
        monkeypatch.setenv(PREFIX_ENV, prefix)
        yield BackendSettings(kind="milvus", uri=server.uri)
        drop_collections(server, prefix)
        return
    if request.param == "milvus":
        pytest.importorskip("pymilvus")
        pytest.importorskip("milvus_lite")
    yield BackendSettings(kind=request.param)
