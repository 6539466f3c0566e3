"""Training a head on cached embeddings: the whole training set sits on the device as tensors.

No backbone runs here. Each step slices a batch out of the cached old/new embeddings, the head
computes its own loss (``Head.loss``), and SGD or Adam steps under the per-iteration cosine schedule
with linear warm-up of ``modelupgrade.schedule`` (the papers' timm ``CosineLRScheduler`` setting).
Heads whose loss needs several images per class (MCL) get class-balanced batches. Training-free
adapters are fitted in closed form first (``Head.fit_closed_form``); those that are not iterative
run no epochs.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from modelupgrade.config.heads import HeadParams, HeadTraining
from modelupgrade.errors import UserError
from modelupgrade.heads.base import HEADS, EmbeddingPairs, Head, HeadBatch
from modelupgrade.layers import MarginClassifier
from modelupgrade.schedule import learning_rate

log = logging.getLogger(__name__)


def resolve_training(params: HeadParams) -> HeadTraining:
    """The head kind's paper defaults with every field params.yaml sets replaced."""
    defaults = HEADS.get(params.kind).TRAINING_DEFAULTS
    return HeadTraining.from_defaults(defaults, **params.training_overrides())


@dataclass
class TrainingResult:
    epoch_losses: list[float] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0

    @property
    def final_loss(self) -> float:
        return self.epoch_losses[-1] if self.epoch_losses else math.nan


def epoch_batches(
    labels: np.ndarray,
    batch_size: int,
    class_balanced: bool,
    samples_per_class: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Index batches for one epoch; every batch has ≥ 2 rows (BatchNorm needs two)."""
    n = len(labels)
    if class_balanced:
        # Shuffle each class, cut it into groups of K, shuffle the groups: every class present in
        # a batch comes with K images, so each anchor has positives.
        groups: list[np.ndarray] = []
        for cls in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == cls))
            groups.extend(np.array_split(members, max(1, len(members) // samples_per_class)))
        order = np.concatenate([groups[i] for i in rng.permutation(len(groups))])
    else:
        order = rng.permutation(n)
    batches = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    if len(batches) > 1 and len(batches[-1]) < 2:
        batches[-2] = np.concatenate(batches[-2:])
        batches.pop()
    return batches


def _freeze_batchnorm(module: nn.Module) -> None:
    for child in module.modules():
        if isinstance(child, nn.BatchNorm1d):
            child.eval()


def fit_head(
    head: Head,
    data: EmbeddingPairs,
    training: HeadTraining,
    classifier: MarginClassifier | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
    inputs: np.ndarray | None = None,
) -> TrainingResult:
    """Train ``head`` in place on cached embeddings and return its loss history.

    ``inputs`` replaces the head's source embeddings (e.g. the momentum input of a sequential BiCT
    generation, or the chain's current gallery state) while the targets stay ``data``'s. The head's
    ``fit_closed_form`` runs first on the whole training set; a head that is not ``iterative``
    (Procrustes, low-rank affine, SLERP) stops there: no epochs, its fit's loss is the record.
    """
    device = torch.device(device)
    old_dim, new_dim = data.old.shape[1], data.new.shape[1]
    source_dim = old_dim if head.direction == "forward" else new_dim
    target_dim = new_dim if head.direction == "forward" else old_dim
    if inputs is not None:
        if inputs.ndim != 2 or inputs.shape[0] != len(data):
            raise UserError(f"input array of shape {inputs.shape} for {len(data)} training images")
        source_dim = inputs.shape[1]
    if (source_dim, target_dim) != (head.in_dim, head.out_dim):
        raise UserError(
            f"head {head.registry_name!r} maps {head.in_dim}-d to {head.out_dim}-d vectors, but "
            f"the training embeddings give {source_dim}-d inputs and {target_dim}-d targets",
            hint="check --old-embeddings / --new-embeddings "
            "(a forward head maps old → new, a reverse head new → old)",
        )
    # A head that reads the old embedding of its input (SLERP) trains with the old embeddings of
    # the training images as that side input.
    side_array = data.old if head.takes_old_embedding else data.side_info
    if (side_array is None) != (head.side_info_dim == 0) or (
        side_array is not None and side_array.shape[1] != head.side_info_dim
    ):
        raise UserError(
            f"head {head.registry_name!r} expects side information of width {head.side_info_dim}"
        )
    if head.needs_classifier and classifier is None:
        raise UserError(
            f"head {head.registry_name!r} trains through the new model's "
            "classifier, but none was given",
            hint="pass --new-model <dir of the new model>",
        )
    if classifier is not None:
        n_classes = int(data.labels.max()) + 1
        if classifier.num_classes < n_classes or classifier.weight.shape[1] != head.out_dim:
            raise UserError(
                f"the new classifier ({classifier.num_classes} classes, "
                f"{classifier.weight.shape[1]}-d) does not fit the training data ({n_classes} "
                f"classes, {head.out_dim}-d head output)",
                hint="use the classifier of the model whose embeddings are --new-embeddings",
            )
        # A frozen private copy: the caller's classifier keeps its mode and gradients.
        classifier = copy.deepcopy(classifier).to(device).eval().requires_grad_(False)

    def to_device(array: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        # a copy: inputs may be read-only
        return torch.tensor(np.asarray(array), dtype=dtype, device=device)

    old = to_device(data.old)
    new = to_device(data.new)
    if inputs is not None:
        replaced = to_device(inputs)
        old, new = (replaced, new) if head.direction == "forward" else (old, replaced)
    labels = to_device(data.labels, torch.int64)
    side_info = None if side_array is None else to_device(side_array)

    head.to(device).train()
    started = time.perf_counter()
    with torch.no_grad():
        if head.direction == "forward":
            head.fit_closed_form(old, new)
        else:
            head.fit_closed_form(new, old)
        # A closed form with a hyper-parameter chosen on held-out pairs (SLERP's α) chooses it.
        head.calibrate(HeadBatch(old, new, labels, side_info, classifier))
    if not head.iterative:
        # Fitted in closed form: the training loss of the fit is the whole record.
        head.eval()
        with torch.no_grad():
            loss = head.loss(HeadBatch(old, new, labels, side_info, classifier))
        seconds = time.perf_counter() - started
        log.info("head %s fitted in closed form: loss %.5f", head.registry_name, float(loss))
        return TrainingResult([float(loss)], 0, seconds)
    parameters = [p for p in head.parameters() if p.requires_grad]
    if training.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            parameters,
            lr=training.lr,
            momentum=training.momentum,
            weight_decay=training.weight_decay,
        )
    else:
        optimizer = torch.optim.Adam(parameters, lr=training.lr, weight_decay=training.weight_decay)

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    samples_per_class = getattr(head.options, "samples_per_class", 2)

    def batches(generator: np.random.Generator) -> list[np.ndarray]:
        return epoch_batches(
            data.labels,
            training.batch_size,
            head.class_balanced_batches,
            samples_per_class,
            generator,
        )

    steps_per_epoch = len(batches(np.random.default_rng(0)))
    total_steps = steps_per_epoch * training.epochs
    warmup_steps = round(training.warmup_epochs * steps_per_epoch)
    freeze_epoch = (
        math.ceil(training.freeze_bn_after * training.epochs)
        if training.freeze_bn_after < 1
        else None
    )

    result = TrainingResult()
    step = 0
    for epoch in range(training.epochs):
        if freeze_epoch is not None and epoch >= freeze_epoch:
            _freeze_batchnorm(head)
        losses = []
        for rows in batches(rng):
            index = torch.as_tensor(rows, device=device)
            batch = HeadBatch(
                old=old[index],
                new=new[index],
                labels=labels[index],
                side_info=None if side_info is None else side_info[index],
                classifier=classifier,
            )
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(
                    step,
                    total_steps,
                    warmup_steps,
                    training.lr,
                    training.warmup_start_ratio,
                    training.lr_min_ratio,
                )
            loss = head.loss(batch)
            if not torch.isfinite(loss):
                raise UserError(
                    f"head {head.registry_name!r} diverged (loss {loss.item()}) "
                    f"at epoch {epoch + 1}",
                    hint="lower heads.<name>.lr in params.yaml",
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            step += 1
        result.epoch_losses.append(float(torch.stack(losses).mean()))
        log.info(
            "head %s epoch %d/%d loss %.5f",
            head.registry_name,
            epoch + 1,
            training.epochs,
            result.epoch_losses[-1],
        )
    result.steps = step
    result.seconds = time.perf_counter() - started
    head.eval()
    return result
