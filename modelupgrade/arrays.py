"""Checked arrays: the one place that says what an embedding table must look like, and loads it.

Embeddings, head outputs and query vectors all travel as ``.npy`` files of float32 rows. Every
reader goes through ``load_array`` and every consumer through ``vector_rows``, so a wrong file is
refused with the same sentence wherever it turns up.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from modelupgrade.errors import UserError


def load_array(path: str | Path, what: str, ndim: int | None = 2, mmap: bool = False) -> np.ndarray:
    """The array in the ``.npy`` file ``path``; a missing, unreadable or misshapen file is a
    ``UserError`` naming ``what`` it should hold. Pickled object arrays are never loaded."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"{what} file {path} does not exist", hint="run the step that produces it first"
        )
    try:
        array = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except ValueError as err:
        # numpy says "Object arrays cannot be loaded when allow_pickle=False" for pickled content.
        raise UserError(
            f"{what} file {path} holds Python objects, not numbers ({err})",
            hint="save a numeric array with np.save(path, array.astype(np.float32))",
        ) from None
    except (OSError, EOFError, zipfile.BadZipFile) as err:
        raise UserError(f"{what} file {path} is not a readable .npy file: {err}") from None
    if not isinstance(array, np.ndarray):
        raise UserError(
            f"{what} file {path} is an .npz archive, not one array", hint="pass an .npy file"
        )
    if ndim is not None and array.ndim != ndim:
        raise UserError(f"{what} file {path} must hold a {ndim}-D array, got shape {array.shape}")
    return array


def vector_rows(
    array: np.ndarray, what: str, dim: int | None = None, rows: int | None = None
) -> np.ndarray:
    """``array`` as C-contiguous float32 rows (N, D), or a ``UserError`` saying what is wrong.

    ``dim`` and ``rows``, when given, are the width and the number of rows the caller needs.
    """
    array = np.asarray(array)
    if array.ndim != 2:
        raise UserError(f"{what} must be a 2-D array (N, D), got shape {array.shape}")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise UserError(f"{what} must hold numbers, got dtype {array.dtype}")
    if dim is not None and array.shape[1] != dim:
        raise UserError(f"{what} have dimension {array.shape[1]}, expected {dim}")
    if rows is not None and array.shape[0] != rows:
        raise UserError(
            f"{what} has {array.shape[0]} rows, expected {rows}",
            hint="embeddings are computed on the split files, row for row, in their order",
        )
    array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(array).all():
        raise UserError(
            f"{what} contain NaN or infinite values", hint="re-run the step that produced them"
        )
    return array
