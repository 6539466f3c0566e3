"""Atomic file writes and content hashes.

Every output of the pipeline is written to a temporary sibling and renamed into place, so a crash
never leaves a half-written file where a downstream stage (or DVC) would trust it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block succeeds.

    Works for files and for directories (the block creates whichever it wants at the temp path).
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    target = tmp / final.name
    try:
        yield target
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        os.replace(target, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=json_default) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def save_npy(path: str | os.PathLike[str], array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, array, allow_pickle=False)


def save_parquet(path: str | os.PathLike[str], frame: Any) -> None:
    """Write a pandas DataFrame to parquet atomically (byte-stable for equal frames)."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def tree_sha256(paths: list[str | os.PathLike[str]]) -> str:
    """One hash over several files or directories (sorted, content and relative names)."""
    digest = hashlib.sha256()
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p])
    for f in files:
        digest.update(str(f).encode())
        digest.update(file_sha256(f).encode())
    return digest.hexdigest()


def json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")
