"""Cards: the typed description saved beside a model's or a head's weights, and how both are kept.

A card directory holds ``card.json`` and the weight files it names, each with its sha256. It is
written whole (a temporary directory renamed into place) and read back through the card's schema:
a missing, corrupt, foreign or outdated card, and a weight file that is not the one the card hashed,
are each one ``UserError`` naming the file, never a traceback. Weights are loaded with
``torch.load(weights_only=True)``, so a file cannot run code.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from modelupgrade.errors import UserError, not_valid
from modelupgrade.io import atomic_path, file_sha256, write_json
from modelupgrade.json_data import JsonObject

CARD_FILE = "card.json"
C = TypeVar("C", bound="Card")


class Card(BaseModel):
    """Fields common to every card. Subclasses name their ``FORMAT`` and main ``WEIGHTS_FILE``."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    FORMAT: ClassVar[str]
    WEIGHTS_FILE: ClassVar[str]
    WHAT: ClassVar[str]  # "model", "head": how errors name the directory's content

    format: str
    # Weight file → its sha256, checked on every load.
    weights_sha256: dict[str, str]

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value != cls.FORMAT:
            raise ValueError(f"is {value!r}, this modelupgrade reads {cls.FORMAT!r}")
        return value

    def as_dict(self) -> JsonObject:
        return self.model_dump(mode="json")


def save_card_directory(
    out_dir: str | Path,
    weights: Mapping[str, Mapping[str, torch.Tensor]],
    card_of: Callable[[dict[str, str]], C],
) -> C:
    """Write the ``weights`` files (name → state dict) and the card ``card_of(their sha256s)`` into
    ``out_dir``, atomically; returns the card."""
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        hashes = {}
        for file_name, state in weights.items():
            torch.save(
                {name: tensor.detach().cpu() for name, tensor in state.items()}, tmp / file_name
            )
            hashes[file_name] = file_sha256(tmp / file_name)
        card = card_of(hashes)
        write_json(tmp / CARD_FILE, card.as_dict())
    return card


def read_card(directory: str | Path, card_class: type[C]) -> C:
    """The card of the model or head saved in ``directory``, checked against ``card_class``."""
    path = Path(directory) / CARD_FILE
    what = card_class.WHAT
    if not path.is_file():
        raise UserError(
            f"{path} does not exist", hint=f"{directory} is not a saved {what} directory"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(
            f"{path} is not valid JSON ({err})",
            hint=f"the {what} directory is damaged; save it again",
        ) from None
    if not isinstance(raw, dict) or raw.get("format") != card_class.FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise UserError(
            f"{path} is not a {what} card (format {found!r}, expected {card_class.FORMAT!r})"
        )
    try:
        return card_class.model_validate(raw)
    except ValidationError as err:
        raise not_valid(
            err,
            f"{path} is not a valid {what} card",
            hint=f"the {what} directory is damaged or was written by another version",
        ) from None


def verified_weights(directory: str | Path, card: Card, file_name: str | None = None) -> Path:
    """The path of ``file_name`` (default: the card's main weights) in ``directory``, after checking
    that the file is the one the card hashed."""
    file_name = file_name or card.WEIGHTS_FILE
    path = Path(directory) / file_name
    if not path.is_file():
        raise UserError(
            f"{path} does not exist", hint=f"the {card.WHAT} directory is incomplete; save it again"
        )
    expected = card.weights_sha256.get(file_name)
    if expected is None:
        raise UserError(
            f"the card in {directory} does not hash {file_name}", hint="save the directory again"
        )
    if file_sha256(path) != expected:
        raise UserError(
            f"{path} is not the file its card describes (sha256 differs)",
            hint="the weights were replaced or damaged; restore them, or save "
            f"the {card.WHAT} again",
        )
    return path


def torch_load_problem(err: BaseException) -> str:
    """One line saying why ``torch.load(weights_only=True)`` refused a file: for a pickle that asks
    to run code, what it asks for, never PyTorch's advice to load it with ``weights_only=False``
    (which would run it)."""
    text = str(err).strip()
    if isinstance(err, pickle.UnpicklingError):
        asks = next(
            (line.strip() for line in text.splitlines() if "GLOBAL" in line or "global" in line),
            "",
        )
        found = re.search(r"GLOBAL ([\w.]+)", asks)
        what = f" (it asks to run {found.group(1)})" if found else ""
        return f"it holds Python objects, not plain tensors{what}; refused, it was not loaded"
    return text.splitlines()[0] if text else type(err).__name__


def load_weights(
    directory: str | Path,
    card: Card,
    file_name: str | None = None,
    map_location: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """The state dict in ``file_name`` (default: the card's main weights), after checking that the
    file is the one the card hashed."""
    path = verified_weights(directory, card, file_name)
    hint = "only plain tensors are loaded (weights_only); save the weights again"
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (
        pickle.UnpicklingError,
        RuntimeError,
        EOFError,
        zipfile.BadZipFile,
        ValueError,
        OSError,
    ) as err:
        raise UserError(
            f"{path} cannot be loaded as weights: {torch_load_problem(err)}", hint=hint
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(name, str) and isinstance(value, torch.Tensor) for name, value in state.items()
    ):
        raise UserError(
            f"{path} holds a {type(state).__name__}, not a state dict of named tensors", hint=hint
        )
    return state
