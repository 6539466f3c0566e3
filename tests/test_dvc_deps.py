"""Each DVC stage's code dependency is the import closure of its ``stages.<name>`` module, written
by the ``closures`` stage: a change to a file of the closure changes the stage's closure file, a
change elsewhere does not."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from modelupgrade.tools.dvc_deps import Project, differences, rewritten, write_closures

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
    "stages/closures.py": "",
    "stages/x.py": "from modelupgrade.a import f\nimport modelupgrade.whole\n",
    "stages/y.py": "import modelupgrade.sub.unused\n",
}
SMALL_DVC_YAML = """\
stages:
  closures:
    cmd: python -m stages.closures --out closures
    deps:
      - modelupgrade
      - stages
    outs:
      - closures/stages.x.txt
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
  y:
    cmd: python -m stages.y --out out3
    deps:
      - closures/stages.y.txt
    outs:
      - out3
"""


def test_the_closure_holds_function_level_imports_and_packages_around_each_module(
    tmp_path: Path,
) -> None:
    project = write_project(tmp_path, SMALL)
    assert project.closure_files("stages.x") == [
        "modelupgrade/__init__.py",
        "modelupgrade/a.py",
        "modelupgrade/sub/__init__.py",
        "modelupgrade/sub/b.py",
        "modelupgrade/whole/__init__.py",
        "modelupgrade/whole/one.py",
        "stages/__init__.py",
        "stages/x.py",
    ]


def test_a_closure_file_changes_with_its_code_and_only_with_it(tmp_path: Path) -> None:
    write_project(tmp_path, SMALL)
    (tmp_path / "dvc.yaml").write_text(SMALL_DVC_YAML)
    assert write_closures(tmp_path, tmp_path / "closures") == {"stages.x": 8, "stages.y": 5}
    x, y = (tmp_path / "closures" / f"stages.{name}.txt" for name in "xy")
    before = x.read_text(), y.read_text()
    assert "  modelupgrade/sub/b.py\n" in before[0] and "unused" not in before[0]
    (tmp_path / "modelupgrade/sub/b.py").write_text("B = 2\n")  # in x's closure, not in y's
    write_closures(tmp_path, tmp_path / "closures")
    assert x.read_text() != before[0] and y.read_text() == before[1]


def test_the_check_names_what_a_stage_misses_and_what_it_lists_in_vain() -> None:
    problems = differences(SMALL_DVC_YAML)
    assert "x: missing closures/stages.x.txt (the code stages.x runs)" in problems
    assert "x_again: lists modelupgrade/sub, not the code stages.x runs" in problems
    assert "closures: missing the output closures/stages.y.txt" in problems
    fixed = rewritten(SMALL_DVC_YAML)
    assert differences(fixed) == []
    assert "    # a comment that stays\n" in fixed
    assert "deps: &x_deps\n" in fixed and "deps: *x_deps\n" in fixed
    assert "    outs:\n      - closures/stages.x.txt\n      - closures/stages.y.txt\n" in fixed
    assert fixed.endswith(
        "    deps: &x_deps\n      - closures/stages.x.txt\n      - data/input\n"
        "    outs:\n      - out\n"
        "  x_again:\n    cmd: python -m stages.x --out out2\n    deps: *x_deps\n"
        "    outs:\n      - out2\n"
        "  y:\n    cmd: python -m stages.y --out out3\n    deps:\n"
        "      - closures/stages.y.txt\n    outs:\n      - out3\n"
    )


def test_dvc_yaml_gives_every_stage_its_closure() -> None:
    """Fix with ``python -m modelupgrade.tools.dvc_deps --write``."""
    assert differences((ROOT / "dvc.yaml").read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("    deps:\n      - closures/stages.prepare.txt\n", "prepare: missing closures/"),
        ("    deps:\n      - modelupgrade\n", "closures: missing modelupgrade"),
        ("      - closures/stages.report.txt\n", "closures: missing the output"),
    ],
)
def test_removing_one_code_line_of_dvc_yaml_fails_the_check(line: str, problem: str) -> None:
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    assert line in text
    broken = text.replace(line, "    deps:\n" if line.startswith("    deps:") else "", 1)
    assert [p for p in differences(broken) if p.startswith(problem)], differences(broken)
    assert rewritten(broken) == text
