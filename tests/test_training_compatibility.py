"""Slow: on Fashion-MNIST extended-data with the default CPU model, BCT is compatible,
independent is not.

Reads the real dataset (skipped when absent). Old model: 30% of 300 images per class; new models:
all 300 per class; query 100 and gallery 500 test images per class. Compatibility criterion (BCT):
M(φ_new query, φ_old gallery) > M(φ_old, φ_old) with M = mAP over the full ranking (top-1 is
printed; with 10 classes it is close to a kNN accuracy and not a retrieval criterion of the papers).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from modelupgrade.config.training import ArchitectureParams, TrainingParams
from modelupgrade.models import embed, load_model
from tests.model_fixtures import resnet10t, train_generation

ROOT = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_ARCHITECTURE = ArchitectureParams(**resnet10t((16, 32, 64, 128), embedding_dim=128))
DEFAULT_TRAINING = TrainingParams(epochs=5, batch_size=64, lr=0.1, warmup_epochs=0.5)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (ROOT / "train-images-idx3-ubyte.gz").is_file(), reason="Fashion-MNIST is not installed"
    ),
]


def read(prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    from modelupgrade.data.idx_format import read_idx

    images = torch.from_numpy(read_idx(ROOT / f"{prefix}-images-idx3-ubyte.gz").copy()).unsqueeze(1)
    labels = torch.from_numpy(read_idx(ROOT / f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64))
    return images, labels


def per_class(
    labels: torch.Tensor, start: int, stop: int, generator: torch.Generator | None
) -> torch.Tensor:
    rows = []
    for cls in range(10):
        idx = torch.nonzero(labels == cls).squeeze(1)
        if generator is not None:
            idx = idx[torch.randperm(len(idx), generator=generator)]
        rows.append(idx[start:stop])
    return torch.cat(rows)


def retrieval(
    query: np.ndarray, gallery: np.ndarray, query_labels: torch.Tensor, gallery_labels: torch.Tensor
) -> tuple[float, float]:
    """(mAP over the full ranking, top-1) with cosine similarity."""
    order = (torch.from_numpy(query) @ torch.from_numpy(gallery).T).argsort(dim=1, descending=True)
    relevant = (gallery_labels[order] == query_labels[:, None]).float()
    precision = relevant.cumsum(1) / torch.arange(1, relevant.shape[1] + 1)
    average_precision = (precision * relevant).sum(1) / relevant.sum(1)
    return float(average_precision.mean()), float(relevant[:, 0].mean())


def test_bct_is_backward_compatible_and_independent_training_is_not(tmp_path):
    train_images, train_labels = read("train")
    test_images, test_labels = read("t10k")
    generator = torch.Generator().manual_seed(666)
    new_rows = per_class(train_labels, 0, 300, generator)
    old_rows = torch.cat([new_rows[c * 300 : c * 300 + 90] for c in range(10)])
    query, gallery = per_class(test_labels, 0, 100, None), per_class(test_labels, 100, 600, None)

    def train(name: str, generation: int, strategy: str | None = None) -> float:
        rows = new_rows if generation else old_rows
        started = time.perf_counter()
        train_generation(
            tmp_path,
            (train_images[rows], train_labels[rows]),
            name,
            generation,
            strategy,
            old=tmp_path / "gen0" if generation else None,
            architecture=DEFAULT_ARCHITECTURE,
            architecture_name="default",
            training=DEFAULT_TRAINING,
            seed=666 + generation,
            data=None,
        )
        return time.perf_counter() - started

    seconds = {
        "gen0": train("gen0", 0),
        "bct": train("gen1-bct", 1, "bct"),
        "independent": train("gen1-independent", 1, "independent"),
    }
    features = {
        name: (embed(model, test_images[query]), embed(model, test_images[gallery]))
        for name in ("gen0", "gen1-bct", "gen1-independent")
        for model in [load_model(tmp_path / name)]
    }
    old_old = retrieval(
        features["gen0"][0], features["gen0"][1], test_labels[query], test_labels[gallery]
    )
    bct_old = retrieval(
        features["gen1-bct"][0], features["gen0"][1], test_labels[query], test_labels[gallery]
    )
    independent_old = retrieval(
        features["gen1-independent"][0],
        features["gen0"][1],
        test_labels[query],
        test_labels[gallery],
    )
    print(
        f"\ntraining seconds {seconds}\nmAP/top-1 old/old {old_old}, bct/old {bct_old}, "
        f"independent/old {independent_old}"
    )
    assert bct_old[0] > old_old[0]
    assert independent_old[0] < old_old[0]
