"""What an ingest checks before the store changes, and the rows it writes once they pass.

Every check runs before the first write (``GalleryStore.ingest``): a refused ingest leaves the
store as it was. Each refusal is one ``UserError`` with a hint.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.ordering.scores import score_kind_of
from modelupgrade.store.schema import Backfill
from modelupgrade.store.spaces import SpaceSpec


def check_item_ids(item_ids: Sequence[str], vectors: int) -> None:
    """One vector per item id, and no id twice."""
    if vectors != len(item_ids):
        raise UserError(f"{vectors} vectors for {len(item_ids)} item ids")
    if len(set(item_ids)) != len(item_ids):
        repeated = next(i for i, count in Counter(item_ids).items() if count > 1)
        raise UserError(
            f"the item ids to ingest are not unique, e.g. {repeated!r} appears more than once",
            hint="an item id names one gallery item; drop or rename the repeated rows",
        )


def checked_ingest_scores(
    scores: Mapping[str, np.ndarray], count: int, held: set[str], has_items: bool
) -> dict[str, np.ndarray]:
    """``scores`` as float64 arrays of one finite value per item: deployable kinds only, and the
    kinds the store's items already carry (``held``) when it ``has_items``."""
    checked: dict[str, np.ndarray] = {}
    for kind, values in scores.items():
        if not score_kind_of(kind).deployable:
            raise UserError(
                f"the {kind!r} score needs every item's new vector, so no store can hold "
                "it before its backfill",
                hint="store a score computed from the stored vectors (old-confidence, "
                "old-entropy, fastfill-sigma2)",
            )
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (count,) or not np.isfinite(values).all():
            raise UserError(
                f"{kind!r} scores must be {count} finite numbers, got shape {values.shape}"
            )
        checked[kind] = values
    if has_items and set(checked) != held:
        raise UserError(
            f"every item of this store carries the scores {sorted(held) or 'none'}; the new "
            f"items come with {sorted(checked) or 'none'}",
            hint="ingest them with the same ordering scores (--score) as the items already stored",
        )
    return checked


def check_space_during_backfill(active: Backfill | None, space: str) -> None:
    """While a backfill runs, new items go into its source or its target space."""
    if active is not None and space not in (active.source_space, active.target_space):
        raise UserError(
            f"backfill {active.id} is moving the store from {active.source_space!r} to "
            f"{active.target_space!r}; items in space {space!r} would be in neither",
            hint=f"ingest their vectors in {active.source_space!r} (they join the backfill) "
            f"or in {active.target_space!r}",
        )


def check_space_served(serving: SpaceSpec | None, active: Backfill | None, space: str) -> None:
    """With no backfill running, new items go into the serving space or one it upgrades from:
    its queries can meet no other model's vectors (``SpaceSpec.serves``)."""
    if serving is None or active is not None or serving.serves(space):
        return
    raise UserError(
        f"the store serves space {serving.name!r}, which cannot search items in space {space!r} "
        f"({serving.name!r} upgrades from {', '.join(serving.upgrades_from) or 'no space'})",
        hint=f"ingest their vectors in {serving.name!r} (a later backfill moves them), or start "
        f"the backfill into {space!r} first: new items in its target space join it at once",
    )


def check_new_items(known: Sequence[str]) -> None:
    """None of the items to ingest is in the store already (``known``: those that are)."""
    if known:
        raise UserError(
            f"{len(known)} item id(s) are already in the store, e.g. {known[0]!r}",
            hint="ingest only new items; item ids are unique in a gallery "
            "(`modelupgrade store-update` replaces an item's content)",
        )


def insert_items(
    db: sqlite3.Connection,
    slots: np.ndarray,
    item_ids: Sequence[str],
    source_rows: Sequence[tuple[str, int, int | None]],
    space: str,
) -> None:
    """The new items' rows: slot, id, source and space."""
    db.executemany(
        "INSERT INTO items (slot, item_id, source_path, source_index, label, space) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (
            (int(slot), item_id, path, index, label, space)
            for slot, item_id, (path, index, label) in zip(
                slots, item_ids, source_rows, strict=True
            )
        ),
    )


def insert_scores(
    db: sqlite3.Connection, slots: np.ndarray, scores: Mapping[str, np.ndarray]
) -> None:
    """The new items' ordering scores, each kind registered with its meaning."""
    for kind, values in scores.items():
        db.execute(
            "INSERT OR IGNORE INTO score_kinds VALUES (?, ?, ?)",
            (kind, score_kind_of(kind).meaning, time.time()),
        )
        db.executemany(
            "INSERT INTO item_scores VALUES (?, ?, ?)",
            ((kind, int(slot), float(value)) for slot, value in zip(slots, values, strict=True)),
        )
