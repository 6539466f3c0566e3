"""Saving and loading heads: ``<dir>/head.pt`` (a plain state dict) and ``<dir>/card.json``.

The card says what the head is (kind, direction, dimensions, width, depth, options, MACs per
embedding), how it was trained (resolved hyper-parameters, loss history, time, device) and from what
(source embeddings and models, with hashes when they are files), and which earlier heads it follows
in a sequential upgrade. ``load_head`` rebuilds the architecture from the card alone and loads the
weights with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from modelupgrade.cards import CARD_FILE, load_weights, read_card, save_card_directory
from modelupgrade.errors import UserError
from modelupgrade.heads.base import Head, build_head
from modelupgrade.heads.card import HEAD_WEIGHTS_FILE, HeadCard
from modelupgrade.json_data import JsonObject

CARD_FORMAT = HeadCard.FORMAT
WEIGHTS_FILE = HEAD_WEIGHTS_FILE

__all__ = [
    "CARD_FILE",
    "CARD_FORMAT",
    "WEIGHTS_FILE",
    "head_card",
    "load_head",
    "read_head_card",
    "save_head",
]


def head_card(head: Head, **extra: Any) -> JsonObject:
    """The fields of ``head``'s card that the head itself knows."""
    macs = head.macs_per_embedding()
    return {
        "format": CARD_FORMAT,
        **head.architecture(),
        "macs_per_embedding": macs["transform"],
        "macs_by_output": macs,
        "parameters": sum(p.numel() for p in head.parameters()),
        **extra,
    }


def save_head(head: Head, out_dir: str | Path, **card_fields: Any) -> HeadCard:
    """Write ``head.pt`` and ``card.json`` into ``out_dir`` atomically; returns the card."""
    return save_card_directory(
        out_dir,
        {WEIGHTS_FILE: head.state_dict()},
        lambda hashes: HeadCard.model_validate(
            head_card(head, weights_sha256=hashes, **card_fields)
        ),
    )


def read_head_card(head_dir: str | Path) -> HeadCard:
    return read_card(head_dir, HeadCard)


def load_head(head_dir: str | Path, device: torch.device | str = "cpu") -> tuple[Head, HeadCard]:
    """Rebuild a saved head (eval mode) from its card, load its checked weights; returns both."""
    card = read_head_card(head_dir)
    head = build_head(
        card.kind,
        card.in_dim,
        card.out_dim,
        card.hidden_dim,
        card.depth,
        options=card.options,
        side_info_dim=card.side_info_dim,
    )
    try:
        head.load_state_dict(load_weights(head_dir, card, map_location=device))
    except RuntimeError as err:
        raise UserError(f"{Path(head_dir) / WEIGHTS_FILE} does not match its card: {err}") from None
    return head.to(device).eval(), card
