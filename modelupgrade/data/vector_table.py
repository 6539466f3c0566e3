"""The one vector format every command takes: a table of ``item_id`` and ``embedding``.

A parquet file with an ``item_id`` column (text) and an ``embedding`` column (one list of floats
per row, all of one length) holds one model's vectors of the items it names: what ``adopt`` takes
for a model that cannot run any more, what ``store-ingest --vectors`` and ``backfill --vectors``
load, what ``plan --old`` and ``cutover --old-vectors`` look held-out items up in, and what
``embed --out FILE.parquet`` writes. A ``.npy`` matrix with its ids beside it (a parquet table
with an ``item_id`` column, or text with one id a line, in row order) is the same table in two
files. Vectors are looked up by id, so a table may hold more items than a command asks for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelupgrade.errors import UserError

ID_COLUMN, VECTOR_COLUMN = "item_id", "embedding"
_HINT = (
    "give a parquet table with an item_id column and an embedding column (a list of floats per "
    "row), or a .npy matrix with its ids"
)
_SHOWN = 5


@dataclass(frozen=True)
class VectorTable:
    """One model's vectors of the items it names: row i of ``vectors`` is item ``item_ids[i]``."""

    item_ids: list[str]
    vectors: np.ndarray
    source: str

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def rows_of(self, item_ids: Sequence[str], what: str) -> np.ndarray:
        """The rows of ``item_ids`` in this table; items it lacks are one error naming how many
        and which, of ``what``."""
        row_of = {item: row for row, item in enumerate(self.item_ids)}
        missing = [item for item in item_ids if item not in row_of]
        if missing:
            shown = ", ".join(map(str, missing[:_SHOWN])) + (" …" if len(missing) > _SHOWN else "")
            raise UserError(
                f"the vectors of {self.source} lack {len(missing)} of the {len(item_ids)} items "
                f"of {what} ({shown})",
                hint="a vector table gives the vectors of the items it names by item_id: add the "
                "missing items' vectors, or name only items it holds",
            )
        return np.fromiter((row_of[item] for item in item_ids), np.int64, len(item_ids))

    def vectors_of(self, item_ids: Sequence[str], what: str) -> np.ndarray:
        """The vectors of ``item_ids``, in their order (float32, N × D)."""
        return self.vectors[self.rows_of(item_ids, what)]


def is_vector_table(path: str | Path) -> bool:
    """Whether ``path`` is a parquet file with an ``embedding`` column (not a matrix file)."""
    path = Path(path)
    if path.suffix.lower() != ".parquet" or not path.is_file():
        return False
    import pyarrow.parquet as pq

    return VECTOR_COLUMN in pq.read_schema(path).names


def read_vector_table(
    path: str | Path,
    what: str = "vector table",
    ids: str | Path | None = None,
    id_column: str = ID_COLUMN,
    vector_column: str = VECTOR_COLUMN,
) -> VectorTable:
    """The vector table at ``path``: a parquet table of ids and vectors, or a ``.npy`` matrix
    whose row ids are in ``ids``. Checked: one vector per id, ids unique, every value finite."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist", hint=_HINT)
    if path.suffix.lower() == ".npy":
        item_ids = _ids_file(path, ids, id_column, what)
        try:
            vectors = np.load(path, allow_pickle=False)
        except ValueError as err:
            raise UserError(f"{what} {path} is not a numeric .npy matrix: {err}") from None
    elif path.suffix.lower() == ".parquet":
        item_ids, vectors = _parquet(path, id_column, vector_column, what)
    else:
        raise UserError(f"{what} {path} is neither a .parquet table nor a .npy matrix", hint=_HINT)
    if vectors.ndim != 2 or len(vectors) != len(item_ids) or vectors.shape[1] < 2:
        raise UserError(
            f"{what} {path} holds {vectors.shape} vectors for {len(item_ids)} ids; expected "
            "(ids, D ≥ 2)",
            hint=_HINT,
        )
    if len(set(item_ids)) != len(item_ids):
        raise UserError(f"the ids of {what} {path} repeat", hint="give each item one vector")
    vectors = np.asarray(vectors, dtype=np.float32)
    if not np.isfinite(vectors).all():
        bad = int((~np.isfinite(vectors).all(axis=1)).sum())
        raise UserError(f"{what} {path} has {bad} vector(s) with NaN or infinite values")
    return VectorTable(item_ids, vectors, str(path))


def _parquet(
    path: Path, id_column: str, vector_column: str, what: str
) -> tuple[list[str], np.ndarray]:
    """Ids and vectors of a parquet table, read column-wise (no Python object per value)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except (OSError, pa.ArrowInvalid) as err:
        raise UserError(f"{what} {path} cannot be read as parquet: {err}", hint=_HINT) from None
    missing = [c for c in (id_column, vector_column) if c not in names]
    if missing:
        raise UserError(
            f"{what} {path} has no column(s) {missing} (it has: {', '.join(names)})", hint=_HINT
        )
    table = pq.read_table(path, columns=[id_column, vector_column])
    column = table.column(vector_column).combine_chunks()
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) and not (
        pa.types.is_fixed_size_list(column.type)
    ):
        raise UserError(
            f"column {vector_column!r} of {what} {path} is {column.type}, not a list of numbers "
            "per row",
            hint=_HINT,
        )
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if column.null_count or (len(lengths) and (lengths != lengths[0]).any()):
        raise UserError(
            f"column {vector_column!r} of {what} {path} is not one vector per row of equal "
            f"length (lengths {sorted(set(lengths.tolist()))[:_SHOWN]})",
            hint=_HINT,
        )
    try:
        flat = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    except (pa.ArrowInvalid, TypeError, ValueError) as err:
        raise UserError(
            f"column {vector_column!r} of {what} {path} holds values that are not numbers: {err}"
        ) from None
    dim = int(lengths[0]) if len(lengths) else 0
    ids = [str(i) for i in table.column(id_column).to_pylist()]
    return ids, flat.reshape(len(ids), dim) if dim else flat.reshape(len(ids), 0)


def _ids_file(path: Path, ids: str | Path | None, id_column: str, what: str) -> list[str]:
    if ids is None:
        raise UserError(
            f"{what} {path} is a bare matrix: say which item each row is",
            hint="give its ids (a parquet table with an item_id column, or text with one id a "
            "line, in row order), or a parquet table of item_id and embedding",
        )
    ids = Path(ids)
    if not ids.is_file():
        raise UserError(f"the ids file {ids} of {what} {path} does not exist")
    if ids.suffix.lower() == ".parquet":
        import pandas as pd

        frame = pd.read_parquet(ids)
        if id_column not in frame.columns:
            raise UserError(f"the ids file {ids} has no column {id_column!r}")
        return frame[id_column].astype(str).tolist()
    return ids.read_text(encoding="utf-8").split()


def write_vector_table(path: str | Path, item_ids: Sequence[str], vectors: np.ndarray) -> Path:
    """Write ``vectors`` (N × D) of ``item_ids`` as the parquet vector table at ``path``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from modelupgrade.io import atomic_path

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or len(vectors) != len(item_ids):
        raise ValueError(f"{vectors.shape} vectors for {len(item_ids)} ids")
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])
    table = pa.table({ID_COLUMN: pa.array([str(i) for i in item_ids]), VECTOR_COLUMN: embedding})
    path = Path(path)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def vectors_for_items(path: str | Path, item_ids: Sequence[str], what: str) -> np.ndarray:
    """The vectors of ``item_ids`` in their order: looked up by id in a vector table, or the rows
    of a ``.npy`` matrix whose row i is item i (the pipeline's embeddings files)."""
    from modelupgrade.arrays import load_array

    if is_vector_table(path):
        return read_vector_table(path, what).vectors_of(item_ids, f"the items {what} is for")
    if Path(path).suffix.lower() == ".parquet":
        raise UserError(
            f"{what} {path} is a parquet file without an {VECTOR_COLUMN!r} column", hint=_HINT
        )
    matrix = load_array(path, what)
    if len(matrix) != len(item_ids):
        raise UserError(
            f"{what} {path} has {len(matrix)} rows for {len(item_ids)} items",
            hint="row i of a .npy matrix is item i of the table it goes with; or give a parquet "
            "of item_id and embedding, looked up by id",
        )
    return matrix
