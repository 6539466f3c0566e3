"""Each DVC stage's code dependencies are the import closure of its ``stages.<name>`` module."""

from __future__ import annotations

import textwrap
from pathlib import Path

from modelupgrade.tools.dvc_deps import Project, differences, rewritten

ROOT = Path(__file__).resolve().parents[1]


def write_project(root: Path, files: dict[str, str]) -> Project:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return Project.at(root)


SMALL = {
    "modelupgrade/__init__.py": "",
    # A function-level import runs when the stage calls the function: it is in the closure.
    "modelupgrade/a.py": "def f():\n    from modelupgrade.sub.b import B\n    return B\n",
    "modelupgrade/sub/__init__.py": "",
    "modelupgrade/sub/b.py": "B = 1\n",
    "modelupgrade/sub/unused.py": "",
    "modelupgrade/whole/__init__.py": "from .one import ONE\n",
    "modelupgrade/whole/one.py": "ONE = 1\n",
    "stages/__init__.py": "",
    "stages/x.py": "from modelupgrade.a import f\nimport modelupgrade.whole\n",
    "stages/y.py": "",
}
SMALL_DVC_YAML = """\
stages:
  x:
    # a comment that stays
    cmd: python -m stages.x --out out
    deps: &x_deps
      - stages/x.py
      - modelupgrade/sub
      - data/input
    outs:
      - out
  x_again:
    cmd: python -m stages.x --out out2
    deps: *x_deps
    outs:
      - out2
"""


def test_the_closure_holds_function_level_imports_and_packages_around_each_module(
    tmp_path: Path,
) -> None:
    project = write_project(tmp_path, SMALL)
    assert project.code_deps("stages.x") == [
        "modelupgrade/__init__.py",
        "modelupgrade/a.py",
        "modelupgrade/sub/__init__.py",
        "modelupgrade/sub/b.py",
        "modelupgrade/whole",  # every module of the package: its directory
        "stages/__init__.py",
        "stages/x.py",
    ]


def test_the_check_names_what_a_stage_misses_and_what_it_lists_in_vain(tmp_path: Path) -> None:
    project = write_project(tmp_path, SMALL)
    problems = differences(project, SMALL_DVC_YAML)
    assert "x: missing modelupgrade/a.py (imported by stages.x)" in problems
    assert "x_again: lists modelupgrade/sub, which stages.x does not import" in problems
    fixed = rewritten(project, SMALL_DVC_YAML)
    assert differences(project, fixed) == []
    assert "    # a comment that stays\n" in fixed
    assert "deps: &x_deps\n" in fixed and "deps: *x_deps\n" in fixed
    assert fixed.endswith(
        "      - stages/x.py\n      - data/input\n    outs:\n      - out\n"
        + (
            "  x_again:\n    cmd: python -m stages.x --out out2\n    deps: *x_deps\n"
            "    outs:\n      - out2\n"
        )
    )


def test_dvc_yaml_lists_the_import_closure_of_every_stage() -> None:
    """Fix with ``python -m modelupgrade.tools.dvc_deps --write``."""
    assert differences(Project.at(ROOT), (ROOT / "dvc.yaml").read_text(encoding="utf-8")) == []


def test_removing_one_code_line_of_dvc_yaml_fails_the_check() -> None:
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    line = "      - modelupgrade/config\n"
    assert line in text
    broken = text.replace(line, "", 1)
    assert differences(Project.at(ROOT), broken) == [
        "prepare: missing modelupgrade/config (imported by stages.prepare)"
    ]
    assert rewritten(Project.at(ROOT), broken) == text
