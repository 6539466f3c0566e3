"""What the store commands print: text a person reads by default, the record as JSON under
``--json`` (issue 31 item 8). Embedded backend only: the text is the records', not a backend's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from modelupgrade.cli.arguments import run_command
from modelupgrade.commands.store import (
    backfill,
    cleanup,
    rollback,
    store_erase,
    store_ingest,
    store_status,
    store_update,
)
from modelupgrade.registry.gates import GateCheck
from modelupgrade.store import BackendSettings, BackfillReport, GalleryStore
from modelupgrade.store.cutover import cutover
from modelupgrade.store.schema import ItemFailure
from modelupgrade.store.shadow import ShadowEvaluation
from tests.store_helpers import (
    NEW,
    OLD,
    build_gallery,
    command_output,
    exit_code_and_output,
    ingest_skipping_an_image,
    psi,
    psi_job,
)

IDS = [f"item-{i:05d}" for i in range(40)]
# 12 items the vector table lacks: more than a text names one by one (10)
MISSING = set(range(0, 40, 4)) | {1, 2}


def _text(out: str) -> str:
    """``out``, which must not be JSON: a person reads it."""
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    return out


def _table(tmp_path: Path, vectors: np.ndarray, missing: set[int]) -> list[str]:
    """The backfill command's options for a vector table of ``vectors`` without rows ``missing``."""
    kept = [n for n in range(len(IDS)) if n not in missing]
    pd.DataFrame({"item_id": [IDS[n] for n in kept]}).to_parquet(tmp_path / "new.parquet")
    np.save(tmp_path / "new.npy", vectors[kept])
    return [
        *("--vectors", str(tmp_path / "new.npy"), "--items", str(tmp_path / "new.parquet")),
        *("--space", NEW.name, "--chunk-size", "8", "--no-progress"),
    ]


def test_backfill_status_and_abort_print_text_and_json_under_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s"
    with build_gallery(path, len(IDS)) as store:
        vectors = psi(store.read_vectors(OLD.name, np.arange(len(IDS))))
    store_option = ("--store", str(path))
    code, out, err = command_output(
        capsys, backfill, *store_option, *_table(tmp_path, vectors, MISSING)
    )
    assert code == 1, err
    lines = _text(out).splitlines()
    assert lines[0] == f"backfill 1: {OLD.name} → {NEW.name} in {path}: incomplete"
    assert "  items moved:       28" in lines and "  items failed:      12" in lines
    failed = "    item-00004  the vector table has no row for item item-00004"
    assert failed in lines and "    and 2 more (--json lists them all)" in lines
    assert sum(line.startswith("    item-") for line in lines) == 10
    assert "1 (not complete: 12 item(s) failed and are still served from gen0)" in out
    assert (
        "--retry-failed" in lines[-1] and f"`modelupgrade backfill --store {path} --abort`" in out
    )

    code, out, err = command_output(capsys, store_status, *store_option)
    assert code == 0, err
    lines = _text(out).splitlines()
    assert lines[0] == f"store {path}: 40 items, serving {NEW.name}"
    assert "  space gen0:        16-d, 12 items" in lines
    assert any(
        line.startswith("  space gen1:        12-d, 28 items; upgrades gen0") for line in lines
    )
    assert "  items by state:    done 28, failed 12" in lines
    assert "gen0 → gen1, running: 28 of 40 done (70.0%), 12 failed, 0 pending" in out
    assert "  failed items:      12, still served from gen0:" in lines and failed in lines
    assert "--retry-failed" in out and "--abort" in out
    code, out, err = command_output(capsys, store_status, *store_option, "--json")
    status = json.loads(out)
    assert status["backfill"]["failed"] == 12 and len(status["failed"]) == 12

    code, out, err = command_output(capsys, backfill, *store_option, "--abort")
    assert code == 0, err
    lines = _text(out).splitlines()
    assert lines[0] == "backfill 1 (gen0 → gen1) aborted: serving gen0"
    assert "  items moved back:  28 of the 40 planned, into gen0" in lines
    assert "  space gen1:        dropped, its vectors discarded" in lines

    code, out, err = command_output(
        capsys, backfill, *store_option, *_table(tmp_path, vectors, set()), "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert (report["status"], report["items_written"], report["exit_code"]) == ("complete", 40, 0)


def test_a_report_says_what_each_ending_means_and_what_to_run_next() -> None:
    def report(status: str) -> str:
        return BackfillReport(2, NEW.name, status, 3, 30, 0, 1.5, store="s", source_space="gen0")

    assert "  exit code:         0 (complete: every planned item" in report("complete").describe()
    assert "\n  next:" not in report("complete").describe()
    for status in ("stopped", "paused"):
        text = report(status).describe()
        assert "nothing is lost" in text and "run the same backfill command again" in text
    assert "  time:              1.50 s (20.0 items/s)" in report("paused").describe()
    failed = report("incomplete")
    failed.failed = [ItemFailure("a", "unreadable")]
    assert "    a  unreadable" in failed.describe().splitlines()


def test_ingest_prints_the_store_and_the_items_it_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ingest_skipping_an_image(tmp_path, BackendSettings(kind="embedded"))
    code, out, err = exit_code_and_output(capsys, lambda: run_command(store_ingest, argv))
    assert code == 1, err
    lines = _text(out).splitlines()
    assert lines[0] == f"store {tmp_path / 's'}: 5 items, serving gen0"
    assert any(line.startswith("  space gen0:        16-d, 5 items; model ") for line in lines)
    assert "  skipped:           1 item(s), not in the store:" in lines
    assert any(line.startswith("    it4  ") for line in lines)
    assert "listed on stdout (--json: under 'skipped')" in err


def test_erase_and_update_print_text_and_json_under_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s"
    build_gallery(path, 10).close()
    store_option = ("--store", str(path))
    erased = ("--item-id", "item-00003", "nobody", "--reason", "GDPR request 17")
    code, out, err = command_output(capsys, store_erase, *store_option, *erased)
    assert code == 0, err
    lines = _text(out).splitlines()
    assert lines[0].startswith("erasure 1 recorded at ") and lines[0].endswith(": GDPR request 17")
    assert "  items erased:      1 (their ids are not recorded)" in lines
    assert "  ids not found:     1 (never ingested, or erased already)" in lines
    assert "item-00003" not in out
    erased = ("--item-id", "item-00004", "--reason", "again")
    code, out, err = command_output(capsys, store_erase, *store_option, *erased, "--json")
    assert (json.loads(out)["erasure_id"], json.loads(out)["items_erased"]) == (2, 1)

    np.save(tmp_path / "new.npy", np.ones((1, OLD.dim), np.float32))
    pd.DataFrame({"item_id": ["item-00005"], "path": ["5b.png"], "index": -1}).to_parquet(
        tmp_path / "changed.parquet"
    )
    updated = (
        *("--items", str(tmp_path / "changed.parquet")),
        *("--vectors", f"{OLD.name}={tmp_path / 'new.npy'}"),
    )
    code, out, err = command_output(capsys, store_update, *store_option, *updated)
    assert code == 0, err
    assert _text(out).splitlines() == [
        "1 item(s) updated",
        "  new vectors in:    gen0",
        "  requeued:          0 into the running backfill",
    ]
    code, out, err = command_output(capsys, store_update, *store_option, *updated, "--json")
    assert json.loads(out) == {"items_updated": 1, "spaces": [OLD.name], "requeued": 0}


def test_rollback_and_cleanup_print_the_step_as_text_and_json_under_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s"
    with build_gallery(path, 20) as store:
        assert psi_job(store, chunk=8).run().status == "complete"
        passed = ShadowEvaluation("mAP", NEW.name, OLD.name, 5, 20, {"mAP": 0.8}, {"mAP": 0.6}, 0)
        passed.checks.append(GateCheck("mAP", True, 0.8, 0.6, "0.8 ≥ 0.6"))
        cutover(store, "TICKET-1", 168.0, lambda backfill: passed)
    store_option = ("--store", str(path))
    code, out, err = command_output(capsys, rollback, *store_option, "--reason", "regression")
    assert code == 0, err
    lines = _text(out).splitlines()
    assert lines[0] == "rollback of backfill 1: serving gen0 (was gen1)"
    assert "  reason:            regression" in lines and "  items moved:       20" in lines
    code, out, err = command_output(capsys, store_status, *store_option)
    lines = _text(out).splitlines()
    assert "  cutover:           rolled back; the vectors of gen0 kept" in lines
    assert "  next:              `modelupgrade cutover` to serve the new space again" in lines
    with GalleryStore.open(path) as store:
        cutover(store, "again", 168.0, lambda backfill: passed)
    code, out, err = command_output(capsys, cleanup, *store_option, "--reason", "tidy", "--force")
    assert code == 0, err
    lines = _text(out).splitlines()
    assert lines[0] == "cleanup of backfill 1: serving gen1"
    assert "  vectors dropped:   gen0 (--force: before its rollback window ended)" in lines
    code, out, err = command_output(capsys, store_status, *store_option)
    steps = [line.split(" UTC  ")[1] for line in _text(out).splitlines() if " UTC  " in line]
    assert [step.split(" by ")[0] for step in steps] == [
        "cutover gen0 → gen1",
        "rollback gen1 → gen0",
        "cutover gen0 → gen1",
        "cleanup gen0 → gen1",
    ]
    assert "  cutover:           cleaned up; the vectors of gen0 dropped" in out.splitlines()
    # --json: a repeated cleanup answers with the recorded step, as JSON
    code, out, err = command_output(capsys, cleanup, *store_option, "--reason", "x", "--json")
    assert code == 0, err
    step = json.loads(out)
    assert (step["step"], step["reason"], step["detail"]["forced"]) == ("cleanup", "tidy", True)
