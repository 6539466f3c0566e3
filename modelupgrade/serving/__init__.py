"""Serving modes (registry ``SERVING_MODES``), one class per file, shared by the simulator
(``modelupgrade.backfill``) and the real store (``modelupgrade.store``)."""

from modelupgrade.serving import mixed, rank_merge, rank_merge_full, rank_merge_rqt  # noqa: F401
from modelupgrade.serving.base import (
    GALLERY_FORMS,
    QUERY_FORMS,
    SERVING_MODES,
    Forms,
    GalleryForm,
    Pairing,
    QueryForm,
    ServingMode,
    ServingPlan,
    build_serving_mode,
)

__all__ = [
    "GALLERY_FORMS",
    "QUERY_FORMS",
    "SERVING_MODES",
    "Forms",
    "GalleryForm",
    "Pairing",
    "QueryForm",
    "ServingMode",
    "ServingPlan",
    "build_serving_mode",
]
