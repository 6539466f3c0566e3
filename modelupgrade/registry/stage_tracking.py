"""``track_stage``: a pipeline stage's work, logged as one child run of its pipeline execution.

The stage fills a ``StageRecord`` while it works; when the work ends the record is written at
once where MLflow is already loaded, and otherwise spooled for a writer process, so a stage never
pays MLflow's import (about 1.5 s) and never waits for the store. Under ``torchrun`` only rank 0
records the stage.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from modelupgrade.config import Params, params_hash
from modelupgrade.registry.execution import execution_key
from modelupgrade.registry.spool import spool_record
from modelupgrade.registry.spool_writer import ensure_spool_writer
from modelupgrade.registry.stage_log import StageRecord
from modelupgrade.registry.tracker import Tracker
from modelupgrade.registry.tracking_config import TrackingConfig

log = logging.getLogger(__name__)


@contextlib.contextmanager
def track_stage(
    stage: str,
    params: Params,
    *,
    run_name: str | None = None,
    arguments: Mapping[str, Any] | None = None,
) -> Iterator[StageRecord]:
    """Log the stage that runs in the block as one child run of its pipeline execution.

    The block fills the record it gets (params sections, headline metrics, report artifacts);
    ``arguments`` (what the stage was asked to do) become params ``args.*``. When the block ends
    the record is written, FAILED (with an ``error`` tag) if the block raised, and the exception
    goes on.
    Tracking writes nothing into the stage's outputs and never fails a stage: a record that cannot
    be written now waits in the spool for the next tracker.
    """
    config = TrackingConfig.from_params(params.registry)
    record = StageRecord(stage, run_name or stage, execution_key(), params_hash=params_hash(params))
    if arguments is not None:
        record.log_params({"args": arguments})
    try:
        yield record
    except BaseException as err:
        record.end("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED", err)
        _write(record, config, params)
        raise
    record.end("FINISHED")
    _write(record, config, params)


def _write(record: StageRecord, config: TrackingConfig, params: Params) -> None:
    """Write now where MLflow is loaded (tens of milliseconds), else spool for a writer process.

    An in-memory store lives inside one process: one this process has not opened (MLflow not
    loaded) can be read by no one, so the record is dropped rather than spend seconds on importing
    MLflow and creating the store's schema (the tests' default store, and stages they spawn).
    """
    if int(os.environ.get("RANK", "0")) != 0:
        return  # under torchrun every process runs the stage; rank 0 alone records it
    if "mlflow" in sys.modules:
        try:
            Tracker(config, params).write_stage(record)
            return
        except Exception as err:  # noqa: BLE001 - the stage's outputs stand; the record waits
            log.warning(
                "could not log stage %s to MLflow now (%s): it waits in %s",
                record.run_name,
                err,
                config.spool_dir,
            )
    elif config.is_in_memory:
        return
    try:
        spool_record(record, config)
        ensure_spool_writer(config)
    except OSError as err:
        log.warning(
            "could not leave stage %s for MLflow in %s: %s", record.run_name, config.spool_dir, err
        )
