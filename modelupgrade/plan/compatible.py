"""A compatible (BCT-family) successor in the plan that was not given: its training time estimated
from a short probe (``compatible_training_estimate``). One that was given is scored by
``Measuring.compatible``."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelupgrade.config import Params
from modelupgrade.data.vector_table import is_vector_table
from modelupgrade.errors import UserError
from modelupgrade.plan.sample import PlanSample

# Images of the sample the compatible-training probe trains on for one epoch.
TRAINING_PROBE_IMAGES = 1024


def compatible_training_estimate(
    params: Params,
    old_dir: Path,
    new_card: Any,
    architecture: str | None,
    strategy: str,
    sample: PlanSample,
    training_images: int | None,
    device: torch.device,
) -> tuple[float | None, str]:
    """(estimated training seconds, how it was estimated) of a compatible successor: a one-epoch
    probe of ``train_model`` under ``strategy`` on part of the sample times this machine's
    training throughput, scaled to ``params.training.epochs`` over ``training_images`` (default:
    the images the new model was trained on, else the sample's)."""
    from modelupgrade.training import train_model
    from modelupgrade.training.generation import load_split_images

    if strategy not in params.strategies:
        raise UserError(
            f"--compatible-strategy {strategy!r} is not a strategy of params.yaml",
            hint=f"strategies: {', '.join(params.strategies) or 'none'}",
        )
    if is_vector_table(old_dir):
        return None, (
            "training time not measured: the old model is a vector table, which a compatible "
            "strategy cannot train against (adopt it: `modelupgrade adopt`, kind embeddings)."
        )
    if architecture is not None:
        if architecture not in params.architectures:
            raise UserError(
                f"--compatible-architecture {architecture!r} is not an architecture of params.yaml",
                hint=f"architectures: {', '.join(params.architectures)}",
            )
        arch, arch_name = params.architectures[architecture], architecture
    elif new_card.architecture is not None:
        arch, arch_name = new_card.architecture, new_card.architecture_name or "new"
    else:
        return None, (
            "training time not measured: the new model was adopted, so no architecture to "
            "fine-tune is known (pass --compatible-architecture NAME)."
        )
    probe = sample.fit.iloc[: min(len(sample.fit), TRAINING_PROBE_IMAGES)].reset_index(drop=True)
    images = load_split_images(probe, params)
    labels = torch.from_numpy(probe["label"].to_numpy(np.int64, copy=True))
    training = params.training.model_copy(update={"epochs": 1})
    with tempfile.TemporaryDirectory(prefix="plan-probe-") as scratch:
        card = train_model(
            architecture=arch,
            architecture_name=arch_name,
            training=training,
            images=images,
            labels=labels,
            out_dir=Path(scratch) / "probe",
            generation=1,
            seed=params.seed,
            device=device,
            strategy_name=strategy,
            strategy_params=params.strategies[strategy],
            old_model_dir=old_dir,
            data={"split": "plan probe"},
            resume_dir=Path(scratch) / "resume",
            progress=False,
            item_ids=probe["item_id"].astype(str).tolist(),
        )
    # train_model returns the card it saved (a ModelCard; a dict where a test stands in for it).
    rate = (
        card["train_images_per_second"] if isinstance(card, dict) else card.train_images_per_second
    )
    assert rate is not None, "train_model's card records its training speed"
    count = training_images or int(new_card.data.get("images") or len(sample.fit))
    epochs = params.training.epochs
    seconds = epochs * count / rate
    return seconds, (
        f"not trained: {strategy} training estimated at {rate:.0f} images/s (a 1-epoch probe on "
        f"{len(probe)} sample images), {epochs} epochs × {count:,} images; quality unknown until "
        "it is trained (pass --compatible-model DIR)."
    )
