"""The code dependencies of each DVC stage, derived from the code's imports.

A stage of ``dvc.yaml`` runs ``python -m stages.<name>``; the code it runs is the import closure of
``stages.<name>`` inside the project (``modelupgrade.tools.imports``: every import statement, at any
level of a file, and the packages around each module). A stage reused by ``dvc repro`` after a
module of that closure changed has a stale output; one that runs again for a change outside it
wastes the time of a stage.

The ``closures`` stage (``stages/closures.py``) writes one file per stage module,
``closures/stages.<name>.txt``: every file of its closure with the SHA-256 of its content. It
depends on the whole of ``modelupgrade/`` and ``stages/`` and so runs after any change to the
code (about a second: it parses, it imports nothing); each other stage depends on its own file
alone, whose content changes exactly when a file of its closure does. ``dvc.lock`` then holds one
code entry a stage instead of about 80 (DVC parses and rewrites the whole lock after each stage:
17,500 lines took 2.8 s a stage on the 2-core machine), and the closure follows the imports
without a list in ``dvc.yaml`` to keep in step with them.

    python -m modelupgrade.tools.dvc_deps --check   # exit 1 and list the differences, if any
    python -m modelupgrade.tools.dvc_deps --write   # rewrite the code lines of dvc.yaml

``--write`` replaces only the code lines of each ``deps`` list (the code first, then the stage's
data dependencies in their order) and the ``closures`` stage's ``outs``; comments and anchors stay.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from modelupgrade.tools.imports import graph_of, import_closure, module_paths

ROOT = Path(__file__).resolve().parents[2]
CODE_ROOTS = ("modelupgrade", "stages")
CLOSURES_DIR = "closures"
# The stage that writes the closures: it depends on CODE_ROOTS whole, not on a closure file.
CLOSURES_MODULE = "stages.closures"
_STAGE_MODULE = re.compile(r"python -m (stages\.\w+)")
_STAGE_NAME = re.compile(r"^  ([^\s#][^:]*):\s*$")
_LIST_KEY = re.compile(r"^(\s+)(deps|outs):(\s+&\S+)?\s*$")
_LIST_ITEM = re.compile(r"^(\s+)- (.*?)\s*$")


def closure_file(stage_module: str) -> str:
    """The ``deps`` entry of a stage running ``stage_module``: its closure file."""
    return f"{CLOSURES_DIR}/{stage_module}.txt"


def is_code(dep: str) -> bool:
    """A ``deps`` entry naming project code or a closure file (as opposed to data)."""
    roots = (*CODE_ROOTS, CLOSURES_DIR)
    return any(dep == root or dep.startswith(root + "/") for root in roots)


@dataclass(frozen=True)
class Project:
    """The project's modules, dotted name → file (relative to ``root``)."""

    root: Path
    modules: dict[str, Path]

    @classmethod
    def at(cls, root: Path = ROOT) -> Project:
        modules: dict[str, Path] = {}
        for package in CODE_ROOTS:
            modules |= module_paths(root / package)
        return cls(root, {name: path.relative_to(root) for name, path in modules.items()})

    def closure_files(self, stage_module: str) -> list[str]:
        """Every file that ``python -m <stage_module>`` runs, sorted."""
        closure = import_closure(self.graph, [stage_module])
        return sorted(self.modules[module].as_posix() for module in closure)

    def closure_text(self, files: Iterable[str]) -> str:
        """A closure file: a line ``<sha256>  <file>`` per file of ``files``."""
        lines = [
            f"{hashlib.sha256((self.root / path).read_bytes()).hexdigest()}  {path}\n"
            for path in files
        ]
        return "".join(lines)

    @cached_property
    def graph(self) -> dict[str, set[str]]:
        return graph_of({name: self.root / path for name, path in self.modules.items()})


def stage_modules(dvc_yaml: Mapping[str, Any]) -> dict[str, str]:
    """Stage (or stage group) name → the ``stages.<name>`` module its command runs."""
    found = {}
    for name, stage in dvc_yaml["stages"].items():
        definition = stage.get("do", stage)
        (module,) = _STAGE_MODULE.findall(definition["cmd"])
        found[name] = module
    return found


def closure_modules(dvc_yaml: Mapping[str, Any]) -> list[str]:
    """The stage modules that get a closure file, sorted."""
    return sorted(set(stage_modules(dvc_yaml).values()) - {CLOSURES_MODULE})


def wanted_code(module: str) -> list[str]:
    """The code lines of the ``deps`` of a stage running ``module``."""
    return list(CODE_ROOTS) if module == CLOSURES_MODULE else [closure_file(module)]


def differences(text: str) -> list[str]:
    """One line per code dependency or closure file the dvc.yaml ``text`` lacks or lists in vain."""
    parsed = yaml.safe_load(text)
    problems = []
    modules = stage_modules(parsed)
    for name, module in modules.items():
        stage = parsed["stages"][name]
        listed = {dep for dep in stage.get("do", stage).get("deps") or [] if is_code(dep)}
        wanted = set(wanted_code(module))
        problems += [f"{name}: missing {dep} (the code {module} runs)" for dep in wanted - listed]
        problems += [f"{name}: lists {dep}, not the code {module} runs" for dep in listed - wanted]
    writers = [name for name, module in modules.items() if module == CLOSURES_MODULE]
    if len(writers) != 1:
        return sorted(problems) + [f"{len(writers)} stages run {CLOSURES_MODULE}, not one"]
    outs = set(parsed["stages"][writers[0]].get("outs") or [])
    wanted_outs = {closure_file(module) for module in closure_modules(parsed)}
    problems += [f"{writers[0]}: missing the output {out}" for out in wanted_outs - outs]
    problems += [f"{writers[0]}: outputs {out}, no stage's closure" for out in outs - wanted_outs]
    return sorted(problems)


def rewritten(text: str) -> str:
    """The dvc.yaml ``text`` with each ``deps`` list's code lines and the closures stage's
    ``outs`` replaced by the generated ones."""
    parsed = yaml.safe_load(text)
    modules = stage_modules(parsed)
    closure_outs = [closure_file(module) for module in closure_modules(parsed)]
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    stage: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if match := _STAGE_NAME.match(line):
            stage = match.group(1)
        out.append(line)
        i += 1
        key = _LIST_KEY.match(line)
        if stage is None or key is None:
            continue
        if key.group(2) == "outs" and modules[stage] != CLOSURES_MODULE:
            continue
        items = []
        while i < len(lines) and (item := _LIST_ITEM.match(lines[i])):
            items.append(item)
            i += 1
        if not items:
            raise ValueError(f"dvc.yaml: the {key.group(2)} of stage {stage} are not a block list")
        indent = items[0].group(1)
        if key.group(2) == "outs":
            out += _items(indent, closure_outs)
            continue
        data = [item.group(2) for item in items if not is_code(item.group(2))]
        out += _items(indent, wanted_code(modules[stage]) + data)
    return "".join(out)


def _items(indent: str, entries: Iterable[str]) -> list[str]:
    return [f"{indent}- {entry}\n" for entry in entries]


def write_closures(root: Path, out: Path) -> dict[str, int]:
    """Write the closure file of every stage module of ``root``'s dvc.yaml under ``out``; the
    number of files in each closure, by module."""
    project = Project.at(root)
    modules = closure_modules(yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8")))
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for module in modules:
        files = project.closure_files(module)
        (out / f"{module}.txt").write_text(project.closure_text(files), encoding="utf-8")
        counts[module] = len(files)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="list differences; exit 1 if any")
    action.add_argument("--write", action="store_true", help="rewrite dvc.yaml's code deps")
    parser.add_argument("--dvc-yaml", type=Path, default=ROOT / "dvc.yaml", help="the file")
    args = parser.parse_args(argv)
    text = args.dvc_yaml.read_text(encoding="utf-8")
    if args.write:
        args.dvc_yaml.write_text(rewritten(text), encoding="utf-8")
        return 0
    problems = differences(text)
    for problem in problems:
        print(problem)
    if problems:
        print("fix: python -m modelupgrade.tools.dvc_deps --write", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
