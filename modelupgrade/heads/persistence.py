"""Saving and loading heads: ``<dir>/head.pt`` (a plain state dict) and ``<dir>/card.json``.

The card says what the head is (kind, direction, dimensions, width, depth, options, MACs per
embedding), how it was trained (resolved hyper-parameters, loss history, time, device) and from what
(source embeddings and models, with hashes when they are files), and which earlier heads it follows in
a sequential upgrade. ``load_head`` rebuilds the architecture from the card alone and loads the weights
with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from modelupgrade.errors import UserError
from modelupgrade.heads.base import Head, build_head
from modelupgrade.io import atomic_path, file_sha256, read_json, write_json

CARD_FORMAT = "modelupgrade-head/1"
WEIGHTS_FILE = "head.pt"
CARD_FILE = "card.json"


def head_card(head: Head, **extra: Any) -> dict[str, Any]:
    macs = head.macs_per_embedding()
    return {
        "format": CARD_FORMAT,
        **head.architecture(),
        "macs_per_embedding": macs["transform"],
        "macs_by_output": macs,
        "parameters": sum(p.numel() for p in head.parameters()),
        **extra,
    }


def save_head(head: Head, out_dir: str | Path, **card_fields: Any) -> dict[str, Any]:
    """Write ``head.pt`` and ``card.json`` into ``out_dir`` atomically; returns the card."""
    state = {name: tensor.detach().cpu() for name, tensor in head.state_dict().items()}
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        torch.save(state, tmp / WEIGHTS_FILE)
        card = head_card(head, weights_sha256=file_sha256(tmp / WEIGHTS_FILE), **card_fields)
        write_json(tmp / CARD_FILE, card)
    return card


def read_head_card(head_dir: str | Path) -> dict[str, Any]:
    card_path = Path(head_dir) / CARD_FILE
    if not card_path.is_file():
        raise UserError(f"{card_path} does not exist", hint="train the head first (stage train_heads)")
    card = read_json(card_path)
    if card.get("format") != CARD_FORMAT:
        raise UserError(f"{card_path} is not a head card (format {card.get('format')!r}, expected {CARD_FORMAT!r})")
    return card


def load_head(head_dir: str | Path, device: torch.device | str = "cpu") -> tuple[Head, dict[str, Any]]:
    """Rebuild a saved head (eval mode) and return it with its card."""
    head_dir = Path(head_dir)
    card = read_head_card(head_dir)
    head = build_head(
        card["kind"], card["in_dim"], card["out_dim"], card["hidden_dim"], card["depth"],
        options=card.get("options"), side_info_dim=card.get("side_info_dim", 0),
    )
    weights = head_dir / WEIGHTS_FILE
    if not weights.is_file():
        raise UserError(f"{weights} does not exist", hint="the head directory is incomplete; retrain it")
    state = torch.load(weights, map_location=device, weights_only=True)
    try:
        head.load_state_dict(state)
    except RuntimeError as err:
        raise UserError(f"{weights} does not match its card: {err}") from None
    return head.to(device).eval(), card
