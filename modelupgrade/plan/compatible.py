"""A compatible (BCT-family) successor in the plan: scored when one is given
(``compatible_options``), else its training time estimated from a short probe
(``compatible_training_estimate``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from modelupgrade.config import Params
from modelupgrade.data.vector_table import is_vector_table
from modelupgrade.errors import UserError
from modelupgrade.plan.records import OptionMeasure, duration
from modelupgrade.plan.sample import PlanSample, embed_sample

if TYPE_CHECKING:
    from modelupgrade.plan.measure import Measuring

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


def compatible_options(measuring: Measuring, model_dir: Path) -> list[OptionMeasure]:
    """A trained compatible successor: without a backfill (its queries against the old gallery)
    and after a re-embedding backfill."""
    from modelupgrade.models import read_model_card

    card = read_model_card(model_dir)
    vectors = embed_sample(measuring.params, model_dir, measuring.parts, measuring.device)
    if vectors.seconds_per_image is None:
        raise UserError(
            f"the compatible model {model_dir} is embeddings-only: it cannot embed queries",
            hint="pass a model trained with `modelupgrade train --strategy ...`",
        )
    # Already trained: what it took is shown, not counted, as for the new model itself.
    trained = (
        f"already trained, in {duration(card.train_seconds)} on "
        f"{card.device or 'an unrecorded device'} (its card)."
        if card.train_seconds is not None
        else "already trained (its card records no training time)."
    )
    old_query_metrics, old_flips = measuring.score(vectors.query, measuring.old_vectors.gallery)
    metrics, flips = measuring.score(vectors.query, vectors.gallery)
    auc, points, note = measuring.curve(vectors.query, vectors.gallery, True)
    return [
        OptionMeasure(
            "compatible",
            "compatible",
            "compatible model, no backfill: M(compatible, old gallery)",
            old_query_metrics,
            old_flips,
            training_note=trained,
        ),
        OptionMeasure(
            "compatible/backfill",
            "compatible",
            "compatible model, every gallery image re-embedded: M(compatible, compatible)",
            metrics,
            flips,
            seconds_per_image=vectors.seconds_per_image,
            timing_spread=None if vectors.timing is None else vectors.timing.spread,
            training_note=trained,
            backfill_auc=auc,
            backfill_curve=points,
            note=note,
        ),
    ]
