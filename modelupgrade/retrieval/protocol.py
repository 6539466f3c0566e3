"""Which retrieval protocol a pair of split files calls for, decided once for the evaluator and
the backfill simulator.

``leave-one-out`` (FastFill, Seo et al.): the gallery is also the query set and each query's own
row is excluded; ``query-gallery``: disjoint query and gallery sets; ``auto`` picks leave-one-out
when the two split files list the same items in the same order. Deciding it from the item ids
rather than from the setting's spelling is what keeps a query from retrieving itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from modelupgrade.errors import UserError


def resolve_protocol(requested: str, query_ids: np.ndarray, gallery_ids: np.ndarray) -> bool:
    """True for leave-one-out. ``auto`` picks it when both splits list the same items in order."""
    query_ids = np.asarray(query_ids)
    gallery_ids = np.asarray(gallery_ids)
    same = len(query_ids) == len(gallery_ids) and bool(np.array_equal(query_ids, gallery_ids))
    overlap = np.intersect1d(query_ids, gallery_ids).size
    if requested == "leave-one-out":
        if not same:
            raise UserError(
                "evaluation.protocol is leave-one-out but the query and gallery splits differ",
                hint="leave-one-out needs query.parquet and gallery.parquet to list "
                "the same items in order",
            )
        return True
    if requested == "query-gallery":
        if overlap:
            raise UserError(
                f"{overlap} items are both queries and gallery items; under query-gallery they "
                "would retrieve themselves",
                hint="set evaluation.protocol to leave-one-out or auto, or "
                "make the splits disjoint",
            )
        return False
    if same:
        return True
    if overlap:
        raise UserError(
            f"the query and gallery splits share {overlap} items but are not the same set",
            hint="make them disjoint (query-gallery) or identical (leave-one-out)",
        )
    return False


@dataclass(frozen=True)
class EvaluationSplits:
    """The labels of the query and gallery splits and the protocol they resolve to."""

    query_labels: np.ndarray
    gallery_labels: np.ndarray
    leave_one_out: bool


def _read_split(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise UserError(f"split file {path} does not exist", hint="run the split stage first")
    frame = pd.read_parquet(path)
    missing = {"item_id", "label"} - set(frame.columns)
    if missing:
        raise UserError(
            f"split file {path} has no {', '.join(sorted(missing))} column",
            hint="a split file is rows of the manifest: item_id, label, …",
        )
    return frame


def read_split_frames(
    protocol: str, query_split: str | Path, gallery_split: str | Path
) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """Both split files as read (every column) and ``protocol`` (``evaluation.protocol``) resolved
    on their ids: (query rows, gallery rows, leave-one-out)."""
    query = _read_split(Path(query_split))
    gallery = _read_split(Path(gallery_split))
    leave_one_out = resolve_protocol(protocol, query.item_id.to_numpy(), gallery.item_id.to_numpy())
    return query, gallery, leave_one_out


def read_evaluation_splits(
    protocol: str, query_split: str | Path, gallery_split: str | Path
) -> EvaluationSplits:
    """Read both split files and resolve ``protocol`` (``evaluation.protocol``) on their ids."""
    query, gallery, leave_one_out = read_split_frames(protocol, query_split, gallery_split)
    return EvaluationSplits(
        query.label.to_numpy(np.int64), gallery.label.to_numpy(np.int64), leave_one_out
    )
