"""Vector backends of the gallery store (registry ``VECTOR_BACKENDS``), one class per file:
``embedded`` (float32 files beside the store's database, the default) and ``milvus`` (Milvus Lite
or a Milvus server). The interface is ``base.VectorBackend``."""

from modelupgrade.store.backends import embedded, milvus  # noqa: F401
from modelupgrade.store.backends.base import (
    VECTOR_BACKENDS,
    BackendSettings,
    MatrixGallery,
    PartGallery,
    VectorBackend,
)

__all__ = ["VECTOR_BACKENDS", "BackendSettings", "MatrixGallery", "PartGallery", "VectorBackend"]
