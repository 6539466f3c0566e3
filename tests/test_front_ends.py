"""One definition per command: every DVC stage module is only its command function's ``main``, the
``modelupgrade`` command lists every command function, dvc.yaml runs stage modules only, and a
Prefect flow module holds flows, tasks that each make one call into the library,
and its ``main``."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

import modelupgrade.commands
from modelupgrade.cli import COMMANDS, load_command, main_parser
from modelupgrade.cli.arguments import command_parser
from modelupgrade.tools.dvc_deps import Project

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(p for p in (ROOT / "stages").glob("*.py") if p.name != "__init__.py")
FLOWS = sorted((ROOT / "flows").glob("*.py"))
PROJECT = Project.at(ROOT)
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


# What a flow module's tasks may call besides their one library call: Prefect's API, the flows'
# Prefect plumbing, a conversion of the result to text, and the result's conversion to JSON.
PLUMBING_MODULES = ("prefect", "modelupgrade.orchestration")
CONVERSIONS = {"str"}
RESULT_CONVERSIONS = {"as_dict"}
TASK_DECORATORS = {"task", "flow_task"}
CONTROL_FLOW = (
    ast.If,
    ast.IfExp,
    ast.For,
    ast.While,
    ast.Try,
    ast.With,
    ast.Match,
    ast.FunctionDef,
    ast.Lambda,
    ast.comprehension,
)


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name → the module it is imported from (``import a.b`` binds ``a`` to ``a``)."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.update({alias.asname or alias.name: node.module or "" for alias in node.names})
        elif isinstance(node, ast.Import):
            found.update(
                {alias.asname or alias.name.split(".")[0]: alias.name for alias in node.names}
            )
    return found


def _is_plumbing(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PLUMBING_MODULES)


def _decorator_name(decorator: ast.expr) -> str | None:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return target.id if isinstance(target, ast.Name) else None


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def task_problems(function: ast.FunctionDef, imported: dict[str, str]) -> list[str]:
    """What makes a task more than one library call: control flow, calls outside the library and
    Prefect, or a number of library calls other than one. ``X(...).step(...)`` is one call (a
    library object and its step); a conversion of the result (``str``, ``.as_dict()``) is none."""
    where = f"line {function.lineno}: task {function.name}"
    problems = [
        f"{where}: {type(node).__name__} at line {node.lineno}"
        for statement in function.body
        for node in ast.walk(statement)
        if isinstance(node, CONTROL_FLOW)
    ]
    calls = [node for node in ast.walk(function) if isinstance(node, ast.Call)]
    # The library object of ``X(...).step(...)``: its call is part of the step's.
    receivers = {
        id(call.func.value)
        for call in calls
        if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Call)
    }
    library_calls = []
    for call in calls:
        func = call.func
        root = _root_name(func)
        origin = imported.get(root or "")
        if isinstance(func, ast.Name):
            if func.id in CONVERSIONS or (origin is not None and _is_plumbing(origin)):
                continue
            if origin is not None and origin.startswith("modelupgrade"):
                if id(call) not in receivers:
                    library_calls.append(func.id)
                continue
            problems.append(f"{where}: calls {func.id}, neither the library nor Prefect")
        elif isinstance(func, ast.Attribute):
            if func.attr in RESULT_CONVERSIONS:
                continue
            if origin is not None and not origin.startswith("modelupgrade"):
                if not _is_plumbing(origin):
                    problems.append(
                        f"{where}: calls {root}.{func.attr}, neither the library nor Prefect"
                    )
                continue
            library_calls.append(func.attr)
    if len(library_calls) != 1:
        problems.append(
            f"{where}: {len(library_calls)} library calls ({', '.join(library_calls) or 'none'}), "
            "not one"
        )
    return problems


def flow_module_problems(source: str) -> list[str]:
    """What makes a flow module more than flows, tasks of one library call each, and its main:
    any class, and any other function (a helper holds logic the library should hold)."""
    tree = ast.parse(source)
    imported = _imports(tree)
    problems = [
        f"line {node.lineno}: class {node.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        decorators = {_decorator_name(d) for d in node.decorator_list}
        kinds = {
            "flow" if name == "flow" else "task"
            for name in decorators
            if name in TASK_DECORATORS | {"flow"} and _is_plumbing(imported.get(name, ""))
        }
        if kinds == {"task"}:
            problems += task_problems(node, imported)  # type: ignore[arg-type]
        elif kinds != {"flow"} and node.name != "main":
            problems.append(f"line {node.lineno}: {node.name} is neither a flow, a task nor main")
    return problems


@pytest.mark.parametrize(
    ("path", "problems"),
    [pytest.param(path, stage_shape_problems, id=f"stage-{path.stem}") for path in STAGES]
    + [pytest.param(path, flow_module_problems, id=f"flow-{path.stem}") for path in FLOWS],
)
def test_a_stage_or_flow_module_holds_only_what_its_kind_may(
    path: Path, problems: Callable[[str], list[str]]
) -> None:
    """A stage module is only its command function's ``main`` (``stage_shape_problems``); a
    flow module holds flows, tasks of one library call each, and its ``main``
    (``flow_module_problems``)."""
    assert problems(path.read_text(encoding="utf-8")) == []


def test_the_flow_check_refuses_domain_logic_in_a_flow_module() -> None:
    good = (
        '"""Flows: x."""\n\nfrom prefect import flow\n\n'
        "from modelupgrade.chain import load_chain\n"
        "from modelupgrade.cli.arguments import stage_main\n"
        "from modelupgrade.orchestration import flow_task, progress_artifact\n\n\n"
        '@flow_task("evaluate")\n'
        "def evaluate(params_path: str, work_dir: str, generations: int) -> str:\n"
        '    """Evaluate."""\n'
        "    return str(load_chain(params_path, work_dir).evaluate(generations).metrics_dir)\n\n\n"
        '@flow_task("follow")\n'
        "def follow(params_path: str, work_dir: str) -> dict:\n"
        "    chain = load_chain(params_path, work_dir)\n"
        '    return chain.follow_champion(None, progress_artifact("p")).as_dict()\n\n\n'
        '@flow(name="x")\n'
        "def x(params_path: str) -> str:\n"
        "    if params_path:\n"
        '        return evaluate(params_path, "w", 2)\n'
        '    return ""\n\n\n'
        "main = stage_main(x)\n"
    )
    # A task that keeps the library object and calls it makes two calls.
    assert flow_module_problems(good) == [
        "line 17: task follow: 2 library calls (load_chain, follow_champion), not one"
    ]
    good = good.replace(
        "    chain = load_chain(params_path, work_dir)\n    return chain.follow_champion",
        "    return load_chain(params_path, work_dir).follow_champion",
    )
    assert flow_module_problems(good) == []
    helper = good.replace("main = stage_main(x)", "def total(n: int) -> int:\n    return n + 1")
    assert flow_module_problems(helper) == ["line 28: total is neither a flow, a task nor main"]
    with_class = good.replace("main = stage_main(x)", "class Settings:\n    pass")
    assert flow_module_problems(with_class) == ["line 28: class Settings"]
    two_steps = good.replace(
        ".evaluate(generations).metrics_dir)",
        ".evaluate(generations).metrics_dir) + str(load_chain(params_path, work_dir).register(2))",
    )
    assert flow_module_problems(two_steps) == [
        "line 11: task evaluate: 2 library calls (register, evaluate), not one"
    ]
    branching = good.replace(
        '    """Evaluate."""\n',
        '    """Evaluate."""\n    if generations < 1:\n        return ""\n',
    )
    assert flow_module_problems(branching) == ["line 11: task evaluate: If at line 13"]
    outside = good.replace(
        "from prefect import flow\n", "import shutil\nfrom prefect import flow\n"
    )
    outside = outside.replace(
        '    """Evaluate."""\n', '    """Evaluate."""\n    shutil.rmtree(work_dir)\n'
    )
    assert flow_module_problems(outside) == [
        "line 12: task evaluate: calls shutil.rmtree, neither the library nor Prefect"
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
        if module == "closures":  # it writes the others' closures from all of the code
            assert {"modelupgrade", "stages"} <= deps, name
            continue
        assert f"closures/stages.{module}.txt" in deps, name
        closure = PROJECT.closure_files(f"stages.{module}")
        assert f"stages/{module}.py" in closure, name
        assert command_module.replace(".", "/") + ".py" in closure, name


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
