"""The code dependencies of each DVC stage, derived from the code's imports.

A stage of ``dvc.yaml`` runs ``python -m stages.<name>``; the code it runs is the import closure of
``stages.<name>`` inside the project (``modelupgrade.tools.imports``: every import statement, at any
level of a file, and the packages around each module). A stage whose ``deps`` miss a module of that
closure is reused by ``dvc repro`` after the module changed: a stale output. One that lists more
than the closure runs again for changes it cannot see.

    python -m modelupgrade.tools.dvc_deps --check   # exit 1 and list the differences, if any
    python -m modelupgrade.tools.dvc_deps --write   # rewrite the code lines of dvc.yaml's deps

A package is listed as its directory when the stage runs every module in it, else module by module.
``--write`` replaces only the ``stages/`` and ``modelupgrade/`` lines of each ``deps`` list (the
code first, then the stage's data dependencies in their order); comments and anchors stay.
"""

from __future__ import annotations

import argparse
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
_STAGE_MODULE = re.compile(r"python -m (stages\.\w+)")
_STAGE_NAME = re.compile(r"^  ([^\s#][^:]*):\s*$")
_DEPS_KEY = re.compile(r"^(\s+)deps:(\s+&\S+)?\s*$")
_LIST_ITEM = re.compile(r"^(\s+)- (.*?)\s*$")


def is_code(dep: str) -> bool:
    """A ``deps`` entry naming project code (as opposed to data)."""
    return any(dep == root or dep.startswith(root + "/") for root in CODE_ROOTS)


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

    def code_deps(self, stage_module: str) -> list[str]:
        """The ``deps`` entries naming the code that ``python -m <stage_module>`` runs."""
        closure = import_closure(self.graph, [stage_module])
        return sorted(entry for root in CODE_ROOTS for entry in self._collapsed(root, closure))

    @cached_property
    def graph(self) -> dict[str, set[str]]:
        return graph_of({name: self.root / path for name, path in self.modules.items()})

    def _entry(self, module: str) -> str:
        return self.modules[module].as_posix()

    def _members(self, package: str) -> list[str]:
        return [m for m in self.modules if m == package or m.startswith(package + ".")]

    def _collapsed(self, package: str, closure: set[str]) -> list[str]:
        """``package``'s directory if ``closure`` holds all of it, else its parts in ``closure``."""
        members = self._members(package)
        if all(m in closure for m in members):
            return [self.modules[package].parent.as_posix()]
        entries = [self._entry(package)] if package in closure else []
        for child in (m for m in members if m.count(".") == package.count(".") + 1):
            if child not in closure:
                continue
            is_package = self.modules[child].name == "__init__.py"
            entries += self._collapsed(child, closure) if is_package else [self._entry(child)]
        return entries


def stage_modules(dvc_yaml: Mapping[str, Any]) -> dict[str, str]:
    """Stage (or stage group) name → the ``stages.<name>`` module its command runs."""
    found = {}
    for name, stage in dvc_yaml["stages"].items():
        definition = stage.get("do", stage)
        (module,) = _STAGE_MODULE.findall(definition["cmd"])
        found[name] = module
    return found


def differences(project: Project, text: str) -> list[str]:
    """One line per code dependency a stage of the dvc.yaml ``text`` lacks or lists in vain."""
    parsed = yaml.safe_load(text)
    problems = []
    for name, module in stage_modules(parsed).items():
        stage = parsed["stages"][name]
        listed = {dep for dep in stage.get("do", stage).get("deps") or [] if is_code(dep)}
        wanted = set(project.code_deps(module))
        problems += [f"{name}: missing {dep} (imported by {module})" for dep in wanted - listed]
        problems += [
            f"{name}: lists {dep}, which {module} does not import" for dep in listed - wanted
        ]
    return sorted(problems)


def rewritten(project: Project, text: str) -> str:
    """The dvc.yaml ``text`` with each ``deps`` list's code lines replaced by the generated ones."""
    modules = stage_modules(yaml.safe_load(text))
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
        if stage is None or not _DEPS_KEY.match(line):
            continue
        items = []
        while i < len(lines) and (item := _LIST_ITEM.match(lines[i])):
            items.append(item)
            i += 1
        if not items:
            raise ValueError(f"dvc.yaml: the deps of stage {stage} are not a block list")
        indent = items[0].group(1)
        data = [item.group(2) for item in items if not is_code(item.group(2))]
        out += _items(indent, project.code_deps(modules[stage]) + data)
    return "".join(out)


def _items(indent: str, entries: Iterable[str]) -> list[str]:
    return [f"{indent}- {entry}\n" for entry in entries]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="list differences; exit 1 if any")
    action.add_argument("--write", action="store_true", help="rewrite dvc.yaml's code deps")
    parser.add_argument("--dvc-yaml", type=Path, default=ROOT / "dvc.yaml", help="the file")
    args = parser.parse_args(argv)
    project = Project.at(args.dvc_yaml.resolve().parent)
    text = args.dvc_yaml.read_text(encoding="utf-8")
    if args.write:
        args.dvc_yaml.write_text(rewritten(project, text), encoding="utf-8")
        return 0
    problems = differences(project, text)
    for problem in problems:
        print(problem)
    if problems:
        print("fix: python -m modelupgrade.tools.dvc_deps --write", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
