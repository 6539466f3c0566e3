"""The process that writes the spool to MLflow after a stage that spooled its record.

It outlives the stage, which does not wait for it. Importing MLflow and opening the store cost
about 2 s of CPU, so the writer stays for ``LINGER_S`` after the spool empties and writes the
records of the stages that follow (a pipeline's stages end seconds apart): one writer serves a
whole ``dvc repro`` instead of one import per stage competing with the next stage for the CPU.
A writer that finds another one alive leaves its record to it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from modelupgrade.registry.spool import pending_records
from modelupgrade.registry.tracker import Tracker
from modelupgrade.registry.tracking_config import TrackingConfig

log = logging.getLogger(__name__)

_ENTRY = "from modelupgrade.registry.spool_writer import main; main()"
# How long a writer waits for more records once the spool is empty, and how often it looks.
LINGER_S = 20.0
POLL_S = 0.5
# The directory that holds the ``modelupgrade`` package: the writer imports this same copy.
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def ensure_spool_writer(config: TrackingConfig) -> subprocess.Popen[bytes] | None:
    """Start a writer for a record just spooled in ``config``'s spool, unless one is alive (it
    writes the record: a writer looks at the spool again after it leaves). None when one is.

    Starting a writer that only finds another one alive costs a Python process (0.3–0.5 s of CPU)
    per stage of a pipeline whose lingering writer would write the record anyway."""
    if _writer_alive(config):
        return None
    return start_spool_writer(config)


def start_spool_writer(config: TrackingConfig) -> subprocess.Popen[bytes]:
    """Start a writer for ``config``'s spool and return without waiting for it."""
    search_path = [str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, search_path))}
    # The writer talks to the project's store only; MLflow's usage telemetry is not its business.
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    with open(config.spool_dir / "writer.log", "ab") as log_file:
        # A session of its own: a Ctrl-C that stops the pipeline does not cut a write short.
        return subprocess.Popen(
            [sys.executable, "-c", _ENTRY, config.to_json()],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            env=env,
            start_new_session=True,
        )


def main() -> None:
    """Entry point of the writer process (argument: the ``TrackingConfig`` as JSON)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    write_spool(TrackingConfig.from_json(sys.argv[1]))


def write_spool(config: TrackingConfig, linger_s: float = LINGER_S) -> None:
    """Write the spool's records as they come until it has been empty for ``linger_s``; return at
    once if another writer is alive. MLflow is loaded only once there is a record to write."""
    while True:
        with _sole_writer(config) as sole:
            if not sole:
                return
            _write_until_idle(config, linger_s)
        # A record spooled while this writer was leaving: its own writer found this one alive
        # and left it here, so look again now that the presence lock is free.
        if not pending_records(config.spool_dir):
            return


def _write_until_idle(config: TrackingConfig, linger_s: float) -> None:
    tracker: Tracker | None = None
    idle_since = time.monotonic()
    while config.spool_dir.is_dir():
        if pending_records(config.spool_dir):
            if tracker is None:
                tracker = Tracker(config)  # opening a tracker writes what waits in the spool
            else:
                tracker.write_pending_stages()
            log.info("wrote the waiting stage runs to %s", config.tracking_uri)
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= linger_s:
            return
        time.sleep(POLL_S)


def _writer_alive(config: TrackingConfig) -> bool:
    """Whether a writer holds the spool's presence lock. Probing takes the lock for an instant: a
    writer starting in that instant leaves, and the writer the caller then starts writes its
    record too (every record it finds spooled, the caller's spooled before the probe)."""
    with _sole_writer(config) as sole:
        return not sole


@contextlib.contextmanager
def _sole_writer(config: TrackingConfig) -> Iterator[bool]:
    """True while this process is the only writer of ``config``'s spool (a presence lock apart
    from the spool's write lock, which every tracker takes briefly)."""
    presence = FileLock(str(config.spool_dir / ".writer.alive"))
    try:
        presence.acquire(timeout=0)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        presence.release()
