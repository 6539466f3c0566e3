"""The ``closures`` stage: each stage's code closure, the code dependency of that stage.

``modelupgrade.tools.dvc_deps`` says why: one closure file a stage module, listing every file
``python -m stages.<name>`` runs with the hash of its content, so that a stage runs again exactly
when code it runs changed, and ``dvc.lock`` stays small enough to rewrite after every stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.tools.dvc_deps import CLOSURES_DIR, write_closures


@dataclass(frozen=True)
class Closures:
    """The closure files written: where, and how many files each stage module runs."""

    out: Path
    files_by_module: dict[str, int]

    def as_dict(self) -> JsonObject:
        return json_record(self)

    def describe(self) -> str:
        counts = ", ".join(f"{m} {n}" for m, n in self.files_by_module.items())
        return f"closures of {len(self.files_by_module)} stage modules in {self.out} ({counts})"


def closures(out: Path = Path(CLOSURES_DIR), project: Path = Path(".")) -> Closures:
    """Write the code closure of every stage module that the project's dvc.yaml runs.

    Args:
        out: the folder of the closure files, one ``<module>.txt`` each.
        project: the project's root (its ``dvc.yaml``, ``modelupgrade/`` and ``stages/``).
    """
    return Closures(out, write_closures(project, out))
