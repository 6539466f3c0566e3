"""params.yaml: ``heads`` section (forward adapters and reverse query transforms)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from modelupgrade.config.base import Section


class HeadParams(Section):
    kind: str
    hidden_dim: int = Field(default=1024, ge=1)
    depth: int = Field(default=4, ge=1)
    epochs: int = Field(default=20, ge=1)
    batch_size: int = Field(default=512, ge=2)
    lr: float = Field(default=0.01, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)
