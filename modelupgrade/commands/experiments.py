"""Queue the study under a params overlay as DVC experiments (``modelupgrade experiments``).

The overlay logic is ``modelupgrade.overrides``'s: every leaf of the overlay becomes a
``dvc exp run -S key=value``, after the overlay merged over params.yaml passed the checks of
``modelupgrade.params``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modelupgrade.config import DEFAULT_PARAMS_PATH


@dataclass
class Experiments:
    """The dvc commands of an overlay, and the exit code of the first that failed (0: none)."""

    commands: list[list[str]]
    exit_code: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"commands": [" ".join(c) for c in self.commands], "exit_code": self.exit_code}

    def describe(self) -> str:
        return "\n".join(" ".join(command) for command in self.commands)


def experiments(
    overlay: Path,
    seeds: Sequence[int] = (),
    dry_run: bool = False,
    params: Path = DEFAULT_PARAMS_PATH,
    target: Sequence[str] = (),
) -> Experiments:
    """Run the study under a params overlay (a partial params.yaml) as DVC experiments.

    Queues one `dvc exp run` per seed with every leaf of the overlay as a `-S key=value` override,
    then runs the queue (without --seeds: one experiment, run at once). The overlay merged over
    params.yaml is checked first, as every command checks params.yaml.

    Args:
        overlay: partial params file, e.g. params/gpu-full.yaml
        seeds: one queued experiment per seed
        dry_run: print the dvc commands instead of running them
        params: the params file the overlay applies to
        target: run only these stages (and the stages they need), e.g. upgrade for the
            upgrades of params/your-upgrade.yaml
    """
    import yaml

    from modelupgrade.overrides import experiment_commands, read_overlay

    overlaid = read_overlay(overlay, params)
    base = yaml.safe_load(Path(params).read_text(encoding="utf-8"))
    commands = experiment_commands(overlaid, seeds, base, target)
    if dry_run:
        return Experiments(commands)
    for command in commands:
        returncode = subprocess.run(command, check=False).returncode
        if returncode != 0:
            return Experiments(commands, exit_code=1)
    return Experiments(commands)
