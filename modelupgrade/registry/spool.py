"""Stage records that wait on disk until a process with MLflow loaded writes them to the store.

A stage process that has not loaded MLflow (importing it costs about 1.5 s of CPU) leaves its
record here, as JSON with copies of its artifacts, in a folder next to the store's artifacts
(``TrackingConfig.spool_dir``). Every ``Tracker`` writes what waits here when it opens, and a stage
that spools starts a short-lived writer (``modelupgrade.registry.spool_writer``), so that readers
see every ended stage without the stage waiting for MLflow.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from modelupgrade.io import write_text
from modelupgrade.registry.stage_log import StageRecord
from modelupgrade.registry.tracking_config import TrackingConfig, timed_lock

log = logging.getLogger(__name__)


def spool_record(record: StageRecord, config: TrackingConfig) -> Path:
    """Leave ``record`` in the spool with copies of its artifacts (later stages or a re-run may
    change the originals before the record is written); returns the record's file."""
    spool = config.spool_dir
    name = f"{record.started_ms}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    copies = spool / name
    artifacts: list[tuple[str, str | None]] = []
    for index, (path, folder) in enumerate(record.artifacts):
        source = Path(path)
        if source.exists():
            target = copies / str(index) / source.name
            target.parent.mkdir(parents=True)
            (shutil.copytree if source.is_dir() else shutil.copyfile)(source, target)
            path = str(target)
        artifacts.append((path, folder))
    spooled = spool / f"{name}.json"
    write_text(spooled, replace(record, artifacts=artifacts).to_json())
    return spooled


def pending_records(spool: Path) -> list[Path]:
    """The records waiting in ``spool``, oldest first."""
    return sorted(spool.glob("*.json")) if spool.is_dir() else []


def spool_lock(config: TrackingConfig) -> contextlib.AbstractContextManager[Any]:
    """One process at a time writes a spool, so that no record is written twice."""
    return timed_lock(config.spool_dir / ".write.lock", config.lock_timeout_s)


def write_pending(config: TrackingConfig, write: Callable[[StageRecord], Any]) -> int:
    """Hand every waiting record to ``write``, oldest first, and remove it once written; returns
    how many were written. A record that cannot be read is set aside (``.unreadable``)."""
    spool = config.spool_dir
    if not pending_records(spool):
        return 0
    written = 0
    with spool_lock(config):
        while pending := pending_records(spool):
            for path in pending:
                try:
                    record = StageRecord.from_json(path.read_text(encoding="utf-8"))
                except (ValueError, TypeError, KeyError) as err:
                    log.warning("stage record %s is not readable (%s): set aside", path, err)
                    path.rename(path.with_suffix(".unreadable"))
                    continue
                write(record)
                path.unlink()
                shutil.rmtree(path.with_suffix(""), ignore_errors=True)
                written += 1
    return written
