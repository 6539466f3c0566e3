"""Where a run's inputs came from: the git commit, DVC's hashes of the data, and who ran it.

These values tag MLflow runs and model versions so that a run joins back to the code
(``git_commit``) and to ``dvc.lock`` (``dvc_data_hash``, ``data_hash_of``).
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import os
import subprocess
from pathlib import Path

import yaml

from modelupgrade.io import tree_sha256


def current_user() -> str:
    for var in ("MODELUPGRADE_USER", "USER", "LOGNAME"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


# Files a pipeline run itself rewrites: DVC records each stage's hashes in dvc.lock as the stages
# finish, so a run's later stages would otherwise see their own commit as modified.
WRITTEN_BY_THE_RUN = ("dvc.lock",)


def git_commit(root: str | os.PathLike[str] | None = None) -> str:
    """The checked-out commit, with ``-dirty`` when tracked files differ from it (other than
    those the run itself rewrites, ``WRITTEN_BY_THE_RUN``)."""
    cwd = str(root) if root is not None else None
    excluded = [f":(top,exclude,glob)**/{name}" for name in WRITTEN_BY_THE_RUN]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":/", *excluded],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


@functools.lru_cache(maxsize=4)
def _locked_outputs(lock_path: Path, mtime_ns: int, size: int) -> dict[str, str]:
    """``{output path: md5}`` of every stage in ``dvc.lock``, parsed once per version of the file.

    dvc.lock grows to hundreds of kilobytes; libyaml's C loader parses it in a fraction of the pure
    Python loader's time, which every stage would otherwise pay several times.
    """
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    lock = yaml.load(lock_path.read_text(encoding="utf-8"), Loader=loader) or {}
    return {
        str(Path(out.get("path", ""))): str(out.get("md5", ""))
        for stage in (lock.get("stages") or {}).values()
        for out in stage.get("outs") or []
    }


def locked_outputs(lock_path: str | os.PathLike[str] = "dvc.lock") -> dict[str, str] | None:
    """The outputs recorded in ``dvc.lock`` with their md5, or None when there is no lock file."""
    path = Path(lock_path).resolve()
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return _locked_outputs(path, stat.st_mtime_ns, stat.st_size)


def dvc_data_hash(lock_path: str | os.PathLike[str] = "dvc.lock", prefix: str = "data/") -> str:
    """One hash over the DVC-recorded md5s of every output under ``prefix`` in ``dvc.lock``.

    It names the data an execution ran on in DVC's own terms, so an MLflow run joins back to
    ``dvc.lock``. ``none`` when no lock file exists yet (the very first ``dvc repro``).
    """
    recorded = locked_outputs(lock_path) or {}
    entries = {f"{path}:{md5}" for path, md5 in recorded.items() if path.startswith(prefix)}
    if not entries:
        return "none"
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()[:16]


def data_hash_of(paths: list[str | os.PathLike[str]], lock_path: str = "dvc.lock") -> str:
    """The hash of the data files a model saw: DVC's md5 when ``dvc.lock`` records them all,
    else a content hash of the files (outside DVC, e.g. in tests and Prefect flows)."""
    wanted = [str(Path(p)) for p in paths]
    recorded = locked_outputs(lock_path)
    if recorded is not None and all(p in recorded for p in wanted):
        joined = "\n".join(f"{p}:{recorded[p]}" for p in sorted(wanted))
        return "dvc:" + hashlib.sha256(joined.encode()).hexdigest()[:16]
    existing = [p for p in paths if Path(p).exists()]
    if not existing:
        return "none"
    return "sha256:" + tree_sha256(existing)[:16]
