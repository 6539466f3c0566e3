"""What the commands print: a result's ``describe()`` for a person, ``as_dict()`` for ``--json``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


def metric_lines(metrics: Mapping[str, float]) -> list[str]:
    """One indented ``name  value`` line per metric, names aligned."""
    width = max((len(name) for name in metrics), default=0)
    return [f"  {name:<{width}}  {value:.4g}" for name, value in metrics.items()]


@dataclass
class WrittenFiles:
    """The files a command wrote."""

    paths: list[Path]

    def as_dict(self) -> list[str]:
        return [str(p) for p in self.paths]

    def describe(self) -> str:
        return "\n".join(f"wrote {p}" for p in self.paths)
