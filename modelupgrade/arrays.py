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
        raise UserError(
            f"{what} file {path} must hold a {ndim}-D array, got shape {array.shape}",
            hint="save one row per vector: np.save(path, vectors.reshape(len(vectors), -1))"
            if ndim == 2
            else None,
        )
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


def label_vectors(
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    queries: int,
    gallery: int,
    leave_one_out: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The query and gallery labels of a ranking as int64 vectors, one per query and per gallery
    item; a count that does not match, or a leave-one-out ranking whose query set is not its
    gallery, is a ``UserError``."""
    q = np.asarray(query_labels, dtype=np.int64)
    g = np.asarray(gallery_labels, dtype=np.int64)
    if q.shape != (queries,) or g.shape != (gallery,):
        raise UserError(
            f"{queries} queries and {gallery} gallery items but {len(q)} query and {len(g)} "
            "gallery labels",
            hint="labels come from the split files the vectors were computed on, in the same order",
        )
    if leave_one_out and queries != gallery:
        raise UserError(
            f"leave-one-out needs the query set to be the gallery set, got {queries} queries "
            f"and {gallery} gallery items"
        )
    return q, g


def mean_row_cosine(vectors: np.ndarray, targets: np.ndarray) -> float:
    """The mean cosine of each row of ``vectors`` to the same row of ``targets`` (a head's outputs
    against the embeddings it maps to: its alignment)."""
    norms = np.linalg.norm(vectors, axis=1) * np.linalg.norm(targets, axis=1)
    return float(np.mean(np.sum(vectors * targets, axis=1) / np.maximum(norms, 1e-12)))
