"""The head card: what a saved transformation head is, how it was trained and between which models.

``load_head`` rebuilds the architecture from the first group of fields alone; ``sources`` names the
embeddings and models the head was trained between (with hashes where they are files), and
``previous_heads`` the earlier generations' heads it follows in a sequential upgrade.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from modelupgrade.cards import Card
from modelupgrade.json_data import JsonObject

HEAD_WEIGHTS_FILE = "head.pt"


class HeadCard(Card):
    FORMAT: ClassVar[str] = "modelupgrade-head/1"
    WEIGHTS_FILE: ClassVar[str] = HEAD_WEIGHTS_FILE
    WHAT: ClassVar[str] = "head"

    # What the head is (``Head.architecture``).
    kind: str
    direction: Literal["forward", "reverse"]
    in_dim: int
    out_dim: int
    side_info_dim: int = 0
    hidden_dim: int
    depth: int
    options: dict[str, Any] = Field(default_factory=dict)
    outputs: list[str]
    # What it costs per embedding (BatchNorm folded into the linear layers).
    macs_per_embedding: int
    macs_by_output: dict[str, int]
    parameters: int
    # How it was trained, and from what.
    name: str | None = None
    input_momentum: float = 0.0
    previous_heads: list[str] = Field(default_factory=list)
    training: JsonObject = Field(default_factory=dict)
    sources: dict[str, dict[str, str] | None] = Field(default_factory=dict)

    @field_validator("weights_sha256", mode="before")
    @classmethod
    def _one_file(cls, value: object) -> object:
        # Cards of the first format version hashed the single weights file as a string.
        return {HEAD_WEIGHTS_FILE: value} if isinstance(value, str) else value

    def headline_metrics(self) -> dict[str, float]:
        """The training record's final loss, steps, seconds and fit, and the cost per embedding."""
        record = {
            k: v
            for k, v in self.training.items()
            if k in ("final_loss", "steps", "seconds", "fit_cosine") and isinstance(v, int | float)
        }
        return {**record, "macs_per_embedding": self.macs_per_embedding}

    def source_path(self, name: str) -> str | None:
        """The path recorded for a source (``new_model``, ``old_model``, ``old_embeddings`` …)."""
        entry = self.sources.get(name)
        return None if entry is None else entry.get("path")
