"""The training-free adapters a plan fits (``fit_adapter``): which kinds, with the study's own
settings where params.yaml has them, and where each is saved as a head directory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from modelupgrade.config import Params
from modelupgrade.config.heads import HeadParams
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject
from modelupgrade.plan.sample import SampleEmbeddings

# Drift-Adapter's three, their local (per-cluster) forms, query drift compensation and SLERP (its
# α tuned on a support split; it needs the old model on every query too).
QUERY_ADAPTERS = (
    "procrustes_query",
    "affine_query",
    "residual_mlp_query",
    "local_procrustes_query",
    "local_affine_query",
    "qdc_query",
    "slerp_query",
)
GALLERY_ADAPTERS = ("procrustes", "affine", "residual_mlp", "local_procrustes", "local_affine")
DEFAULT_ADAPTERS = (*QUERY_ADAPTERS, *GALLERY_ADAPTERS)


def adapter_entry(params: Params, kind: str) -> HeadParams:
    """The study's ``adapters.heads`` entry of this kind when params.yaml has one (its options
    and training), else the kind's own defaults."""
    for entry in params.adapters.heads.values():
        if entry.kind == kind:
            return entry
    return HeadParams(kind=kind)


def check_adapters(kinds: Sequence[str]) -> None:
    for kind in kinds:
        if kind not in DEFAULT_ADAPTERS:
            raise UserError(
                f"--adapters names {kind!r}: the plan fits the training-free adapters only",
                hint=f"pick from: {', '.join(DEFAULT_ADAPTERS)}",
            )


@dataclass(frozen=True)
class FittedAdapter:
    """An adapter fitted on the sample: the head, its fitting seconds and its card's training
    record (what ``save_head`` writes beside it)."""

    head: Any
    seconds: float
    record: JsonObject


def fit_adapter(
    params: Params,
    kind: str,
    old: SampleEmbeddings,
    new: SampleEmbeddings,
    labels: np.ndarray,
    device: torch.device,
) -> FittedAdapter:
    """The adapter of ``kind`` fitted on the sample's fitting pairs, as the study fits it."""
    from modelupgrade.heads.base import EmbeddingPairs, build_head, head_dims
    from modelupgrade.heads.pipeline import fit_cosine, training_record
    from modelupgrade.heads.training import fit_head, resolve_training
    from modelupgrade.runtime import seed_everything

    entry = adapter_entry(params, kind)
    training = resolve_training(entry)
    in_dim, out_dim = head_dims(kind, old.fit.shape[1], new.fit.shape[1])
    seed_everything(params.seed)
    head = build_head(
        kind, in_dim, out_dim, training.hidden_dim, training.depth, options=entry.options
    )
    pairs = EmbeddingPairs(old.fit, new.fit, labels)
    result = fit_head(head, pairs, training, device=device, seed=params.seed)
    head = head.cpu().eval()
    record = training_record(head, training, result, device, params.seed)
    source, target = (old.fit, new.fit) if head.direction == "forward" else (new.fit, old.fit)
    record["sample_size"] = len(labels)
    side = old.fit if head.takes_old_embedding else None
    record["fit_cosine"] = fit_cosine(head, source, target, side)
    return FittedAdapter(head, result.seconds, record)


def adapter_head_name(option: str) -> str:
    """The directory a plan saves an option's adapter in: ``heads/gallery-affine``."""
    return f"heads/{option.replace('/', '-')}"  # table.HEADS_DIR
