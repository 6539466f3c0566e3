"""params.yaml: ``store`` section (the real gallery store and backfill job)."""

from __future__ import annotations

from pydantic import Field

from modelupgrade.config.base import Section


class StoreParams(Section):
    path: str = "stores/demo"
    chunk_size: int = Field(default=512, ge=1)
    policy: str = "old-confidence"
    serving_mode: str = "mixed"
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=1, le=65535)
