"""A Milvus 2.3.5 standalone server for the store's tests: started once per test session on
loopback (``tests/milvus_server_launcher.py``, in the server's own environment ``.venv-milvus``,
which ``make milvus-server`` installs), shared by every process of the session (pytest-xdist
workers too: the first starts it, the others join it through a file in the session's shared
temporary directory), and stopped when the session ends.

Authentication is on, with a root password drawn per session: the tests' processes get it as
``MILVUS_TOKEN``. Each test's stores name their collections under a prefix of its own
(``MODELUPGRADE_MILVUS_PREFIX``), and the test's collections are dropped when it ends.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from modelupgrade.store.lock import pid_alive

ROOT = Path(__file__).resolve().parents[1]
SERVER_ENV = ROOT / ".venv-milvus"
LAUNCHER = ROOT / "tests" / "milvus_server_launcher.py"
START_TIMEOUT_S = 240.0
PREFIX_ENV = "MODELUPGRADE_MILVUS_PREFIX"


@dataclass(frozen=True)
class MilvusServer:
    uri: str
    token: str
    launcher_pid: int


def server_python() -> Path:
    """The server environment's Python; a session without it fails (CI) or skips its server tests
    (a developer's run without ``make milvus-server``)."""
    python = SERVER_ENV / "bin" / "python"
    if not python.exists():
        message = (
            f"no Milvus server environment at {SERVER_ENV}: `make milvus-server` installs it "
            "(make test does)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


def start_or_join(shared: Path, watch_pid: int) -> MilvusServer:
    """The session's server: joined when another process of the session started it, else
    started here (stopped once ``watch_pid`` exits)."""
    shared.mkdir(parents=True, exist_ok=True)
    with open(shared / "milvus-server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = shared / "milvus-server.json"
        if state.exists():
            found = MilvusServer(**json.loads(state.read_text()))
            if pid_alive(found.launcher_pid):
                return found
        server = _start(shared, watch_pid)
        state.write_text(json.dumps(vars(server)))
        return server


def _start(shared: Path, watch_pid: int) -> MilvusServer:
    ready = shared / "milvus-server.ready"
    ready.unlink(missing_ok=True)
    log = open(shared / "milvus-server.log", "w")  # noqa: SIM115 - the launcher writes it
    launcher = subprocess.Popen(
        [
            str(server_python()),
            str(LAUNCHER),
            *("--cache", str(SERVER_ENV / "server")),
            *("--data", str(shared / "milvus-server-data")),
            *("--ready", str(ready)),
            *("--watch-pid", str(watch_pid)),
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,  # a test's SIGINT to its group must not stop the session's server
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            raise RuntimeError(
                "the Milvus server did not start: "
                + (shared / "milvus-server.log").read_text()[-2000:]
            )
        time.sleep(0.2)
    port = json.loads(ready.read_text())["port"]
    uri = f"http://127.0.0.1:{port}"
    token = f"root:{secrets.token_hex(12)}"
    _set_root_password(uri, token.partition(":")[2])
    return MilvusServer(uri, token, launcher.pid)


def _set_root_password(uri: str, password: str) -> None:
    from pymilvus import MilvusClient

    client = MilvusClient(uri=uri, token="root:Milvus")
    client.update_password("root", "Milvus", password)
    client.close()


def stop(server: MilvusServer) -> None:
    """Stop the server now (the launcher removes its data), waiting for it a few seconds."""
    if not pid_alive(server.launcher_pid):
        return
    os.kill(server.launcher_pid, 15)
    deadline = time.monotonic() + 30
    while pid_alive(server.launcher_pid) and time.monotonic() < deadline:
        try:
            os.waitpid(server.launcher_pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)


def drop_collections(server: MilvusServer, prefix: str) -> None:
    """Drop the aliases and collections a test made under ``prefix``."""
    from pymilvus import MilvusClient

    client = MilvusClient(uri=server.uri, token=server.token)
    try:
        for alias in client.list_aliases().get("aliases", []):
            if alias.startswith(prefix):
                client.drop_alias(alias)
        for name in client.list_collections():
            if name.startswith(prefix):
                client.drop_collection(name)
    finally:
        client.close()
