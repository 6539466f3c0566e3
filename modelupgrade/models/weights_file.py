"""Weights made elsewhere: read a local state-dict file and load it into a network, key by key.

Used by ``architectures.<name>.pretrained`` (a new model starts from weights you hold) and by the
state-dict sources of ``modelupgrade adopt``. Nothing is downloaded. A file is read with
``torch.load(weights_only=True)``, so it cannot run code. Keys the network needs and the file
lacks, and tensors of another shape, mean the file is not for this network: an error naming them.
Keys the file has in layers the network lacks or holds empty (a classifier head dropped for the
identity) are ignored and reported; extra keys inside layers it has (a deeper variant) are an error.
"""

from __future__ import annotations

import logging
import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from modelupgrade.cards import torch_load_problem
from modelupgrade.errors import UserError
from modelupgrade.io import file_sha256

log = logging.getLogger(__name__)

# Containers that training scripts commonly wrap a state dict in.
_WRAPPERS = ("state_dict", "model", "model_state_dict")
_SHOWN = 6


@dataclass(frozen=True)
class KeyReport:
    """How a file's keys met a network's: the keys loaded, and the file's keys it ignored."""

    loaded: int
    ignored: list[str] = field(default_factory=list)


def checked_file(path: str | Path, sha256: str | None, what: str) -> tuple[Path, str]:
    """``path`` and its sha256, after checking it exists and, when given, has that sha256."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist", hint="give the path of a local file")
    digest = file_sha256(path)
    if sha256 is not None and digest != sha256:
        raise UserError(
            f"{what} {path} has sha256 {digest}, not the {sha256} params.yaml expects",
            hint="point the path at the file you meant, or correct sha256",
        )
    return path, digest


def read_state_dict(path: Path, what: str, strip_prefix: str = "") -> dict[str, torch.Tensor]:
    """The named tensors of a state-dict file (unwrapped from a ``state_dict``/``model`` entry),
    ``strip_prefix`` removed from the keys that start with it."""
    hint = "save the weights with torch.save(model.state_dict(), path)"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError) as err:
        raise UserError(
            f"{what} {path} cannot be read as a state dict: {torch_load_problem(err)}", hint=hint
        ) from None
    for wrapper in _WRAPPERS:
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
            break
    if not isinstance(state, dict) or not state:
        raise UserError(f"{what} {path} holds no state dict of named tensors", hint=hint)
    tensors = {k: v for k, v in state.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if len(tensors) != len(state):
        raise UserError(f"{what} {path} holds entries that are not named tensors", hint=hint)
    if strip_prefix:
        tensors = {k.removeprefix(strip_prefix): v for k, v in tensors.items()}
    return tensors


def _listed(keys: list[str]) -> str:
    more = f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else ""
    return ", ".join(keys[:_SHOWN]) + more


def _inside_the_network(network: nn.Module, key: str) -> bool:
    """Whether ``key`` names a tensor inside a layer of ``network`` that holds tensors (a deeper
    variant's extra block), rather than in a layer it lacks or left empty (a dropped head)."""
    module = network
    for part in key.split(".")[:-1]:
        child = module._modules.get(part)
        if child is None:
            break
        module = child
    return module is not network and next(iter(module.state_dict()), None) is not None


def load_matching(
    network: nn.Module, state: dict[str, torch.Tensor], source: Path, network_name: str
) -> KeyReport:
    """Load ``state`` into ``network``: every tensor the network holds must be in the file with
    its shape; the file's other keys are ignored, logged and returned."""
    expected = network.state_dict()
    missing = [k for k in expected if k not in state]
    mismatched = [
        f"{k} {tuple(state[k].shape)} ≠ {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or mismatched:
        problems = []
        if missing:
            problems.append(f"{len(missing)} missing key(s): {_listed(missing)}")
        if mismatched:
            problems.append(f"{len(mismatched)} of another shape (file ≠ network): ")
            problems[-1] += _listed(mismatched)
        raise UserError(
            f"{source} does not fit {network_name} ({len(expected)} tensors): "
            + "; ".join(problems),
            hint="name the architecture (and its kwargs) the weights were saved from, or strip a "
            "prefix the keys carry (key_prefix)",
        )
    extra = sorted(k for k in state if k not in expected)
    inside = [k for k in extra if _inside_the_network(network, k)]
    if inside:
        raise UserError(
            f"{source} does not fit {network_name}: {len(inside)} key(s) belong to layers it "
            f"has, but it has no such tensors: {_listed(inside)}",
            hint="the weights come from a deeper or other variant; name the architecture (and "
            "its kwargs) they were saved from",
        )
    ignored = extra
    network.load_state_dict({k: state[k] for k in expected})
    if ignored:
        log.warning(
            "%s: %d key(s) not part of %s were ignored: %s",
            source,
            len(ignored),
            network_name,
            _listed(ignored),
        )
    return KeyReport(len(expected), ignored)


def load_pretrained_backbone(
    backbone: nn.Module, path: str | Path, sha256: str | None, name: str
) -> dict[str, object]:
    """Load the local file ``path`` into a timm ``backbone`` (``architectures.<a>.pretrained``);
    returns what the card records: the file, its sha256 and the keys ignored."""
    checked, digest = checked_file(path, sha256, "pretrained weights file")
    state = read_state_dict(checked, "pretrained weights file")
    report = load_matching(backbone, state, checked, f"the {name} backbone")
    log.info("backbone %s starts from %s (%d tensors)", name, checked, report.loaded)
    return {"path": str(checked), "sha256": digest, "ignored_keys": report.ignored}
