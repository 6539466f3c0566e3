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
"""

from modelupgrade.store.backends import VECTOR_BACKENDS, BackendSettings
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.images import (
    ImageFileSource,
    ImageSource,
    LoadedImages,
    ManifestImageSource,
)
from modelupgrade.store.ingest import ingest_embedding_table, ingest_images
from modelupgrade.store.job import (
    BackfillJob,
    ChunkExecutor,
    LocalExecutor,
    abort_backfill,
    start_or_resume,
)
from modelupgrade.store.report import BackfillReport
from modelupgrade.store.schema import (
    SCHEMA_VERSION,
    Backfill,
    Chunk,
    ChunkCommit,
    ItemFailure,
    ItemRow,
    ItemSources,
    Snapshot,
)
from modelupgrade.store.search import HeadTransforms, QueryVectors, Searcher, SearchHits, search
from modelupgrade.store.serving_check import ServingCheck
from modelupgrade.store.sources import (
    ChunkVectors,
    ReEmbedImages,
    TableVectors,
    TransformStored,
    VectorSource,
    vectors_digest,
)
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.status import StoreStatus
from modelupgrade.store.vectors import check_vectors

__all__ = [
    "SCHEMA_VERSION",
    "VECTOR_BACKENDS",
    "BackendSettings",
    "Backfill",
    "BackfillJob",
    "BackfillReport",
    "Chunk",
    "ChunkCommit",
    "ChunkExecutor",
    "ChunkVectors",
    "GalleryStore",
    "HeadTransforms",
    "ImageFileSource",
    "ImageSource",
    "ItemFailure",
    "ItemRow",
    "ItemSources",
    "LoadedImages",
    "LocalExecutor",
    "ManifestImageSource",
    "QueryVectors",
    "ReEmbedImages",
    "SearchHits",
    "Searcher",
    "ServingCheck",
    "Snapshot",
    "SpaceSpec",
    "StoreStatus",
    "TableVectors",
    "TransformStored",
    "VectorSource",
    "abort_backfill",
    "check_vectors",
    "ingest_embedding_table",
    "ingest_images",
    "search",
    "start_or_resume",
    "vectors_digest",
]
