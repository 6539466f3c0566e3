"""The library's import structure: no import cycle, a leaf config, no torch for params.yaml, and
no front end (stages, flows) imported by the library.

The import graph (``modelupgrade.tools.imports``) counts every import statement, including those
inside functions: a cycle through a function-level import still means two modules that cannot be
understood, or imported, apart.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from modelupgrade.tools.imports import import_graph, imported_names, module_paths
from tests.processes import run_ok

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "modelupgrade"
FRONT_ENDS = ("stages", "flows")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


# ----- the walker itself, on small packages whose answer is known --------------------------------


@pytest.mark.parametrize(
    "files,expected",
    [
        pytest.param(
            {
                "pkg/__init__.py": "from pkg.a import A\n",
                # A submodule reading a name from its own package's __init__.
                "pkg/a.py": "def f():\n    from pkg import B\nA = 1\n",
                "pkg/b.py": "B = 2\n",
            },
            [["pkg", "pkg.a"]],
            id="finds-a-cycle-through-a-package-init",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "",
                "pkg/x/__init__.py": "from .one import ONE\n",
                "pkg/x/one.py": "def f():\n    from ..y import two\nONE = 1\n",
                "pkg/y/__init__.py": "",
                "pkg/y/two.py": "import pkg.x.one\n",
            },
            [["pkg.x", "pkg.x.one", "pkg.y.two"]],
            id="counts-function-level-and-relative-imports",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "from pkg.a import A\nfrom pkg.b import B\n",
                "pkg/a.py": "from pkg.b import B\nA = B\n",
                "pkg/b.py": "import pkg.c\nB = 2\n",
                "pkg/c.py": "",
            },
            [],
            id="lets-a-submodule-import-a-sibling-through-its-initialising-package",
        ),
    ],
)
def test_the_walker_finds_the_cycles_of_a_small_package(
    tmp_path: Path, files: dict[str, str], expected: list[list[str]]
) -> None:
    assert cycles(import_graph(write_package(tmp_path, files))) == expected


# ----- the library ------------------------------------------------------------------------------


def test_the_library_has_no_import_cycle() -> None:
    assert cycles(import_graph(LIBRARY)) == []


def test_the_config_imports_nothing_else_of_the_library() -> None:
    outside = {
        (module, name)
        for module, path in module_paths(LIBRARY).items()
        if module == "modelupgrade.config" or module.startswith("modelupgrade.config.")
        for name in imported_names(module, path)
        if name.split(".")[0] == "modelupgrade"
        and name != "modelupgrade.config"
        and not name.startswith("modelupgrade.config.")
    }
    assert outside == set()


def test_the_library_never_imports_a_front_end() -> None:
    front_end_imports = {
        (module, name)
        for module, path in module_paths(LIBRARY).items()
        for name in imported_names(module, path)
        if name.split(".")[0] in FRONT_ENDS
    }
    assert front_end_imports == set()


@pytest.mark.parametrize("module", ["modelupgrade.config", "modelupgrade.errors"])
def test_reading_params_does_not_import_torch(module: str) -> None:
    # A fresh interpreter: this test process has imported torch long ago.
    probe = (
        f"import sys, {module}\n"
        "from modelupgrade.config import read_params\n"
        "read_params('params.yaml')\n"
        "assert 'torch' not in sys.modules, 'reading params.yaml imported torch'\n"
    )
    run_ok([sys.executable, "-c", probe], ROOT)


# The layers that may run commands: the command-line front end itself and the orchestration layer
# (an upgrade chain runs the commands the DVC stages run; the Prefect plumbing).
MAY_IMPORT_COMMANDS = ("modelupgrade.commands", "modelupgrade.cli", "modelupgrade.chain")
# Known arrows pointing up, each to be removed by the change named; an entry that no longer
# imports the commands fails the test too, so that the list only shrinks.
KNOWN_UPWARD_IMPORTS: set[str] = set()


def test_no_library_module_below_the_commands_imports_them() -> None:
    importing = {
        module
        for module, path in module_paths(LIBRARY).items()
        if not module.startswith(MAY_IMPORT_COMMANDS)
        and any(
            name == "modelupgrade.commands" or name.startswith("modelupgrade.commands.")
            for name in imported_names(module, path)
        )
    }
    assert importing == KNOWN_UPWARD_IMPORTS
