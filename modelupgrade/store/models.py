"""Connecting trained models and heads to the store: spaces from model cards, embed and ψ callables,
ordering scores from the old classifier. Torch is imported here only, never by the store core.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.store.backfill import EmbedFn, TransformFn
from modelupgrade.store.spaces import SpaceSpec

# Strategies whose new model is trained to be compared directly with its parent's gallery vectors.
_INCOMPATIBLE_STRATEGIES = {"independent"}


def _name_of(reference: Any) -> str | None:
    if reference is None:
        return None
    if isinstance(reference, dict):
        for key in ("name", "model_name", "path", "model_dir", "dir"):
            if reference.get(key):
                return Path(str(reference[key])).name
        return None
    return Path(str(reference)).name


def _strategy_kind(card: dict[str, Any]) -> str | None:
    strategy = card.get("strategy")
    if isinstance(strategy, dict):
        return strategy.get("kind") or strategy.get("name")
    return None if strategy is None else str(strategy)


def space_for_model(
    model_dir: str | Path,
    name: str | None = None,
    upgrades_from: Sequence[str] | None = None,
    backward_compatible: bool | None = None,
) -> SpaceSpec:
    """The embedding space of the model in ``model_dir``, read from its card.

    The space is named after the model directory (gen0, gen1-bct, ...). Its parent generation comes
    from the card's ``parent`` entry unless ``upgrades_from`` is given; it is backward compatible
    when its strategy trains for compatibility (anything but ``independent``).
    """
    from modelupgrade.models import read_model_card

    card = read_model_card(model_dir)
    parent = _name_of(card.get("parent") or card.get("parent_model") or card.get("old_model"))
    parents = tuple(upgrades_from) if upgrades_from is not None else ((parent,) if parent else ())
    if backward_compatible is None:
        kind = _strategy_kind(card)
        backward_compatible = bool(parents) and kind is not None and kind not in _INCOMPATIBLE_STRATEGIES
    try:
        dim = int(card["embedding_dim"])
    except (KeyError, TypeError, ValueError):
        raise UserError(f"the model card in {model_dir} does not state its embedding_dim") from None
    return SpaceSpec(name or Path(model_dir).name, dim, parents, backward_compatible, str(model_dir))


def model_embed_fn(model_dir: str | Path, batch_size: int = 256, device: str = "cpu") -> EmbedFn:
    """``images (N, C, H, W) uint8 -> (N, D) float32`` with the model saved in ``model_dir``."""
    import torch

    from modelupgrade.models import embed, load_model

    model = load_model(model_dir, device)

    def embed_images(images: np.ndarray) -> np.ndarray:
        return embed(model, torch.from_numpy(np.ascontiguousarray(images)), batch_size, device)

    return embed_images


def head_transform_fn(head_dir: str | Path, device: str = "cpu") -> tuple[TransformFn, dict[str, Any]]:
    """The head saved in ``head_dir`` as a vectors → vectors callable, with its card."""
    from modelupgrade.heads import load_head

    head, card = load_head(head_dir, device)
    return folded_transform(head, device), card


def folded_transform(head: Any, device: str = "cpu", batch_size: int = 8192) -> TransformFn:
    """``head``'s transform with BatchNorm folded once, not once per chunk."""
    import torch

    from modelupgrade.heads import inference_copy

    frozen = inference_copy(head, device)

    def transform(vectors: np.ndarray) -> np.ndarray:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        head.check_input(vectors.shape[1], None)
        out = []
        with torch.inference_mode():
            for start in range(0, len(vectors), batch_size):
                x = torch.from_numpy(vectors[start : start + batch_size]).to(device)
                out.append(frozen(x).float().cpu().numpy())
        return np.concatenate(out) if out else np.empty((0, head.out_dim), dtype=np.float32)

    return transform


def old_classifier_scores(model_dir: str | Path, vectors: np.ndarray, kind: str = "confidence") -> np.ndarray:
    """Per-item ordering score from the old model's classifier on its stored vectors.

    ``confidence``: the max softmax probability of the scaled cosine logits (RM: lowest first);
    ``entropy``: the entropy of that softmax (RACT: highest first).
    """
    import torch

    from modelupgrade.models import load_model

    if kind not in ("confidence", "entropy"):
        raise UserError(f"unknown classifier score {kind!r}", hint="choose 'confidence' or 'entropy'")
    model = load_model(model_dir, "cpu")
    scores = []
    with torch.inference_mode():
        for start in range(0, len(vectors), 8192):
            features = torch.from_numpy(np.ascontiguousarray(vectors[start : start + 8192], dtype=np.float32))
            probabilities = torch.softmax(model.classifier.scale * model.classifier.cosine(features), dim=1)
            if kind == "confidence":
                scores.append(probabilities.max(dim=1).values)
            else:
                scores.append(-(probabilities * probabilities.clamp_min(1e-12).log()).sum(dim=1))
    return torch.cat(scores).double().numpy() if scores else np.empty(0)
