"""The MLflow UI, for real: `mlflow ui` over a seeded store, driven by headless Chromium.

Checks that the registered model's page shows every version, the lineage tags and the
``champion``/``candidate`` aliases, and saves a screenshot to ``reports/mlflow_ui.png``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.registry_support import fresh_tracker, make_template, seed_study

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT = ROOT / "reports" / "mlflow_ui.png"
MODEL = "toy-retrieval"
SERVER_START_TIMEOUT_S = 240


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


CHROMIUM = _chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium executable found: install Debian's chromium and chromium-driver "
    "(apt-get install -y chromium chromium-driver)",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    root = tmp_path_factory.mktemp("mlflow-ui")
    tracker = fresh_tracker(make_template(root), root / "store", experiment="ui")
    registry, _, _ = seed_study(tracker, MODEL, root / "models")
    port = _free_port()
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    # The same command `make ui` runs, on the seeded database and a free port.
    command = [
        str(mlflow_cli),
        "ui",
        "--backend-store-uri",
        tracker.config.tracking_uri,
        "--artifacts-destination",
        str(root / "store" / "mlartifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    log = open(root / "server.log", "w")  # noqa: SIM115 - closed in teardown
    server = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                pytest.fail(
                    f"mlflow ui exited with {server.returncode}: "
                    f"{(root / 'server.log').read_text()}"
                )
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow ui did not answer within {SERVER_START_TIMEOUT_S} s")
            time.sleep(1)
        yield url, registry
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


def _chromium_run(
    tmp_path: Path, url: str, *mode: str, window: str = "1600,2600"
) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{mode[0].lstrip('-').split('=')[0]}"
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={window}",
            "--virtual-time-budget=30000",
            *mode,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _visible_text(html: str) -> str:
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.DOTALL)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&nbsp;", " ")


def test_registered_model_page_shows_versions_lineage_and_aliases(
    ui_server, tmp_path: Path
) -> None:
    url, registry = ui_server
    page = f"{url}/#/models/{MODEL}"
    dom = _chromium_run(tmp_path, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = _visible_text(dom.stdout)
    assert MODEL in text

    versions = registry.versions()
    for v in versions:
        assert f"Version {v.version}" in text
        assert f"model_key : {v.model_key}" in text
    bct = registry.by_key("gen1-bct")
    gen0 = registry.by_key("gen0")
    assert f"parent_version : {gen0.version}" in text
    assert "strategy : bct" in text and "strategy : dmu" in text
    assert f"compatible_with : {gen0.version}" in text
    assert "gates.passed : true" in text and "gates.passed : first-generation" in text
    # Aliases sit in the row of their version: champion on gen0, candidate on gen1-bct.
    rows = {
        m.group(1): m.group(2) for m in re.finditer(r"Version (\d+) (.*?)(?=Version \d+ |$)", text)
    }
    assert "@ champion" in rows[str(gen0.version)]
    assert "@ candidate" in rows[str(bct.version)]
    assert "@ champion" not in rows[str(bct.version)]

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shot = _chromium_run(tmp_path, page, f"--screenshot={SCREENSHOT}")
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert SCREENSHOT.is_file() and SCREENSHOT.stat().st_size > 50_000
