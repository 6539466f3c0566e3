"""Running a command the way a user or DVC would, from a test."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_ok(
    args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``args`` run in ``cwd``, its output captured as text; it must exit 0 (the assertion shows
    the end of what it printed)."""
    result = subprocess.run(
        list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, (
        f"{' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    return result
