"""A params overlay (a partial params.yaml, e.g. params/gpu-full.yaml) as DVC experiments.

    modelupgrade experiments --overlay params/gpu-full.yaml --seeds 0 1 2

queues one ``dvc exp run`` per seed with every leaf of the overlay as a ``-S key=value`` override
(the overlay merged over params.yaml is checked first, as ``modelupgrade.params.load_params``
checks params.yaml), then runs the queue (``modelupgrade.commands.experiments``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from modelupgrade.config import DEFAULT_PARAMS_PATH, parse_params
from modelupgrade.errors import UserError
from modelupgrade.params import check_params


def merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``overlay`` over ``base``, mapping into mapping; an empty mapping replaces what it
    overlays (``backbone_kwargs: {}`` clears the CPU network's widths), as ``set_arguments`` sets
    it for DVC."""
    merged = dict(base)
    for key, value in overlay.items():
        merged[key] = (
            merge(base[key], value)
            if isinstance(value, Mapping) and value and isinstance(base.get(key), Mapping)
            else value
        )
    return merged


def set_arguments(
    overlay: Mapping[str, Any], prefix: str = "", base: Mapping[str, Any] | None = None
) -> list[str]:
    """``-S key.sub=value`` pairs for every leaf; lists and empty mappings are set whole (JSON is
    YAML). A key ``base`` (the params the overlay applies to) lacks is added: ``-S +key=value``,
    Hydra's grammar for a new key, which DVC refuses without the ``+``."""
    arguments: list[str] = []
    for key, value in overlay.items():
        name = f"{prefix}{key}"
        below = base.get(key) if base is not None else None
        if isinstance(value, Mapping) and value:
            nested = below if isinstance(below, Mapping) else {}
            arguments += set_arguments(value, f"{name}.", nested if base is not None else None)
        else:
            new = "+" if base is not None and key not in base else ""
            arguments += ["-S", f"{new}{name}={json.dumps(value, separators=(',', ':'))}"]
    return arguments


def read_overlay(path: Path, params_path: Path = DEFAULT_PARAMS_PATH) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"overlay {path} does not exist")
    overlay = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(overlay, dict):
        raise UserError(f"{path} must hold a mapping at the top level")
    base = yaml.safe_load(params_path.read_text(encoding="utf-8"))
    # The merged result must be a valid params.yaml: its structure and every plugin it names.
    check_params(parse_params(merge(base, overlay), path), path)
    return overlay


def experiment_commands(
    overlay: Mapping[str, Any],
    seeds: Sequence[int],
    base: Mapping[str, Any] | None = None,
    targets: Sequence[str] = (),
) -> list[list[str]]:
    """The dvc commands that run ``overlay`` over the params ``base``: one experiment, or one
    queued per seed and then the queue; only the stages ``targets`` (and what they need) when
    given."""
    arguments = set_arguments(overlay, base=base)
    if not seeds:
        return [["dvc", "exp", "run", *arguments, *targets]]
    queued = [
        ["dvc", "exp", "run", "--queue", *arguments, "-S", f"seed={seed}", *targets]
        for seed in seeds
    ]
    return [*queued, ["dvc", "queue", "start"]]
