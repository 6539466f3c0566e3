"""One definition per command: every DVC stage module is only its command function's ``main``, the
``modelupgrade`` command lists every command function, and dvc.yaml runs stage modules only."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
import yaml

import modelupgrade.commands
from modelupgrade.cli import COMMANDS, load_command, main_parser
from modelupgrade.cli.arguments import command_parser

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(p for p in (ROOT / "stages").glob("*.py") if p.name != "__init__.py")
# Modules of modelupgrade.commands that hold helpers, not commands.
HELPER_MODULES = {"modelupgrade.commands.results"}


def stage_shape_problems(source: str) -> list[str]:
    """What makes a stage module more than: docstring, imports, ``main = stage_main(f)`` with ``f``
    imported from ``modelupgrade.commands``, and ``if __name__ == "__main__": main()``."""
    body = ast.parse(source).body
    problems = []
    if not (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return ["no usage docstring first"]
    commands: set[str] = set()
    imported: set[str] = set()
    assigned = guarded = 0
    for node in body[1:]:
        if isinstance(node, ast.ImportFrom):
            names = {alias.asname or alias.name for alias in node.names}
            imported |= names
            if (node.module or "").startswith("modelupgrade.commands."):
                commands |= names
        elif isinstance(node, ast.Assign):
            call = node.value
            if not (
                len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "main"
                and isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "stage_main"
                and len(call.args) == 1
                and not call.keywords
                and isinstance(call.args[0], ast.Name)
                and call.args[0].id in commands
            ):
                problems.append(f"line {node.lineno}: not main = stage_main(<a command function>)")
            assigned += 1
        elif isinstance(node, ast.If):
            expected = ast.parse('if __name__ == "__main__":\n    main()').body[0]
            if ast.dump(node) != ast.dump(expected):
                problems.append(f"line {node.lineno}: not the __main__ guard calling main()")
            guarded += 1
        else:
            problems.append(f"line {node.lineno}: a {type(node).__name__} beyond the stage's main")
    if "stage_main" not in imported:
        problems.append("stage_main is not imported")
    if assigned != 1:
        problems.append(f"{assigned} assignments of main, not one")
    if guarded != 1:
        problems.append("no __main__ guard")
    return problems


@pytest.mark.parametrize("path", STAGES, ids=lambda p: p.stem)
def test_a_stage_module_is_only_its_command_functions_main(path: Path) -> None:
    assert stage_shape_problems(path.read_text(encoding="utf-8")) == []


def test_the_shape_check_refuses_a_stage_that_does_work() -> None:
    good = (
        '"""Stage: x."""\n\nfrom modelupgrade.cli.arguments import stage_main\n'
        "from modelupgrade.commands.data import prepare\n\nmain = stage_main(prepare)\n\n"
        'if __name__ == "__main__":\n    main()\n'
    )
    assert stage_shape_problems(good) == []
    with_logic = good.replace(
        "main = stage_main(prepare)", "def run():\n    pass\n\n\nmain = stage_main(prepare)"
    )
    assert stage_shape_problems(with_logic) == ["line 6: a FunctionDef beyond the stage's main"]
    not_a_command = good.replace("stage_main(prepare)", "stage_main(print)")
    assert stage_shape_problems(not_a_command) == [
        "line 6: not main = stage_main(<a command function>)"
    ]


def command_functions() -> dict[str, object]:
    """Every public function defined in a module of ``modelupgrade.commands``: ``module:name``."""
    found = {}
    for info in pkgutil.iter_modules(modelupgrade.commands.__path__, "modelupgrade.commands."):
        if info.name in HELPER_MODULES:
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isfunction(value)
                and value.__module__ == info.name
                and not name.startswith("_")
            ):
                found[f"{info.name}:{name}"] = value
    return found


def stage_commands() -> set[str]:
    """``module:function`` of the command each stage module runs."""
    targets = set()
    for path in STAGES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        origin = {
            alias.name: node.module
            for node in tree.body
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                function = node.value.args[0].id  # type: ignore[attr-defined]
                targets.add(f"{origin[function]}:{function}")
    return targets


def test_the_modelupgrade_parser_lists_every_command() -> None:
    listed = main_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert list(listed) == list(COMMANDS)
    for name in COMMANDS:
        parser = command_parser(load_command(name), f"modelupgrade {name}")
        unexplained = [a.dest for a in parser._actions if not a.help]
        assert not unexplained, f"{name}: options without help: {unexplained}"


def test_every_command_function_is_a_stage_or_a_modelupgrade_command() -> None:
    reachable = set(COMMANDS.values()) | stage_commands()
    assert set(command_functions()) - reachable == set()
    assert reachable - set(command_functions()) == set()


def test_dvc_yaml_runs_stage_modules_and_depends_on_their_code() -> None:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    for name, stage in stages.items():
        stage = stage.get("do", stage)
        (module,) = re.findall(r"python -m stages\.(\w+)", stage["cmd"])
        assert (ROOT / "stages" / f"{module}.py").is_file(), name
        tree = ast.parse((ROOT / "stages" / f"{module}.py").read_text(encoding="utf-8"))
        (command_module,) = {
            n.module
            for n in tree.body
            if isinstance(n, ast.ImportFrom)
            and (n.module or "").startswith("modelupgrade.commands.")
        }
        deps = set(stage["deps"])
        assert f"stages/{module}.py" in deps, name
        assert command_module.replace(".", "/") + ".py" in deps, name


def test_nothing_imports_typer() -> None:
    for folder in ("modelupgrade", "stages", "flows"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                assert not any(n.split(".")[0] == "typer" for n in names), path
