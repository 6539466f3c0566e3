"""Serving modes (registry ``SERVING_MODES``), one class per file."""

from modelupgrade.backfill.serving import mixed, rank_merge, rank_merge_full, rank_merge_rqt  # noqa: F401
from modelupgrade.backfill.serving.base import SERVING_MODES, ServingArrays, ServingMode, build_serving_mode

__all__ = ["SERVING_MODES", "ServingArrays", "ServingMode", "build_serving_mode"]
