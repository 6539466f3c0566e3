"""Did a model train? Statistics of its fit to its own training images, and the gate they pass.

A claim measured on a model that never left the loss plateau is a statement about the training
budget, not about the method. After training, the model embeds its own (unaugmented) training
images and these are measured:

- the loss curve's start and end (the first and the last epoch's mean loss);
- nearest-prototype accuracy: each image's class is the class whose mean embedding is nearest
  (what retrieval by these embeddings can achieve on the data the model saw);
- the classifier's accuracy, and its agreement with the nearest prototype: a classifier whose
  weights point away from its own embeddings (cosine ≈ 0) agrees with them no better than chance;
- collapse: the mean cosine of the embeddings to their own mean direction (1: every image on one
  point of the sphere).

``ConvergenceGate`` (``evaluation.convergence`` in params.yaml) turns them into a verdict with the
reasons it failed; the report shows every model's statistics and the claims resting on a model
that failed it are "not tested".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from modelupgrade.config.evaluation import ConvergenceGateParams

# The file beside a model's embeddings (and a head's outputs) that holds its fit: the evaluation
# reads it there, without loading the model.
FIT_FILE = "training_fit.json"


@dataclass(frozen=True)
class TrainingFit:
    """How well a trained model fits its own training images (see the module docstring).
    Accuracies and agreement are fractions of the training images; NaN where not measurable (no
    classifier, no loss history)."""

    steps: int
    images: int
    loss_start: float
    loss_end: float
    prototype_accuracy: float
    classifier_accuracy: float
    classifier_agreement: float
    collapse: float

    @property
    def loss_ratio(self) -> float:
        """The last epoch's loss as a fraction of the first's."""
        if not (np.isfinite(self.loss_start) and self.loss_start > 0):
            return float("nan")
        return self.loss_end / self.loss_start

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, float | int]) -> TrainingFit:
        # Each field's value is of its own type in the JSON this reads (as_dict wrote it).
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})  # type: ignore[arg-type]


def measure_fit(
    embeddings: np.ndarray,
    labels: np.ndarray,
    logits: np.ndarray | None,
    losses: Sequence[float],
    steps: int,
) -> TrainingFit:
    """The fit of a model from its embeddings of its training images (N, D), their labels, its
    classifier's logits on them (None: no classifier) and its per-epoch mean losses."""
    unit = _unit_rows(np.asarray(embeddings, dtype=np.float64))
    labels = np.asarray(labels)
    classes = np.unique(labels)
    prototypes = _unit_rows(np.stack([unit[labels == c].mean(axis=0) for c in classes]))
    nearest = classes[np.argmax(unit @ prototypes.T, axis=1)]
    mean_direction = _unit_rows(unit.mean(axis=0, keepdims=True))[0]
    if logits is None:
        classifier_accuracy = agreement = float("nan")
    else:
        predicted = np.argmax(np.asarray(logits), axis=1)
        classifier_accuracy = float(np.mean(predicted == labels))
        agreement = float(np.mean(predicted == nearest))
    return TrainingFit(
        steps=int(steps),
        images=len(labels),
        loss_start=float(losses[0]) if len(losses) else float("nan"),
        loss_end=float(losses[-1]) if len(losses) else float("nan"),
        prototype_accuracy=float(np.mean(nearest == labels)),
        classifier_accuracy=classifier_accuracy,
        classifier_agreement=agreement,
        collapse=float(np.mean(unit @ mean_direction)),
    )


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@dataclass(frozen=True)
class GateVerdict:
    """Whether a model passed the convergence gate, and each threshold it missed."""

    passed: bool
    reasons: tuple[str, ...]

    @property
    def text(self) -> str:
        return "converged" if self.passed else "did not converge: " + "; ".join(self.reasons)


def judge_fit(fit: TrainingFit, gate: ConvergenceGateParams) -> GateVerdict:
    """The gate's verdict on one model's fit (a NaN statistic is not held against it: a model
    without a classifier has no classifier agreement)."""
    reasons = []
    if fit.loss_ratio > gate.max_loss_ratio:
        reasons.append(
            f"loss fell only to {fit.loss_ratio:.2f} of its first epoch's "
            f"({fit.loss_start:.3g} → {fit.loss_end:.3g}; gate ≤ {gate.max_loss_ratio:.2f})"
        )
    if fit.prototype_accuracy < gate.min_prototype_accuracy:
        reasons.append(
            f"nearest-prototype accuracy {fit.prototype_accuracy:.2f} on its training images "
            f"(gate ≥ {gate.min_prototype_accuracy:.2f})"
        )
    if fit.classifier_agreement < gate.min_classifier_agreement:
        reasons.append(
            f"classifier agrees with its own prototypes on {fit.classifier_agreement:.2f} of "
            f"them (gate ≥ {gate.min_classifier_agreement:.2f})"
        )
    if fit.collapse > gate.max_collapse:
        reasons.append(
            f"embeddings collapsed: mean cosine {fit.collapse:.2f} to their mean direction "
            f"(gate ≤ {gate.max_collapse:.2f})"
        )
    return GateVerdict(not reasons, tuple(reasons))


def fit_of_trained_model(
    model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, history: Sequence[dict]
) -> TrainingFit:
    """Measure a just-trained embedding model on its training images (embedded without
    augmentation, as retrieval embeds them)."""
    from modelupgrade.models import classifier_logits, embed

    # ``model`` is the EmbeddingModel just trained, typed here as the module it also is.
    embeddings = embed(model, images, 1024, next(model.parameters()).device)  # type: ignore[arg-type]
    logits = classifier_logits(model, embeddings)  # type: ignore[arg-type]
    steps = int(history[-1].get("steps", 0)) if history else 0
    return measure_fit(
        embeddings, labels.cpu().numpy(), logits, [float(h["loss"]) for h in history], steps
    )
