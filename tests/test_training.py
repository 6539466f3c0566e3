"""Training engine: augmentation, schedule, determinism, resume, NaN stop, strategies end to end."""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch

from modelupgrade.config.training import ArchitectureParams, TrainingParams
from modelupgrade.errors import UserError
from modelupgrade.layers import MLP
from modelupgrade.models import load_model, read_model_card
from modelupgrade.strategies import build_strategy
from modelupgrade.training import (
    RESUME_FILE,
    BatchAugment,
    Trainer,
    TrainingDivergedError,
    build_model,
    learning_rate,
)
from tests.data_fixtures import quadrant_images
from tests.model_fixtures import compatibility_strategies, resnet10t, train_generation

ARCH = ArchitectureParams(**resnet10t((8, 8, 16, 16), embedding_dim=8))
FAST = TrainingParams(epochs=2, batch_size=16, lr=0.05, warmup_epochs=0.5)


@pytest.fixture
def data():
    return quadrant_images(48)


def test_augment_keeps_shape_and_range_and_is_reproducible():
    images = torch.randint(0, 256, (5, 1, 12, 12), dtype=torch.uint8)
    augment = BatchAugment((0.5, 1.0), (3 / 4, 4 / 3), hflip=True)
    first = augment(images, torch.Generator().manual_seed(3))
    assert first.shape == (5, 1, 12, 12) and first.dtype == torch.float32
    assert 0.0 <= float(first.min()) and float(first.max()) <= 1.0
    assert torch.equal(first, augment(images, torch.Generator().manual_seed(3)))
    assert not torch.equal(first, augment(images, torch.Generator().manual_seed(4)))


def test_full_crop_without_flip_is_the_identity():
    images = torch.randint(0, 256, (3, 3, 10, 10), dtype=torch.uint8)
    out = BatchAugment((1.0, 1.0), (1.0, 1.0), hflip=False)(
        images, torch.Generator().manual_seed(0)
    )
    assert torch.allclose(out, images.float() / 255, atol=1e-5)


def test_schedule_warms_up_then_decays_to_the_floor():
    lrs = [learning_rate(s, 100, 10, 0.1, 1e-3, 1e-2) for s in range(101)]
    assert math.isclose(lrs[0], 1e-4) and math.isclose(lrs[10], 0.1)
    assert all(a <= b for a, b in itertools.pairwise(lrs[:11]))
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert math.isclose(lrs[100], 1e-3)


def _fit(data, tmp_path=None, params=FAST, strategy=None, old=None, seed=5):
    images, labels = data
    torch.manual_seed(seed)
    model = build_model(ARCH, images, labels)
    trainer = Trainer(params, seed=seed, resume_dir=tmp_path, progress=False)
    result = trainer.fit(model, images, labels, strategy or build_strategy("independent"), old)
    return model, result


def test_training_on_cpu_is_deterministic_for_a_seed(data):
    first, result = _fit(data)
    second, _ = _fit(data)
    for a, b in zip(first.state_dict().values(), second.state_dict().values()):
        assert torch.equal(a, b)
    assert len(result.history) == 2 and result.history[1]["loss"] < result.history[0]["loss"] * 1.5


def test_an_interrupted_run_resumes_after_its_last_epoch_and_ends_identical(
    data, tmp_path, monkeypatch
):
    uninterrupted, _ = _fit(data)
    strategy = build_strategy("independent")

    def crash(epoch, model, context):
        if epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(strategy, "on_epoch_start", crash)
    with pytest.raises(KeyboardInterrupt):
        _fit(data, tmp_path, strategy=strategy)
    assert (tmp_path / RESUME_FILE).is_file()
    resumed, result = _fit(data, tmp_path, seed=5)
    assert result.resumed_from_epoch == 1 and len(result.history) == 2
    for a, b in zip(uninterrupted.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


def test_a_nan_loss_stops_the_run_naming_the_step(data):
    # A NaN learning rate poisons the weights in step 1, so the loss of step 2 is the first NaN.

    with pytest.raises(TrainingDivergedError, match=r"epoch 1, step 2 of 3"):
        _fit(data, params=FAST.model_copy(update={"lr": float("nan")}), strategy=None)


def test_training_with_a_poisoned_step_reports_that_step(data):
    strategy = build_strategy("independent")
    calls = {"n": 0}

    def losses(step):
        calls["n"] += 1
        return {"poison": torch.tensor(float("inf"))} if calls["n"] == 5 else {}

    strategy.losses = losses
    with pytest.raises(TrainingDivergedError, match=r"epoch 2, step 2 of 3 \(global step 5\)"):
        _fit(data, strategy=strategy)


# _train(tmp_path, data, name, generation, strategy=None, options=None, old=None): this module's
# model and training, into tmp_path / name.
_train = functools.partial(train_generation, architecture=ARCH, training=FAST, seed=1)


def test_train_model_writes_cards_with_lineage_and_dmu_forward_head(tmp_path, data):
    card0 = _train(tmp_path, data, "gen0", 0)
    assert card0.generation == 0 and card0.parent is None and card0.strategy.kind == "independent"
    assert not (tmp_path / ".gen0.resume").exists()
    card1 = _train(tmp_path, data, "gen1-dmu", 1, "dmu", old=tmp_path / "gen0")
    assert card1.parent.path == str(tmp_path / "gen0")
    assert card1.strategy.options["weighting"] == "entropy"
    head = card1.forward_head
    psi = MLP(head.in_dim, head.out_dim, head.hidden_dim, head.depth)
    psi.load_state_dict(torch.load(tmp_path / "gen1-dmu" / head.file, weights_only=True))
    assert "dmu_fa" in "".join(card1.history[0])
    model = load_model(tmp_path / "gen1-dmu")
    assert model.embedding_dim == 8 and read_model_card(tmp_path / "gen1-dmu").seed == 1


@pytest.mark.parametrize("kind,options", compatibility_strategies("dmu"))
def test_every_strategy_trains_a_new_generation(tmp_path, data, kind, options):
    _train(tmp_path, data, "gen0", 0)
    card = _train(tmp_path, data, f"gen1-{kind}", 1, kind, options, old=tmp_path / "gen0")
    assert all(math.isfinite(entry["loss"]) for entry in card.history)
    assert any(key.startswith("loss_") and key != "loss_classification" for key in card.history[-1])


def test_mixed_upgrade_changes_architecture_and_dimension_only_where_allowed(tmp_path, data):
    _train(tmp_path, data, "gen0", 0)
    wider = ArchitectureParams(
        backbone="resnet18",
        backbone_kwargs={"channels": [8, 8, 8, 8]},
        cifar_stem=True,
        embedding_dim=12,
        image_size=20,
    )
    card = _train(
        tmp_path,
        data,
        "gen1-independent",
        1,
        "independent",
        old=tmp_path / "gen0",
        architecture=wider,
    )
    assert card.embedding_dim == 12 and card.input_size == 20
    with pytest.raises(UserError, match="same dimension"):
        _train(tmp_path, data, "gen1-bct", 1, "bct", old=tmp_path / "gen0", architecture=wider)
    same_dim = wider.model_copy(update={"embedding_dim": 8})
    assert (
        _train(
            tmp_path, data, "gen1-bct", 1, "bct", old=tmp_path / "gen0", architecture=same_dim
        ).embedding_dim
        == 8
    )


def test_generation_zero_refuses_a_strategy_and_later_generations_need_one(tmp_path, data):
    with pytest.raises(UserError, match="generation 0"):
        _train(tmp_path, data, "gen0", 0, "bct")
    with pytest.raises(UserError, match="needs a strategy"):
        _train(tmp_path, data, "gen1", 1)
    with pytest.raises(UserError, match="previous generation"):
        _train(tmp_path, data, "gen1", 1, "bct")
