"""Only what the GPU machine has can be imported: the rehearsal of the GPU study on this machine.

Put this folder first on PYTHONPATH (``scripts/gpu_study.sh rehearse`` and
``tests/test_gpu_study.py`` do) and every installed distribution that the GPU machine lacks becomes
unimportable, as it is there: not found (ModuleNotFoundError). The GPU machine (see
docs/gpu.md) has PyTorch, timm, torchvision, numpy, pandas, pyarrow, scipy, scikit-learn, pillow,
PyYAML, tqdm, typer, matplotlib, pytest with its timeout plugin and hypothesis, and what they
require; the wheels of ``scripts/gpu_wheels.txt`` travel there; the project runs from its source
tree. Anything else (DVC, MLflow, Prefect, FAISS, Great Expectations, pymilvus, ...) is not found.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import re
import sys
from pathlib import Path
from typing import ClassVar

GPU_MACHINE = (
    *("torch", "torchvision", "timm", "numpy", "pandas", "pyarrow", "scipy", "scikit-learn"),
    *("pillow", "pyyaml", "tqdm", "typer", "matplotlib", "pip"),
    *("pytest", "pytest-timeout", "pytest-xdist", "hypothesis"),
)
PROJECT = "modelupgrade"
WHEELS = Path(__file__).resolve().parent.parent / "gpu_wheels.txt"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def carried() -> list[str]:
    """The distributions ``scripts/gpu_wheels.txt`` carries to the GPU machine."""
    lines = WHEELS.read_text(encoding="utf-8").splitlines()
    return [line.split("==")[0].strip() for line in lines if line.strip() and line[0] != "#"]


def _requirements(name: str) -> list[str]:
    try:
        required = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    names = []
    for requirement in required:
        if "extra ==" in requirement.replace('"', "'").replace("extra==", "extra =="):
            continue
        names.append(re.split(r"[\s;<>=!~\[(]", requirement.strip(), maxsplit=1)[0])
    return names


def allowed_distributions() -> set[str]:
    """The GPU machine's packages, the carried wheels and everything they require."""
    todo = [*GPU_MACHINE, *carried()]
    allowed: set[str] = set()
    while todo:
        name = _normal(todo.pop())
        if name not in allowed:
            allowed.add(name)
            todo += _requirements(name)
    return allowed | {PROJECT}


def blocked_modules() -> dict[str, list[str]]:
    """Top-level module → the installed distributions providing it, for each module that only
    distributions outside ``allowed_distributions`` provide."""
    allowed = allowed_distributions()
    return {
        module: dists
        for module, dists in importlib.metadata.packages_distributions().items()
        if not any(_normal(dist) in allowed for dist in dists)
        and module not in sys.stdlib_module_names
    }


class OnlyTheGpuMachines(importlib.machinery.PathFinder):
    """The path finder, blind to the blocked modules and distributions: they are not found, as on
    the GPU machine (``importlib.util.find_spec`` gives None, ``import`` raises
    ModuleNotFoundError, and no entry point of theirs, a pytest plugin say, is listed)."""

    blocked: ClassVar[dict[str, list[str]]] = {}
    allowed: ClassVar[set[str]] = set()

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in cls.blocked:
            return None
        return super().find_spec(fullname, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        for distribution in super().find_distributions(*args, **kwargs):
            if _normal(distribution.metadata["Name"] or "") in cls.allowed:
                yield distribution


OnlyTheGpuMachines.blocked = blocked_modules()
OnlyTheGpuMachines.allowed = allowed_distributions()
sys.meta_path[:] = [
    OnlyTheGpuMachines if finder is importlib.machinery.PathFinder else finder
    for finder in sys.meta_path
]
