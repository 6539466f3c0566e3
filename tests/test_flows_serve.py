"""``python -m flows.serve`` against a real ``prefect server start`` on 127.0.0.1.

The test starts the server and the serving process, reads the deployments and their schedules back
through the Prefect REST API, and stops both (their whole process groups) when it ends, whatever
happened. Every wait has a deadline and the test a hard time limit. Nothing leaves the loopback
interface: the server's usage statistics are off and its UI is not served.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.test_flows import require_prefect_server, tiny_params

pytestmark = pytest.mark.timeout(180, method="thread")

ROOT = Path(__file__).resolve().parents[1]
# Cron schedules that cannot come due while the test runs (29 February 2028 is the next match).
UPGRADE_CRON = "5 4 29 2 *"
BACKFILL_CRON = "10 4 29 2 *"


def free_loopback_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """A child process in its own process group, stopped with everything it started on exit."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield process
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def wait_for(check: Callable[[], Any], seconds: float, what: str, log: Path) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            found = check()
            if found:
                return found
        time.sleep(0.5)
    raise AssertionError(
        f"no {what} within {seconds:.0f} s; log:\n{log.read_text(errors='replace')[-4000:]}"
    )


def test_served_deployments_and_schedules_read_back_from_a_local_server(tmp_path: Path) -> None:
    require_prefect_server()
    port = free_loopback_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    env.pop("PREFECT_API_URL", None)
    params = tiny_params(
        tmp_path / "idx", tmp_path / "work", upgrade_cron=UPGRADE_CRON, backfill_cron=BACKFILL_CRON
    )
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump(params))
    server_log, serve_log = tmp_path / "server.log", tmp_path / "serve.log"

    server_args = [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with (
        running(server_args, env, server_log) as server,
        httpx.Client(base_url=api, timeout=10) as client,
    ):
        wait_for(lambda: client.get("/health").status_code == 200, 90, "healthy server", server_log)
        from prefect.workers.process import ProcessWorker

        created = client.post(
            "/work_pools/",
            json={
                "name": "gpu-test",
                "type": "process",
                "base_job_template": ProcessWorker.get_default_base_job_template(),
            },
        )
        assert created.status_code == 201, created.text

        serve_args = [
            sys.executable,
            "-m",
            "flows.serve",
            "--params",
            str(params_path),
            "--training-pool",
            "gpu-test",
        ]
        with running(serve_args, {**env, "PREFECT_API_URL": api}, serve_log) as serving:

            def deployment(name: str) -> dict[str, Any] | None:
                response = client.get(f"/deployments/name/{name}")
                return response.json() if response.status_code == 200 else None

            upgrade = wait_for(
                lambda: deployment("upgrade/scheduled"), 60, "upgrade deployment", serve_log
            )
            backfill = wait_for(
                lambda: deployment("backfill/champion-watch"), 30, "backfill deployment", serve_log
            )
            training = deployment("train-generation/gpu")
            assert serving.poll() is None and server.poll() is None

    assert [s["schedule"]["cron"] for s in upgrade["schedules"]] == [UPGRADE_CRON]
    assert [s["schedule"]["cron"] for s in backfill["schedules"]] == [BACKFILL_CRON]
    assert all(s["active"] for s in upgrade["schedules"] + backfill["schedules"])
    assert upgrade["parameters"] == {
        "params_path": str(params_path),
        "work_dir": str(tmp_path / "work"),
        "training_deployment": "train-generation/gpu",
    }
    assert backfill["parameters"] == {
        "params_path": str(params_path),
        "work_dir": str(tmp_path / "work"),
    }
    assert (
        upgrade["global_concurrency_limit"]["limit"]
        == 1
        == backfill["global_concurrency_limit"]["limit"]
    )
    assert training["work_pool_name"] == "gpu-test"
    assert training["entrypoint"] == "flows.training.train_generation"
    assert training["job_variables"] == {"working_dir": str(ROOT)}
