"""The adapter study of one scenario: every training-free adapter of ``adapters.heads`` fitted at
every sample size of ``adapters.sample_sizes``, in one process (one stage, one interpreter start),
each saved as a head with its card and with its outputs on the evaluation embeddings.

The adapters map between gen0 and the new model of the strategy ``adapters.scenarios`` pairs the
scenario with, and are fitted on the two models' embeddings of the new_train split (row i = image
i in both). The samples are nested: one random permutation of the rows (``params.seed``), and the
sample of size n is its first n rows, so each larger sample holds the smaller ones and the sweep
varies the sample size alone. A size at or above the split's size is skipped (``all`` covers it).

Layout (``modelupgrade.layout``): ``heads/<sc>/adapters-<strategy>/<adapter>.<size>-<strategy>/``
(head.pt, card.json) and ``embeddings/<sc>/adapters-<strategy>/<adapter>.<size>-<strategy>/``
(ψ(old gallery) for a gallery-side adapter, the mapped queries for a query-side one). Each group
directory is written whole or not at all. The evaluation finds these heads inside the group and
reports them apart from the trained heads (``Head.training_free``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.heads.base import EmbeddingPairs, build_head, head_dims
from modelupgrade.heads.card import HeadCard
from modelupgrade.heads.evaluation_outputs import write_head_outputs
from modelupgrade.heads.persistence import save_head
from modelupgrade.heads.pipeline import (
    fit_cosine,
    load_embeddings,
    load_labels,
    source_entry,
    training_record,
)
from modelupgrade.heads.training import fit_head, resolve_training
from modelupgrade.io import atomic_path
from modelupgrade.layout import (
    NEW_TRAIN_SPLIT,
    OLD_MODEL,
    StudyLayout,
    adapter_group_name,
    adapter_name,
    head_name,
    model_name,
)
from modelupgrade.runtime import seed_everything

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FittedAdapter:
    """One adapter at one sample size: its head directory, card, and outputs directory."""

    head_dir: Path
    card: HeadCard
    outputs_dir: Path


def adapter_strategy(params: Params, scenario: str) -> str:
    """The strategy whose new model the scenario's adapters map to and from."""
    study = params.adapters
    if scenario not in study.scenarios:
        raise UserError(
            f"adapters.scenarios does not list scenario {scenario!r}",
            hint=f"listed: {', '.join(study.scenarios) or 'none'}",
        )
    return study.scenarios[scenario]


def nested_samples(
    count: int, sizes: Sequence[int | str], seed: int
) -> dict[int | str, np.ndarray]:
    """Rows of each sample size: the first n rows of one seeded permutation (``all``: every
    row, in order); sizes at or above ``count`` are left out."""
    order = np.random.default_rng(seed).permutation(count)
    samples: dict[int | str, np.ndarray] = {}
    for size in sizes:
        if size == "all":
            samples[size] = np.arange(count)
        elif int(size) < count:
            samples[size] = np.sort(order[: int(size)])
        else:
            log.info("sample size %s skipped: the training split has %d pairs", size, count)
    return samples


def fit_adapter_study(
    params: Params,
    scenario: str,
    layout: StudyLayout | None = None,
    device: torch.device | str = "cpu",
) -> list[FittedAdapter]:
    """Fit every adapter of ``params.adapters`` at every sample size on ``scenario``'s training
    pairs; save each with its outputs on the evaluation embeddings. Returns them in fitting
    order (sample size, then adapter)."""
    layout = layout or StudyLayout()
    device = torch.device(device)
    study = params.adapters
    strategy = adapter_strategy(params, scenario)
    new_name = model_name(1, strategy)
    old_path = layout.embedding_file(scenario, OLD_MODEL, NEW_TRAIN_SPLIT)
    new_path = layout.embedding_file(scenario, new_name, NEW_TRAIN_SPLIT)
    labels_path = layout.split_file(scenario, NEW_TRAIN_SPLIT)
    old = load_embeddings(old_path, "old embeddings")
    new = load_embeddings(new_path, "new embeddings")
    data = EmbeddingPairs(old, new, load_labels(labels_path))
    sources: dict[str, dict[str, str] | None] = {
        "old_embeddings": source_entry(old_path),
        "new_embeddings": source_entry(new_path),
        "labels": source_entry(labels_path),
        "new_model": source_entry(layout.model(scenario, new_name)),
        "old_model": source_entry(layout.model(scenario, OLD_MODEL)),
    }
    samples = nested_samples(len(data), study.ordered_sizes(), params.seed)
    group = adapter_group_name(strategy)
    heads_group, outputs_group = layout.heads(scenario) / group, layout.embeddings(scenario, group)
    fitted: list[FittedAdapter] = []
    with atomic_path(heads_group) as heads_tmp, atomic_path(outputs_group) as outputs_tmp:
        heads_tmp.mkdir()
        outputs_tmp.mkdir()
        for size, rows in samples.items():
            sample = EmbeddingPairs(old[rows], new[rows], data.labels[rows])
            for entry_name, entry in study.heads.items():
                name = adapter_name(entry_name, size)
                directory = head_name(name, strategy)
                seed_everything(params.seed)
                card = _fit_one(params, name, entry, sample, heads_tmp / directory, sources, device)
                write_head_outputs(
                    heads_tmp / directory,
                    layout.embeddings(scenario, OLD_MODEL),
                    layout.embeddings(scenario, new_name),
                    outputs_tmp / directory,
                    device=device,
                )
                fitted.append(
                    FittedAdapter(heads_group / directory, card, outputs_group / directory)
                )
                log.info(
                    "adapter %s (%s, %s pairs): fit cosine %.4f in %.3f s",
                    name,
                    card.kind,
                    len(rows),
                    card.training["fit_cosine"],
                    card.training["seconds"],
                )
    return fitted


def _fit_one(
    params: Params,
    name: str,
    entry: Any,
    sample: EmbeddingPairs,
    out: Path,
    sources: dict[str, dict[str, str] | None],
    device: torch.device | str,
) -> HeadCard:
    training = resolve_training(entry)
    in_dim, out_dim = head_dims(entry.kind, sample.old.shape[1], sample.new.shape[1])
    head = build_head(
        entry.kind, in_dim, out_dim, training.hidden_dim, training.depth, options=entry.options
    )
    result = fit_head(head, sample, training, device=device, seed=params.seed)
    head = head.cpu()
    record = training_record(head, training, result, device, params.seed)
    forward = head.direction == "forward"
    source, target = (sample.old, sample.new) if forward else (sample.new, sample.old)
    side = sample.old if head.takes_old_embedding else None
    record["sample_size"] = len(sample)
    record["fit_cosine"] = fit_cosine(head, source, target, side)
    return save_head(head, out, name=name, training=record, sources=sources)
