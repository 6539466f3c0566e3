"""Shared helpers of the MLflow tests: a tiny embedding model and a store seeded with generations.

MLflow creates a fresh SQLite database by running its schema migrations (seconds on this
machine), so tests copy one migrated template database instead of migrating for each test.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import torch
from torch import nn

from modelupgrade.config import GateParams
from modelupgrade.registry import (
    GateEvidence,
    GenerationRecord,
    GenerationSource,
    ModelRegistry,
    Tracker,
    TrackingConfig,
    register_generations,
)

GATES = GateParams(max_degradation_pct=5.0, max_negative_flip_rate=0.1)

# gen1-independent is not compatible, gen1-dmu flips too many queries, gen1-bct passes everything.
EVIDENCE = {
    "metric": "map",
    "models": {
        "gen0": {"self": 0.50},
        "gen1-independent": {"self": 0.70, "degradation_pct": 0.0},
        "gen1-bct": {"self": 0.67, "degradation_pct": 4.0},
        "gen1-dmu": {"self": 0.69, "degradation_pct": 1.5},
    },
    "cross": [
        {"query": "gen1-independent", "gallery": "gen0", "value": 0.02, "negative_flip_rate": 0.9},
        {"query": "gen1-bct", "gallery": "gen0", "value": 0.55, "negative_flip_rate": 0.04},
        {
            "query": "gen1-dmu",
            "gallery": "gen0",
            "value": 0.58,
            "via": "dmu-forward",
            "negative_flip_rate": 0.25,
        },
    ],
}
STRATEGIES = ("independent", "bct", "dmu")


class TinyEmbedder(nn.Module):
    """Embeds (N, C, H, W) image batches (uint8 or float) into L2-normalised vectors."""

    def __init__(self, channels: int = 1, size: int = 8, dim: int = 4) -> None:
        super().__init__()
        self.proj = nn.Linear(channels * size * size, dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float().flatten(1) / 255.0
        return nn.functional.normalize(self.proj(x), dim=1)


def image_batch(n: int = 5) -> torch.Tensor:
    return torch.randint(
        0, 256, (n, 1, 8, 8), generator=torch.Generator().manual_seed(1), dtype=torch.uint8
    )


def make_template(root: Path) -> Path:
    """Create (migrate) one database; returns its path."""
    db = root / "template.db"
    Tracker(TrackingConfig(f"sqlite:///{db}", "template", root / "template-artifacts"))
    return db


def fresh_tracker(template_db: Path, root: Path, experiment: str = "test") -> Tracker:
    root.mkdir(parents=True, exist_ok=True)
    db = root / "mlflow.db"
    shutil.copyfile(template_db, db)
    return Tracker(TrackingConfig(f"sqlite:///{db}", experiment, root / "mlartifacts"))


def seed_study(tracker: Tracker, name: str, model_root: Path) -> tuple[ModelRegistry, list, dict]:
    """Register gen0 and three gen1 models with the gate evidence above."""
    models: dict[str, TinyEmbedder] = {}
    sources = [
        GenerationSource(GenerationRecord("gen0", "gen0", "initial", "toy"), model_root / "gen0")
    ]
    models["gen0"] = TinyEmbedder()
    for strategy in STRATEGIES:
        key = f"gen1-{strategy}"
        models[key] = TinyEmbedder()
        sources.append(
            GenerationSource(
                GenerationRecord(
                    key, "gen1", strategy, "toy", parent_key="gen0", data_hash="sha256:abc"
                ),
                model_root / key,
            )
        )
    registry = ModelRegistry(tracker, name)
    with tracker.stage_run("register@toy") as run:
        outcomes = register_generations(
            registry,
            sources,
            lambda path: models[path.name],
            GateEvidence.from_dict(EVIDENCE),
            GATES,
            run,
        )
    return registry, outcomes, models
