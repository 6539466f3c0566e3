"""The real gallery store: embedded (SQLite + on-disk float32 arrays), backfilled chunk by chunk with
crash-safe commits, and searchable with a serving mode at any moment of the backfill.
"""

from modelupgrade.store.backfill import (
    BackfillJob,
    BackfillReport,
    ChunkVectors,
    ReEmbedImages,
    TransformStored,
    VectorSource,
    start_or_resume,
    vectors_digest,
)
from modelupgrade.store.gallery import (
    SCHEMA_VERSION,
    Backfill,
    Chunk,
    ChunkCommit,
    GalleryStore,
    ItemRow,
    ItemSources,
    Snapshot,
    StoreStatus,
    check_vectors,
)
from modelupgrade.store.images import ImageFileSource, ImageSource, LoadedImages, ManifestImageSource
from modelupgrade.store.ingest import ingest_embedding_table, ingest_images
from modelupgrade.store.policies import STORE_POLICIES, OrderingPolicy, build_policy
from modelupgrade.store.search import Searcher, search
from modelupgrade.store.serving import SERVING_MODES, GalleryPart, SearchHits, ServingMode, build_serving_mode
from modelupgrade.store.spaces import SpaceSpec

__all__ = [
    "SCHEMA_VERSION",
    "SERVING_MODES",
    "STORE_POLICIES",
    "Backfill",
    "BackfillJob",
    "BackfillReport",
    "Chunk",
    "ChunkCommit",
    "ChunkVectors",
    "GalleryPart",
    "GalleryStore",
    "ImageFileSource",
    "ImageSource",
    "ItemRow",
    "ItemSources",
    "LoadedImages",
    "ManifestImageSource",
    "OrderingPolicy",
    "ReEmbedImages",
    "SearchHits",
    "Searcher",
    "ServingMode",
    "Snapshot",
    "SpaceSpec",
    "StoreStatus",
    "TransformStored",
    "VectorSource",
    "build_policy",
    "build_serving_mode",
    "check_vectors",
    "ingest_embedding_table",
    "ingest_images",
    "search",
    "start_or_resume",
    "vectors_digest",
]
