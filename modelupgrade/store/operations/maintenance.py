"""Operations that look after a store: its status, its verification, erasing and updating items."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelupgrade.arrays import load_array
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.live import ERASE_OPERATION, Erasure, Update, erase, update
from modelupgrade.store.operations.requests import EraseRequest, UpdateRequest
from modelupgrade.store.status import StoreStatus
from modelupgrade.store.verify import VerifyReport, verify


def status(store: Path, recall: bool = True) -> StoreStatus:
    """What the store holds, and (``recall``) its index's recall@10 against an exact scan."""
    from modelupgrade.store.search import index_recall

    with GalleryStore.open(store) as gallery:
        found = gallery.status()
        if recall and found.items:
            found.index = index_recall(gallery)
        return found


def verification(store: Path, sample: int | None = None) -> VerifyReport:
    """``store-verify``: every check of ``modelupgrade.store.verify``."""
    with GalleryStore.open(store) as gallery:
        return verify(gallery, sample)


def erasure(request: EraseRequest) -> Erasure:
    """Erase the request's items from every space, every record and the vector backend."""
    with GalleryStore.open(request.store) as gallery:
        gallery.commit_lock.command = ERASE_OPERATION  # the holder record names no item
        gallery.vectors.reachable()  # refused before anything changes when the vectors are not
        return erase(gallery, request.item_ids, request.reason)


def updated(params: Params, request: UpdateRequest) -> Update:
    """Give items new content: their new vectors in every space that keeps one."""
    from modelupgrade.store.images import ManifestImageSource
    from modelupgrade.store.ingest import item_rows, read_item_table
    from modelupgrade.store.models import model_embed_fn, space_for_model
    from modelupgrade.store.schema import ItemRow
    from modelupgrade.store.vectors import content_hashes

    frame = read_item_table(request.items)
    item_ids, sources = item_rows(frame, f"item table {request.items}")
    vectors = {
        space: load_array(path, f"new vectors in {space!r}")
        for space, path in request.vectors.items()
    }
    content: dict[str, np.ndarray] = {}
    if request.models:
        rows = [
            ItemRow(i, item_id, path, index, None, "")
            for i, (item_id, (path, index, _)) in enumerate(
                zip(item_ids, sources.rows(len(item_ids)), strict=True)
            )
        ]
        loaded = ManifestImageSource(params.dataset).load(rows)
        if loaded.failures:
            raise UserError(
                f"{len(loaded.failures)} new image(s) cannot be read, e.g. "
                f"{next(iter(loaded.failures.values()))}; nothing was updated",
                hint="check the items' paths and dataset.root in params.yaml",
            )
        hashes = content_hashes(loaded.images)
        for model in request.models:
            space = space_for_model(model).name
            embed = model_embed_fn(model, params.store.embed_batch_size, request.device)
            vectors[space], content[space] = embed(loaded.images), hashes
    if not vectors:
        raise UserError(
            "give the items' new vectors", hint="--vectors SPACE=FILE … or --model DIR …"
        )
    with GalleryStore.open(request.store) as gallery:
        gallery.vectors.reachable()
        return update(gallery, item_ids, vectors, sources, content)
