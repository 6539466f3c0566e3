"""Connecting trained models and heads to the store: spaces from model cards, embed and head
callables, ordering scores from the old classifier or a FastFill head. Torch is imported here only,
never by the store core.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.heads.card import HeadCard
from modelupgrade.ordering.scores import OrderingInputs, score_kind_of
from modelupgrade.store.job import EmbedFn, TransformFn
from modelupgrade.store.search import HeadTransforms
from modelupgrade.store.spaces import SpaceSpec


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
    parent = None if card.parent is None else Path(card.parent.path).name
    parents = tuple(upgrades_from) if upgrades_from is not None else ((parent,) if parent else ())
    if backward_compatible is None:
        backward_compatible = bool(parents) and card.backward_compatible
    return SpaceSpec(
        name or Path(model_dir).name,
        card.embedding_dim,
        parents,
        backward_compatible,
        str(model_dir),
    )


def model_embed_fn(model_dir: str | Path, batch_size: int = 256, device: str = "cpu") -> EmbedFn:
    """``images (N, C, H, W) uint8 -> (N, D) float32`` with the model saved in ``model_dir``."""
    import torch

    from modelupgrade.models import embed, load_model

    model = load_model(model_dir, device)

    def embed_images(images: np.ndarray) -> np.ndarray:
        return embed(model, torch.from_numpy(np.ascontiguousarray(images)), batch_size, device)

    return embed_images


def head_transform_fn(
    head_dir: str | Path, device: str = "cpu", output: str = "transform"
) -> tuple[TransformFn, HeadCard]:
    """The head saved in ``head_dir`` as a vectors → vectors callable (one of its
    outputs), with its card."""
    from modelupgrade.heads import FrozenHead, load_head

    head, card = load_head(head_dir, device)
    return FrozenHead(head, device).output(output), card


def load_head_transforms(
    forward_head: str | Path | None = None,
    reverse_head: str | Path | None = None,
    device: str = "cpu",
) -> HeadTransforms:
    """The heads a store serves with: a forward head (ψ on stored vectors) and a reverse head
    (ψ_rev on queries; an rm_full head gives ρ and ψ_rev∘ρ instead, for the full method)."""
    from modelupgrade.heads import FrozenHead, load_head

    def loaded(path: str | Path, direction: str, takes: str) -> FrozenHead:
        head, _ = load_head(path, device)
        if head.direction != direction:
            raise UserError(
                f"{path} is a {head.direction} head ({head.registry_name}), not a {direction} one",
                hint=f"--{direction}-head takes {takes}",
            )
        return FrozenHead(head, device)

    forward = reverse = rho = rho_reverse = None
    if forward_head is not None:
        forward = loaded(forward_head, "forward", "ψ: fct, fastfill, bict or dmu").output()
    if reverse_head is not None:
        head = loaded(reverse_head, "reverse", "ψ_rev: rqt, mcl or rm_full")
        if "new_embedding" in head.head.output_names:
            rho, rho_reverse = head.output("new_embedding"), head.output()
        else:
            reverse = head.output()
    return HeadTransforms(forward, reverse, rho, rho_reverse)


CLASSIFIER_SCORES = ("old-confidence", "old-entropy")


def ordering_scores(
    model_dir: str | Path | None,
    vectors: np.ndarray,
    kinds: Sequence[str] = CLASSIFIER_SCORES,
    fastfill_head: str | Path | None = None,
) -> dict[str, np.ndarray]:
    """The ordering scores of stored ``vectors`` by kind (``modelupgrade.ordering.SCORE_KINDS``):
    the old model's classifier logits feed old-confidence and old-entropy, a FastFill head's σ²
    feeds fastfill-sigma2."""
    from modelupgrade.models import classifier_logits, load_model

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    needs = {field for kind in kinds for option in score_kind_of(kind).needs for field in option}
    logits = sigma2 = None
    if needs & {"old_logits", "old_probabilities"}:
        if model_dir is None:
            raise UserError(
                f"the scores {list(kinds)} need the old model's classifier",
                hint="pass the old model",
            )
        logits = classifier_logits(load_model(model_dir, "cpu"), vectors)
    if "sigma2" in needs:
        if fastfill_head is None:
            raise UserError(
                "the fastfill-sigma2 score needs a FastFill head",
                hint="pass the FastFill head directory",
            )
        from modelupgrade.heads import apply_with_uncertainty, load_head

        sigma2 = apply_with_uncertainty(load_head(fastfill_head)[0], vectors)[1].reshape(-1)
    inputs = OrderingInputs(len(vectors), old_logits=logits, sigma2=sigma2)
    return {kind: inputs.score(kind) for kind in kinds}
