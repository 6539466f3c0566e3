"""The short-lived process that writes the spool to MLflow after a stage that spooled its record.

It outlives the stage, which does not wait for it, and ends when the spool is empty.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from modelupgrade.registry.spool import pending_records, spool_lock
from modelupgrade.registry.tracker import Tracker
from modelupgrade.registry.tracking_config import TrackingConfig

log = logging.getLogger(__name__)

_ENTRY = "from modelupgrade.registry.spool_writer import main; main()"
# The directory that holds the ``modelupgrade`` package: the writer imports this same copy.
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


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
    """Entry point of the writer process (argument: the ``TrackingConfig`` as JSON).

    It takes the spool's lock before it loads MLflow: a writer that finds the spool emptied by the
    one before it ends without paying for the import.
    """
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = TrackingConfig.from_json(sys.argv[1])
    with spool_lock(config):
        if pending_records(config.spool_dir):
            Tracker(config)  # opening a tracker writes what waits in the spool
            log.info("wrote the waiting stage runs to %s", config.tracking_uri)
