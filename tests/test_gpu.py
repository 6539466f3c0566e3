"""The CUDA paths: training (bf16 autocast, channels_last, images on the GPU),
heads, ranking, backfill.

Every test here is marked ``gpu`` and skipped on a machine without CUDA (see conftest.py). On a GPU
run them with ``pytest -m gpu``. Each compares the GPU result with the CPU reference or checks a
property that only holds when the GPU path really trained.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from modelupgrade.config.training import ArchitectureParams, TrainingParams
from modelupgrade.heads import (
    HEADS,
    FrozenHead,
    build_head,
    fit_head,
    head_dims,
)
from modelupgrade.metrics import leave_one_out_cmc, leave_one_out_map
from modelupgrade.models import embed, load_model
from modelupgrade.store.models import model_embed_fn
from modelupgrade.strategies import build_strategy
from modelupgrade.training import Trainer, build_model
from tests.data_fixtures import quadrant_images
from tests.model_fixtures import compatibility_strategies, resnet10t, train_generation
from tests.test_heads import mean_cosine, quick_training, synthetic_pairs

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
ARCH = ArchitectureParams(**resnet10t((16, 16, 32, 32), embedding_dim=16))
TRAINING = TrainingParams(epochs=6, batch_size=64, lr=0.05, warmup_epochs=0.5)


@pytest.fixture
def quadrants() -> tuple[torch.Tensor, torch.Tensor]:
    """256 learnable 1×16×16 images: each of 4 classes brightens its own quadrant over noise."""
    return quadrant_images(256, noise_max=128)


# _train(tmp_path, data, name, generation, strategy=None, options=None, old=None): this module's
# model and training, into tmp_path / name.
_train = functools.partial(
    train_generation, architecture=ARCH, training=TRAINING, seed=3, device=CUDA
)


def _fit(data, device):
    images, labels = data
    torch.manual_seed(0)
    model = build_model(ARCH, images, labels)
    result = Trainer(TRAINING, device=device, seed=0, progress=False).fit(
        model, images, labels, build_strategy("independent")
    )
    return model, result


def test_training_on_the_gpu_keeps_images_on_the_device_and_follows_the_cpu_run(quadrants):
    model, result = _fit(quadrants, CUDA)
    assert result.images_on_device
    assert next(model.parameters()).is_cuda
    losses = [entry["loss"] for entry in result.history]
    assert all(math.isfinite(loss) for loss in losses)
    # Same seed, same batches and augmentation draws: bf16 on the GPU tracks the float32 CPU run
    # (the ArcFace loss levels off near 8.8 on this data, from about 17 at the start).
    _, cpu_result = _fit(quadrants, "cpu")
    cpu_losses = [entry["loss"] for entry in cpu_result.history]
    assert losses[0] == pytest.approx(cpu_losses[0], rel=0.02)
    assert losses[-1] == pytest.approx(cpu_losses[-1], rel=0.05)
    assert losses[-1] < 0.6 * losses[0]
    # Retrieval on the trained embeddings is far above chance (0.25 top-1 with 4 balanced classes).
    images, labels = quadrants
    vectors = embed(model, images, 128, CUDA)
    assert leave_one_out_cmc(vectors @ vectors.T, labels.numpy(), topk=(1,))[1] > 0.9


@pytest.mark.parametrize("kind,options", compatibility_strategies("contrastive"))
def test_every_strategy_trains_on_the_gpu_and_its_model_embeds_the_same_on_the_cpu(
    tmp_path, quadrants, kind, options
):
    _train(tmp_path, quadrants, "gen0", 0)
    card = _train(tmp_path, quadrants, f"gen1-{kind}", 1, kind, options, old=tmp_path / "gen0")
    assert card.device == torch.cuda.get_device_name(CUDA)
    assert all(math.isfinite(entry["loss"]) for entry in card.history)
    assert any(key.startswith("loss_") and key != "loss_classification" for key in card.history[-1])
    images, _ = quadrants
    model = load_model(tmp_path / f"gen1-{kind}")
    on_cpu = embed(model, images, 128, "cpu")
    on_gpu = embed(model, images, 128, CUDA)  # bf16 autocast
    assert mean_cosine(on_cpu, on_gpu) > 0.995


@pytest.mark.parametrize("kind", sorted(HEADS.names()))
def test_every_head_trains_on_the_gpu_and_applies_there_as_on_the_cpu(kind):
    data, classifier, _ = synthetic_pairs(n=1024)
    in_dim, out_dim = head_dims(kind, data.old.shape[1], data.new.shape[1])
    head = build_head(kind, in_dim, out_dim, 64, 2)
    result = fit_head(
        head,
        data,
        quick_training(kind, epochs=15),
        classifier=classifier if head.needs_classifier else None,
        device=CUDA,
    )
    assert result.epoch_losses[-1] < result.epoch_losses[0]
    source = data.old if head.direction == "forward" else data.new
    on_gpu = FrozenHead(head, CUDA).outputs(source)
    on_cpu = FrozenHead(head, "cpu").outputs(source)
    assert on_gpu.keys() == on_cpu.keys()
    for name in on_cpu:
        # TF32 matmuls on the GPU: agreement to about 1e-3 relative, not bit for bit.
        np.testing.assert_allclose(on_gpu[name], on_cpu[name], rtol=5e-3, atol=5e-3)


def test_ranking_metrics_on_gpu_tensors_equal_the_cpu_reference():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 20, 600)
    vectors = (
        rng.normal(size=(600, 32)).astype(np.float32) + 2 * np.eye(20, 32, dtype=np.float32)[labels]
    )
    scores = vectors @ vectors.T
    on_gpu = torch.from_numpy(scores).to(CUDA)
    assert leave_one_out_map(on_gpu, labels) == pytest.approx(
        leave_one_out_map(scores, labels), abs=1e-6
    )
    gpu_cmc = leave_one_out_cmc(on_gpu, labels, topk=(1, 5))
    cpu_cmc = leave_one_out_cmc(scores, labels, topk=(1, 5))
    for k in (1, 5):
        assert gpu_cmc[k] == pytest.approx(cpu_cmc[k], abs=1e-6)


def test_store_re_embedding_on_the_gpu_matches_the_cpu(tmp_path, quadrants):
    _train(tmp_path, quadrants, "gen0", 0)
    images = quadrants[0].numpy()
    on_gpu = model_embed_fn(tmp_path / "gen0", batch_size=64, device="cuda")(images)
    on_cpu = model_embed_fn(tmp_path / "gen0", batch_size=64, device="cpu")(images)
    assert on_gpu.shape == on_cpu.shape == (len(images), ARCH.embedding_dim)
    assert mean_cosine(on_cpu, on_gpu) > 0.995
