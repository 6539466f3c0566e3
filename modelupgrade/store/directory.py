"""A gallery store's directory: what may become one, and what is one to open.

A directory becomes a store only when it is new, or holds no more than a store's beginnings (the
locks of the writer creating it, and what a creation killed half-way laid out); a path that is a
file, or a link to nothing, is a ``UserError`` naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

from modelupgrade.errors import UserError
from modelupgrade.store.lock import COMMIT_HOLDER_FILE, COMMIT_LOCK_FILE, HOLDER_FILE, LOCK_FILE
from modelupgrade.store.schema import DATABASE_FILE, VECTORS_DIR

# What a store directory may hold before its database exists: the locks of the writer creating it,
# and what a creation (perhaps killed half-way) lays out before the database is renamed into place.
_LOCK_FILES = {LOCK_FILE, HOLDER_FILE, COMMIT_LOCK_FILE, COMMIT_HOLDER_FILE}
_BEGINNINGS = _LOCK_FILES | {VECTORS_DIR, f".{DATABASE_FILE}.tmp"}


def refuse_foreign(directory: Path) -> None:
    """A directory that holds something other than a store's beginnings never becomes one (one
    that another writer has just made a store of is one)."""
    entries = {p.name for p in directory.iterdir()}
    foreign = sorted(
        name
        for name in entries - _BEGINNINGS
        if not name.startswith(f".{DATABASE_FILE}.tmp")  # the database being built, its journal
    )
    if DATABASE_FILE not in entries and foreign:
        raise UserError(
            f"{directory} exists and is not a gallery store (it holds {foreign[0]!r})",
            hint="pass --store a new directory, or the directory of an existing store",
        )


def store_directory(path: Path) -> Path:
    """``path`` as the directory a new store goes in (made if absent); a path that is a file, or a
    link to nothing, is a ``UserError``."""
    if path.is_symlink() and not path.exists():
        raise UserError(
            f"--store {path} is a symbolic link to {os.readlink(path)}, which does not exist",
            hint="point the link at a directory, or pass the directory itself",
        )
    if path.exists() and not path.is_dir():
        raise UserError(
            f"{path} exists and is not a gallery store (it is a file)",
            hint="pass --store a new directory, or the directory of an existing store",
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"cannot make the store directory {path}: {os.strerror(err.errno or 0)}",
            hint="pass --store a directory you can write",
        ) from None
    return path


def existing_directory(path: Path) -> Path:
    """``path`` as the directory of a store to open; a file, or a link to nothing, is a
    ``UserError``."""
    if path.is_symlink() and not path.exists():
        raise UserError(
            f"no gallery store at {path}: it is a symbolic link to {os.readlink(path)}, which "
            "does not exist",
            hint="point the link at the store's directory, or pass the directory itself",
        )
    if path.exists() and not path.is_dir():
        raise UserError(
            f"no gallery store at {path}: it is a file, not a store directory",
            hint="pass --store the store's directory",
        )
    return path
