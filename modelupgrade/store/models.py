"""Connecting trained models and heads to the store: spaces from model cards, embed and head
callables, ordering scores from the old classifier or a FastFill head. Torch is imported here only,
never by the store core.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.heads.card import HeadCard
from modelupgrade.ordering.scores import OrderingInputs, score_kind_of
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.search import HeadTransforms
from modelupgrade.store.sources import EmbedFn, TransformFn
from modelupgrade.store.spaces import SpaceSpec

log = logging.getLogger(__name__)


def space_for_model(
    model_dir: str | Path,
    name: str | None = None,
    upgrades_from: Sequence[str] | None = None,
    backward_compatible: bool | None = None,
) -> SpaceSpec:
    """The embedding space of the model in ``model_dir``, read from its card.

    The space is named after the model directory (gen0, gen1-bct, ...). Its parent generation comes
    from the card's ``parent`` entry unless ``upgrades_from`` is given; it is backward compatible
    when its strategy trains for compatibility (anything but ``independent``). The weights must be
    the ones the card hashed: a space is never named after a model whose files were swapped.
    """
    from modelupgrade.cards import verified_weights
    from modelupgrade.models import read_model_card

    card = read_model_card(model_dir)
    verified_weights(model_dir, card)
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


def _model_card_sha256(space: SpaceSpec) -> str | None:
    """The sha256 of the card of the model whose vectors ``space`` holds, when its directory is
    at hand and holds a model card (a space made by a head or a table has none)."""
    import json

    from modelupgrade.cards import CARD_FILE
    from modelupgrade.io import file_sha256
    from modelupgrade.models.card import ModelCard

    card = Path(space.model_ref) / CARD_FILE if space.model_ref else None
    if card is None or not card.is_file():
        return None
    try:
        is_model = json.loads(card.read_text(encoding="utf-8")).get("format") == ModelCard.FORMAT
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return file_sha256(card) if is_model else None


def check_head_pair(
    head_dir: str | Path, card: HeadCard, old: Sequence[SpaceSpec], new: SpaceSpec | None
) -> None:
    """Refuse a head trained between other models than the ones it is about to connect: the
    models whose vectors the store holds (``old``) and the model being backfilled (``new``).

    A head's card records the models it was trained between (``sources``: ``old_model`` and
    ``new_model``, each with the sha256 of its card); a space made from a model directory that is
    at hand is compared by that hash, anything else by directory name. A head that records no
    models, or a space whose model cannot be told, is let through with a warning.
    """
    checks = [("old_model", space) for space in old] + ([("new_model", new)] if new else [])
    for role, space in checks:
        entry = card.sources.get(role)
        if not entry or not entry.get("path"):
            log.warning(
                "%s records no %s, so nothing checks that it connects the store's spaces",
                head_dir,
                role.replace("_", " "),
            )
            continue
        recorded, held = entry.get("card_sha256"), _model_card_sha256(space)
        if recorded and held:
            same = recorded == held
        else:
            names = {space.name, Path(space.model_ref).name if space.model_ref else space.name}
            same = Path(str(entry["path"])).name in names
            if not same and held is None:
                log.warning(
                    "cannot tell whether %s was trained for the vectors of space %r (%s); "
                    "its card names %s as its %s",
                    head_dir,
                    space.name,
                    space.model_ref or "no model recorded",
                    entry["path"],
                    role.replace("_", " "),
                )
                continue
        if not same:
            raise UserError(
                f"{head_dir} was trained with {entry['path']} as its "
                f"{role.replace('_', ' ')}, but space {space.name!r} holds the vectors of "
                f"{space.model_ref or space.name}",
                hint="pass the head trained between the store's model and the new one "
                "(its card.json lists them under sources)",
            )


def store_head_fn(
    store: GalleryStore,
    head_dir: str | Path,
    target: SpaceSpec | str,
    device: str = "cpu",
    output: str = "transform",
) -> tuple[TransformFn, HeadCard]:
    """``head_transform_fn`` of a head that a backfill into ``target`` applies, once its model
    pair is checked against the spaces the store's items are in and the target space."""
    transform, card = head_transform_fn(head_dir, device, output)
    name = target if isinstance(target, str) else target.name
    spaces = store.spaces()
    held = [
        spaces[space]
        for space, count in store.status().items_by_space.items()
        if count and space != name and space in spaces
    ]
    check_head_pair(head_dir, card, held, spaces.get(name) if isinstance(target, str) else target)
    return transform, card


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
