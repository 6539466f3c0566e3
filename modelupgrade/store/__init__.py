"""The real gallery store: items and backfill ledger in SQLite, vectors in on-disk float32 arrays
(embedded) or in Milvus, backfilled chunk by chunk with crash-safe commits, and searchable in any
serving mode at any moment of the backfill.

Modules by concern: ``schema`` (layout and rows), ``database`` (SQLite, transactions), ``vectors``
(a space's float32 file, vector checksums), ``backends`` (where vectors live and are searched:
embedded files or Milvus), ``spaces``, ``gallery`` (items, scores, vectors, snapshots), ``ledger``
(the backfill state machine), ``status``, ``sources`` (where a backfill's vectors come from),
``job`` (the backfill job and its executors), ``report``, ``preview``, ``serving_check``,
``search``, ``service`` (HTTP), ``lock`` (the writer lease and the commit lock), ``recovery`` (what
the next writer redoes), ``live`` (erase, update), ``verify`` (store-verify), ``faults`` (error
lines of a damaged store or a full disk; the named commit boundaries), ``ingest``, ``images``,
``models`` (models and heads as callables, scores), ``shadow`` (the shadow evaluation before a
cutover), ``cutover`` (cutover, rollback and cleanup of a completed backfill), ``steps`` (their
record), ``follow`` (keep a store on a model), and ``operations``: what the commands, flows and the
Ray executor ask of a store, as typed requests.
The ordering policies and serving modes are ``modelupgrade.ordering`` and ``modelupgrade.serving``.

The package imports nothing itself: each name below is its module's, imported when first used
(PEP 562), so a process (or a DVC stage's code closure) that needs one part of the store, the
vector backends' registry say, does not import all of it.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOME = {
    "BackendSettings": "modelupgrade.store.backends",
    "Backfill": "modelupgrade.store.schema",
    "BackfillJob": "modelupgrade.store.job",
    "BackfillReport": "modelupgrade.store.report",
    "Chunk": "modelupgrade.store.schema",
    "ChunkCommit": "modelupgrade.store.schema",
    "ChunkExecutor": "modelupgrade.store.job",
    "ChunkVectors": "modelupgrade.store.sources",
    "GalleryStore": "modelupgrade.store.gallery",
    "HeadTransforms": "modelupgrade.store.search",
    "ImageFileSource": "modelupgrade.store.images",
    "ImageSource": "modelupgrade.store.images",
    "ItemFailure": "modelupgrade.store.schema",
    "ItemRow": "modelupgrade.store.schema",
    "ItemSources": "modelupgrade.store.schema",
    "LoadedImages": "modelupgrade.store.images",
    "LocalExecutor": "modelupgrade.store.job",
    "ManifestImageSource": "modelupgrade.store.images",
    "QueryVectors": "modelupgrade.store.search",
    "ReEmbedImages": "modelupgrade.store.sources",
    "SCHEMA_VERSION": "modelupgrade.store.schema",
    "SearchHits": "modelupgrade.store.search",
    "Searcher": "modelupgrade.store.search",
    "ServingCheck": "modelupgrade.store.serving_check",
    "Snapshot": "modelupgrade.store.schema",
    "SpaceSpec": "modelupgrade.store.spaces",
    "StoreStatus": "modelupgrade.store.status",
    "TableVectors": "modelupgrade.store.sources",
    "TransformStored": "modelupgrade.store.sources",
    "VECTOR_BACKENDS": "modelupgrade.store.backends",
    "VectorSource": "modelupgrade.store.sources",
    "abort_backfill": "modelupgrade.store.job",
    "check_vectors": "modelupgrade.store.vectors",
    "ingest_embedding_table": "modelupgrade.store.ingest",
    "ingest_images": "modelupgrade.store.ingest",
    "search": "modelupgrade.store.search",
    "start_or_resume": "modelupgrade.store.job",
    "vectors_digest": "modelupgrade.store.sources",
}
__all__ = list(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_HOME[name]), name)
    globals()[name] = value
    return value
