"""One head of params.yaml, trained on cached embedding files (or taken from its new model's
training) and saved with its card: what the train_heads stage and the flows' head task run.

The head trains on a split's old and new embeddings (row i = image i in both) with that split's
labels. A kind whose head can come out of the new model's own training (DMU's jointly trained ψ,
``Head.trained_with``) uses that head instead. ``previous_heads`` (sequential upgrades) trains on
the chain's current gallery state of the old embeddings, mixed with the generation before when
``input_momentum`` > 0.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from modelupgrade.arrays import load_array, mean_row_cosine
from modelupgrade.config import Params
from modelupgrade.config.heads import HeadParams, HeadTraining
from modelupgrade.errors import UserError
from modelupgrade.heads.base import HEADS, EmbeddingPairs, Head, build_head, head_dims
from modelupgrade.heads.card import HeadCard
from modelupgrade.heads.chain import HeadChain
from modelupgrade.heads.inference import apply
from modelupgrade.heads.persistence import load_head, read_head_card, save_head
from modelupgrade.heads.training import TrainingResult, fit_head, resolve_training
from modelupgrade.io import file_sha256
from modelupgrade.json_data import JsonObject
from modelupgrade.layers import MarginClassifier
from modelupgrade.runtime import describe_device, seed_everything, select_device

log = logging.getLogger(__name__)


def head_entry(params: Params, name: str) -> HeadParams:
    """The entry ``heads.<name>`` of params.yaml."""
    if name not in params.heads:
        raise UserError(
            f"params.yaml defines no head {name!r}",
            hint=f"heads defined: {', '.join(params.heads) or 'none'}",
        )
    return params.heads[name]


def load_embeddings(path: str | Path, what: str) -> np.ndarray:
    return np.ascontiguousarray(load_array(path, what), dtype=np.float32)


def load_labels(path: str | Path) -> np.ndarray:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"labels file {path} does not exist", hint="run the split stage first")
    frame = pd.read_parquet(path, columns=None)
    if "label" not in frame.columns:
        raise UserError(
            f"{path} has no 'label' column", hint="pass a split file (rows of the manifest)"
        )
    return frame["label"].to_numpy(dtype=np.int64)


def load_new_classifier(model_dir: str | Path) -> MarginClassifier:
    from modelupgrade.models import load_model

    return load_model(model_dir).classifier


def source_entry(path: str | Path | None) -> dict[str, str] | None:
    """A training input as the head's card records it: its path and, where it is a file (or a
    model directory), a hash."""
    if path is None:
        return None
    path = Path(path)
    entry = {"path": str(path)}  # strings only: the path and its hash
    if path.is_file():
        entry["sha256"] = file_sha256(path)
    elif (path / "card.json").is_file():
        entry["card_sha256"] = file_sha256(path / "card.json")
    return entry


def fit_cosine(
    head: Head, inputs: np.ndarray, targets: np.ndarray, side_info: np.ndarray | None
) -> float:
    """Mean cosine between the head's transform of the training inputs and the training targets."""
    return mean_row_cosine(apply(head, inputs, side_info=side_info), targets)


def training_record(
    head: Head, training: HeadTraining, result: TrainingResult, device: Any, seed: int
) -> JsonObject:
    """How a head was fitted, as its card records it: closed form (the fit's loss and time), or
    the resolved training settings and the loss history of its epochs."""
    if not head.iterative:
        fitted: JsonObject = {"mode": "closed-form"}
    else:
        fitted = {
            "mode": "standalone",
            **training.as_dict(),
            "epoch_losses": [*result.epoch_losses],
        }
    return {
        **fitted,
        "final_loss": result.final_loss,
        "steps": result.steps,
        "seconds": round(result.seconds, 3),
        "device": describe_device(device),
        "seed": seed,
    }


def train_and_save_head(
    params: Params,
    name: str,
    old_embeddings: str | Path,
    new_embeddings: str | Path,
    labels: str | Path,
    out: str | Path,
    new_model: str | Path | None = None,
    old_model: str | Path | None = None,
    side_info: str | Path | None = None,
    previous_heads: Sequence[str | Path] = (),
) -> HeadCard:
    """Train (or take from the new model's training) the head ``heads.<name>`` and save it to
    ``out``; returns its card."""
    head_params = head_entry(params, name)
    training = resolve_training(head_params)
    seed_everything(params.seed)

    old = load_embeddings(old_embeddings, "old embeddings")
    new = load_embeddings(new_embeddings, "new embeddings")
    side = load_embeddings(side_info, "side information") if side_info is not None else None
    data = EmbeddingPairs(old, new, load_labels(labels), side)
    previous_dirs = [str(p) for p in previous_heads]
    chain = chain_input(name, head_params, training, previous_dirs, old)
    in_dim, out_dim = head_dims(head_params.kind, old.shape[1], new.shape[1])
    if chain.inputs is not None:
        in_dim = chain.inputs.shape[1]
    joint = joint_head(name, head_params, new_model, in_dim, out_dim)
    if joint is not None:
        head: Head = joint
        record: JsonObject = {"mode": "joint", "trained_with": str(new_model)}
    else:
        head, record = standalone_head(
            params, head_params, training, data, (in_dim, out_dim), new_model, chain.inputs
        )
    source_vectors = (
        chain.inputs if chain.inputs is not None else (old if head.direction == "forward" else new)
    )
    target_vectors = new if head.direction == "forward" else old
    record["fit_cosine"] = fit_cosine(
        head, source_vectors, target_vectors, old if head.takes_old_embedding else side
    )
    card = save_head(
        head,
        out,
        name=name,
        input_momentum=chain.momentum,
        previous_heads=previous_dirs,
        training=record,
        sources={
            "old_embeddings": source_entry(old_embeddings),
            "new_embeddings": source_entry(new_embeddings),
            "labels": source_entry(labels),
            "new_model": source_entry(new_model),
            "old_model": source_entry(old_model),
            "side_info": source_entry(side_info),
        },
    )
    log.info(
        "head %s (%s) saved to %s: fit cosine %.4f, %d MACs per embedding",
        name,
        head_params.kind,
        out,
        record["fit_cosine"],
        card.macs_per_embedding,
    )
    return card


@dataclass(frozen=True)
class ChainInput:
    """What a head of a sequential chain trains on: the chain's current gallery state of the old
    embeddings (None for a head that takes them as they are), and its input momentum."""

    inputs: np.ndarray | None
    momentum: float


def chain_input(
    name: str,
    head_params: HeadParams,
    training: HeadTraining,
    previous_dirs: Sequence[str],
    old: np.ndarray,
) -> ChainInput:
    """The input of head ``name`` after the chain's ``previous_dirs`` heads (oldest first)."""
    # BiCT Eq. 9: ψ_1 takes F_0 itself; the momentum mix of F_{i−1} and F_{i−2} starts at ψ_2, so
    # one head entry serves every generation of a chain.
    momentum = training.input_momentum if previous_dirs else 0.0
    if training.input_momentum and not previous_dirs:
        log.info(
            "heads.%s: the first head of a chain takes the old vectors as they are; its "
            "input_momentum %s applies from the second generation on",
            name,
            training.input_momentum,
        )
    if not previous_dirs:
        return ChainInput(None, momentum)
    if HEADS.get(head_params.kind).direction != "forward":
        raise UserError(
            "--previous-heads chains forward adapters; a reverse head cannot follow them"
        )
    previous = [load_head(d)[0] for d in previous_dirs]
    momenta = [read_head_card(d).input_momentum for d in previous_dirs]
    return ChainInput(HeadChain(previous, momenta).next_input(old, momentum), momentum)


def joint_head(
    name: str, head_params: HeadParams, new_model: str | Path | None, in_dim: int, out_dim: int
) -> Head | None:
    """The head of this kind trained jointly with ``new_model`` (DMU's ψ), checked to map the
    embeddings' widths; None where the kind has none there."""
    if new_model is None:
        return None
    head = HEADS.get(head_params.kind).trained_with(new_model, head_params.options)
    if head is None:
        return None
    if (head.in_dim, head.out_dim) != (in_dim, out_dim):
        raise UserError(
            f"the head trained with {new_model} maps {head.in_dim}-d to {head.out_dim}-d, "
            f"but the embeddings are {in_dim}-d old and {out_dim}-d new",
            hint="pass the embeddings of the models this head was trained with",
        )
    log.info("head %s: using the head trained jointly with %s", name, new_model)
    return head


def standalone_head(
    params: Params,
    head_params: HeadParams,
    training: HeadTraining,
    data: EmbeddingPairs,
    dims: tuple[int, int],
    new_model: str | Path | None,
    inputs: np.ndarray | None,
) -> tuple[Head, JsonObject]:
    """A new head of ``dims`` (input, output) trained on ``data`` (its input replaced by
    ``inputs`` where given), through the new model's classifier where its kind needs it; returns
    it on the CPU with its training record."""
    device = select_device(params.device)
    # Loaded before the head is built: building the new model draws from the seeded RNG the
    # head's initial weights then come from.
    classifier = (
        load_new_classifier(new_model)
        if HEADS.get(head_params.kind).needs_classifier and new_model is not None
        else None
    )
    head = build_head(
        head_params.kind,
        *dims,
        training.hidden_dim,
        training.depth,
        options=head_params.options,
        side_info_dim=0 if data.side_info is None else data.side_info.shape[1],
    )
    result = fit_head(
        head, data, training, classifier, device=device, seed=params.seed, inputs=inputs
    )
    return head.cpu(), training_record(head, training, result, device, params.seed)
