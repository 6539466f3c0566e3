"""Which pipeline execution a process belongs to, and which parent run each execution logs under.

DVC runs each stage as its own process, so the stages of one ``dvc repro`` find their common parent
run through a small state file keyed by the ``dvc`` process that spawned them (found by walking
``/proc``): a new ``dvc repro`` (a new process) starts a new parent. An orchestrator that is not
DVC sets ``MODELUPGRADE_PARENT_RUN_ID`` to group its stages under a parent it opened.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelupgrade.io import write_json

PARENT_RUN_ENV = "MODELUPGRADE_PARENT_RUN_ID"

log = logging.getLogger(__name__)


def execution_key() -> str:
    """Identify the pipeline execution this process belongs to.

    Under DVC it is the ``dvc repro``/``dvc exp`` process that spawned us (pid and start time,
    so a recycled pid is not mistaken for the old execution); otherwise this process itself,
    which gives a standalone stage its own parent run.
    """
    pid = os.getpid()
    own = _process_identity(pid)
    while pid > 1:
        info = _proc_stat(pid)
        if info is None:
            break
        parent = info[0]
        if parent <= 1:
            break
        if _is_dvc_execution(_proc_cmdline(parent)):
            return "dvc:" + (_process_identity(parent) or str(parent))
        pid = parent
    return "process:" + (own or str(os.getpid()))


def is_dvc_execution_key(key: str) -> bool:
    return key.startswith("dvc:")


def execution_alive(key: str) -> bool:
    """Whether the process an execution key names still runs (a recycled pid does not count)."""
    try:
        _, pid, start = key.split(":")
        info = _proc_stat(int(pid))
    except ValueError:
        return False
    if not Path("/proc").is_dir():
        return True
    return info is not None and info[1] == start


@dataclass
class ExecutionParents:
    """The state file that maps each live execution to its parent run in one tracking store.

    Executions running side by side (two flows, a person's stage beside a ``dvc repro``) keep
    their own parents. The caller holds the store's writer lock between ``load`` and ``remember``.
    """

    path: Path
    tracking_uri: str
    parents: dict[str, str]

    @classmethod
    def load(cls, path: Path, tracking_uri: str) -> ExecutionParents:
        """The state in ``path``; empty when it is missing, unreadable, or for another store."""
        state = _read_state(path)
        recorded = state.get("executions") if state.get("tracking_uri") == tracking_uri else None
        parents = {k: v for k, v in (recorded or {}).items() if isinstance(v, str)}
        return cls(path, tracking_uri, parents)

    def get(self, key: str) -> str | None:
        return self.parents.get(key)

    def remember(self, key: str, run_id: str) -> None:
        """Record ``run_id`` as the parent of ``key``; executions that ended are forgotten."""
        self.parents = {k: v for k, v in self.parents.items() if execution_alive(k)}
        self.parents[key] = run_id
        write_json(self.path, {"tracking_uri": self.tracking_uri, "executions": self.parents})


def _read_state(path: Path) -> dict[str, Any]:
    """The parents file's JSON; none yet, or one that cannot be read, is an empty state (a new
    parent run is opened: the cost is a second parent, never a lost stage run)."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("ignoring the unreadable parent-run state %s: %s", path, err)
        return {}
    return state if isinstance(state, dict) else {}


def _proc_stat(pid: int) -> tuple[int, str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = raw[raw.rfind(")") + 2 :].split()
    return int(fields[1]), fields[19]


def _process_identity(pid: int) -> str | None:
    info = _proc_stat(pid)
    return None if info is None else f"{pid}:{info[1]}"


def _proc_cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0") if a]
    except OSError:
        return []


def _is_dvc_execution(argv: list[str]) -> bool:
    names = [Path(a).name for a in argv]
    if "dvc" not in names:
        return False
    return any(a in ("repro", "exp", "run") for a in argv)
