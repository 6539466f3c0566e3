"""The convergence gate: a model's fit to its own training images, measured after training, and the
verdict that keeps a claim resting on an untrained model from being judged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from modelupgrade.config.evaluation import ConvergenceGateParams
from modelupgrade.config.training import ArchitectureParams, TrainingParams
from modelupgrade.evaluation.convergence import head_convergence, late_change, model_convergence
from modelupgrade.io import write_json
from modelupgrade.strategies import build_strategy
from modelupgrade.training import Trainer, build_model
from modelupgrade.training.convergence import (
    FIT_FILE,
    fit_of_trained_model,
    judge_fit,
    measure_fit,
)
from modelupgrade.training.engine import TrainingPlan
from tests.data_fixtures import quadrant_images
from tests.model_fixtures import resnet10t

GATE = ConvergenceGateParams()
ARCH = ArchitectureParams(**resnet10t((8, 8, 16, 16), embedding_dim=8), scale=16)


def clusters(spread: float, classes: int = 4, per_class: int = 50, dim: int = 8):
    """Unit embeddings around ``classes`` orthogonal directions, ``spread`` the noise."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(classes), per_class)
    x = np.eye(dim)[labels] + spread * rng.standard_normal((len(labels), dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True), labels


def test_a_trained_fit_passes_and_each_failure_is_named() -> None:
    embeddings, labels = clusters(0.2)
    aligned = embeddings @ np.eye(8)[:4].T * 16  # a classifier whose weights are the centres
    fit = measure_fit(embeddings, labels, aligned, [9.0, 3.0, 1.0], steps=300)
    assert fit.prototype_accuracy == 1.0 and fit.classifier_agreement == 1.0
    assert fit.collapse < 0.6 and fit.loss_ratio == pytest.approx(1 / 9)
    assert judge_fit(fit, GATE).passed
    # The ArcFace plateau: the loss barely left its start.
    stuck = measure_fit(embeddings, labels, aligned, [9.6, 9.5, 9.4], steps=40)
    verdict = judge_fit(stuck, GATE)
    assert not verdict.passed and "loss fell only to 0.98" in verdict.text
    # Collapsed embeddings: every image on nearly one point, whatever the classifier says.
    collapsed, _ = clusters(0.2)
    collapsed = 0.05 * collapsed + np.ones(8)
    collapsed /= np.linalg.norm(collapsed, axis=1, keepdims=True)
    squashed = judge_fit(measure_fit(collapsed, labels, aligned, [9.0, 1.0], 300), GATE)
    assert any("collapsed" in reason for reason in squashed.reasons)
    # A classifier whose weights point away from the model's own embeddings.
    rng = np.random.default_rng(1)
    stray = judge_fit(measure_fit(embeddings, labels, rng.random((200, 4)), [9.0, 1.0], 300), GATE)
    assert any("classifier agrees" in reason for reason in stray.reasons)
    # A model without a classifier (adopted) is not held to classifier agreement.
    assert judge_fit(measure_fit(embeddings, labels, None, [9.0, 1.0], 300), GATE).passed


def test_a_model_trained_two_steps_is_caught_and_its_claims_are_not_tested(tmp_path: Path) -> None:
    from tests.test_claims import BCT_BACKWARD_COMPATIBLE, judged, scenario, study

    images, labels = quadrant_images(48, noise_max=160)
    torch.manual_seed(0)
    model = build_model(ARCH, images, labels)
    two_steps = TrainingParams(steps=2, warmup_steps=0, batch_size=16, lr=0.05)
    result = Trainer(two_steps, seed=0, progress=False).fit(
        model, images, labels, build_strategy("independent")
    )
    fit = fit_of_trained_model(model, images, labels, result.history)
    assert fit.steps == 2
    # Written beside its embeddings as the training stage writes it, read as the evaluation does.
    write_json(tmp_path / FIT_FILE, fit.as_dict())
    record = model_convergence(tmp_path, GATE)
    assert record is not None and not record.passed
    assert any("embeddings collapsed" in r or "classifier agrees" in r for r in record.reasons)
    # As the old model of a scenario whose numbers would make BCT's claim hold (or fail): it is
    # not tested either way.
    for backward in (0.66, 0.60):
        sc = scenario(bct_backward=backward)
        sc.evaluation = sc.evaluation.model_copy(update={"convergence": {"gen0": record}})
        claim = judged(study(sc))[BCT_BACKWARD_COMPATIBLE]
        assert claim.verdict == "not tested (anchor model did not converge)"


def test_the_evaluation_reads_the_fit_beside_the_embeddings(tmp_path: Path) -> None:
    embeddings, labels = clusters(0.2)
    write_json(tmp_path / FIT_FILE, measure_fit(embeddings, labels, None, [9.6, 9.5], 40).as_dict())
    record = model_convergence(tmp_path, GATE)
    assert record is not None and not record.passed
    assert record.statistics["loss_ratio"] == pytest.approx(9.5 / 9.6)
    # A model trained elsewhere (adopted) has no fit: nothing to judge.
    assert model_convergence(tmp_path / "nothing", GATE) is None


def test_a_step_budget_makes_the_same_steps_of_any_data_size() -> None:
    params = TrainingParams(steps=750, warmup_steps=25, batch_size=64)
    old, new = TrainingPlan.of(params, 450, 64), TrainingPlan.of(params, 1500, 64)
    assert old.total_steps == new.total_steps == 750
    assert (old.epochs, new.epochs) == (108, 33)  # 7 and 23 steps an epoch
    assert new.steps_in_epoch(32) == 750 - 32 * 23
    by_epochs = TrainingPlan.of(TrainingParams(epochs=3, batch_size=64), 1500, 64)
    assert (by_epochs.total_steps, by_epochs.epochs) == (69, 3)


def test_heads_are_judged_by_what_they_train_for() -> None:
    aligned = {"fit_cosine": 0.94, "epoch_losses": [0.2, 0.01, 0.002], "mode": "standalone"}
    assert head_convergence(aligned, GATE, training_free=False, aligns=True).passed
    astray = head_convergence({**aligned, "fit_cosine": 0.06}, GATE, False, True)
    assert not astray.passed and "mean cosine" in astray.reasons[0]
    # A metric-trained head (MCL) is judged by its loss having flattened, not by alignment.
    flat = [5.6, 5.4, 5.2, *[5.05] * 20]
    assert head_convergence({"fit_cosine": 0.2, "epoch_losses": flat}, GATE, False, False).passed
    moving = [5.6, *np.linspace(5.5, 3.0, 20)]
    still = head_convergence({"fit_cosine": 0.2, "epoch_losses": list(moving)}, GATE, False, False)
    assert not still.passed and late_change(list(moving)) > GATE.max_late_change
    # DMU's ψ trained jointly with its model is the model's (its record passes here).
    joint = {"fit_cosine": 0.5, "mode": "joint"}
    assert head_convergence(joint, GATE, False, False).passed


def test_an_aligning_heads_held_out_alignment_is_recorded_not_gated() -> None:
    aligned = {"fit_cosine": 0.94, "epoch_losses": [0.2, 0.01, 0.002], "mode": "standalone"}
    # Far below the gate on the gallery: shown beside the training alignment, not a failure.
    record = head_convergence(aligned, GATE, False, True, held_out_alignment=0.3)
    assert record.passed and record.statistics["held_out_alignment"] == 0.3
    adapter = head_convergence({"fit_cosine": 0.8}, GATE, True, False, held_out_alignment=0.7)
    assert adapter.statistics["held_out_alignment"] == 0.7
    # A head trained through a classifier or a batch metric maps to no embedding of its own.
    flat = [5.6, 5.4, 5.2, *[5.05] * 20]
    metric = head_convergence({"epoch_losses": flat}, GATE, False, False, held_out_alignment=0.1)
    assert "held_out_alignment" not in metric.statistics
    assert "held_out_alignment" not in head_convergence(aligned, GATE, False, True).statistics
