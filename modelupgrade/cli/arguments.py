"""Command lines derived from the library's command functions: one definition of every option.

A command is a plain function of ``modelupgrade.commands``: its signature gives each option's name,
type and default, its docstring (first paragraph, then an ``Args:`` section) the help. The same
function is a DVC stage (``stages/<name>.py``), a subcommand of ``modelupgrade`` and what a Prefect
task calls, so an option cannot mean one thing in one front end and another elsewhere.

Mapping: ``a_name`` → ``--a-name``; ``bool`` → ``--a-name/--no-a-name``; ``list[T]`` or
``Sequence[T]`` → one or more values after the option (the option may also be repeated; with no
value it gives an empty list); ``Literal[...]`` → choices; ``X | None`` → optional; a parameter
without a default → a required option. A parameter typed ``Params`` is read from ``--params``
(default ``params.yaml``) through ``modelupgrade.params.load_params``; one typed ``ParamsFile``
(a Prefect flow's, which reads the file itself) gets the path given with ``--params``. Every command
also takes ``--json``: its result printed as JSON instead of text (``describe()``).

A Prefect flow is a command too (``stage_main(flow, shown_as=...)``): its signature and docstring
are read through the ``Flow`` object, and ``shown_as`` turns the record it returns into a typed
result to print. Arguments a front end fixes itself (``stage_main(f, name=value)``) are no options.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from modelupgrade.config import DEFAULT_PARAMS_FILE, DEFAULT_PARAMS_PATH, Params, ParamsFile
from modelupgrade.errors import USER_ERRORS
from modelupgrade.io import json_default

_SEQUENCES = (list, tuple, Sequence, typing.Sequence)
_JSON_DEST = "_json"


def command_doc(function: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """(description, {parameter: help}) from a Google-style docstring."""
    doc = inspect.getdoc(function) or ""
    description, _, rest = doc.partition("\nArgs:\n")
    helps: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        if line and not line.startswith(" "):
            break  # the next section (Returns:, ...)
        match = re.match(r"^ {4}(\w+): ?(.*)$", line)
        if match:
            current = match.group(1)
            helps[current] = match.group(2).strip()
        elif current and line.strip():
            helps[current] += " " + line.strip()
    return description.strip(), helps


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        arguments = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(arguments) == 1:
            return arguments[0]
    return annotation


def _scalar(annotation: Any, where: str) -> tuple[Callable[[str], Any], list[Any] | None]:
    """(converter, choices) of a single value."""
    if typing.get_origin(annotation) is typing.Literal:
        choices = list(typing.get_args(annotation))
        return type(choices[0]), choices
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        # str | Path and the like: a path given on the command line.
        return Path, None
    if annotation in (str, int, float, Path):
        return annotation, None
    raise TypeError(f"{where}: no command-line form for the type {annotation!r}")


def _shown(default: Any) -> str:
    if default is None or default == () or default == []:
        return ""
    if isinstance(default, (list, tuple)):
        return f" (default: {' '.join(str(v) for v in default)})"
    if isinstance(default, bool):
        return f" (default: {'yes' if default else 'no'})"
    return f" (default: {default})"


def command_parser(
    function: Callable[..., Any], prog: str | None = None, fixed: Collection[str] = ()
) -> argparse.ArgumentParser:
    """The argument parser of ``function``: one option per parameter (see the module docstring),
    except the parameters named in ``fixed``."""
    description, helps = command_doc(function)
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    hints = typing.get_type_hints(function)
    for name, parameter in inspect.signature(function).parameters.items():
        if name in fixed:
            continue
        where = f"{function.__module__}.{function.__qualname__}({name})"
        annotation = hints.get(name, str)
        flag = "--" + name.replace("_", "-")
        required = parameter.default is inspect.Parameter.empty
        default = None if required else parameter.default
        text = helps.get(name, "")
        if annotation in (Params, ParamsFile):
            path = DEFAULT_PARAMS_PATH if annotation is Params else default or DEFAULT_PARAMS_FILE
            parser.add_argument(
                "--params",
                dest=name,
                metavar="PARAMS",
                type=type(path),
                default=path,
                help=(text or "the params file: the validated configuration") + _shown(path),
            )
            continue
        base = _unwrap_optional(annotation)
        shown = "" if required else _shown(default)
        if base is bool:
            parser.add_argument(
                flag,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=default,
                required=required,
                help=text + shown,
            )
        elif typing.get_origin(base) in _SEQUENCES:
            convert, choices = _scalar(typing.get_args(base)[0], where)
            # ``extend``: several values after the option, and the option repeated, add up. The
            # parser's default stays None so that the function's own default fills in later.
            parser.add_argument(
                flag,
                dest=name,
                type=convert,
                choices=choices,
                nargs="+" if required else "*",
                action="extend",
                default=None,
                required=required,
                metavar=name.upper(),
                help=text + shown,
            )
        else:
            convert, choices = _scalar(base, where)
            parser.add_argument(
                flag,
                dest=name,
                type=convert,
                choices=choices,
                default=default,
                required=required,
                help=text + shown,
            )
    parser.add_argument(
        "--json", dest=_JSON_DEST, action="store_true", help="print the result as JSON"
    )
    return parser


def parse_command(
    function: Callable[..., Any],
    argv: Sequence[str] | None = None,
    prog: str | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], bool]:
    """(keyword arguments of ``function``, whether --json was given) from ``argv`` and ``fixed``.

    The params file is not read here: ``run_command`` reads it, where its errors are reported.
    """
    fixed = dict(fixed or {})
    arguments = vars(command_parser(function, prog, fixed).parse_args(argv))
    as_json = arguments.pop(_JSON_DEST)
    for name, parameter in inspect.signature(function).parameters.items():
        if arguments.get(name) is None and parameter.default is not inspect.Parameter.empty:
            arguments[name] = parameter.default
    return {**arguments, **fixed}, as_json


def run_command(
    function: Callable[..., Any],
    argv: Sequence[str] | None = None,
    prog: str | None = None,
    shown_as: Callable[[Any], Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> Any:
    """Parse ``argv`` for ``function``, call it (with the ``fixed`` arguments too), print its
    result, through ``shown_as`` when given; a user error exits with 2."""
    arguments, as_json = parse_command(function, argv, prog, fixed)
    _skip_the_garbage_collection_at_exit()
    from modelupgrade.runtime import setup_logging  # torch: only once the arguments parse

    setup_logging()
    try:
        for name, annotation in typing.get_type_hints(function).items():
            if annotation is Params and name in arguments:
                from modelupgrade.params import load_params

                arguments[name] = load_params(arguments[name])
        result = function(**arguments)
        if shown_as is not None:
            result = shown_as(result)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    show(result, as_json)
    exit_code = getattr(result, "exit_code", 0)
    if exit_code:
        message = getattr(result, "exit_message", None)
        if message:
            print(f"error: {message}", file=sys.stderr)
        raise SystemExit(exit_code)
    return result


@functools.cache
def _skip_the_garbage_collection_at_exit() -> None:
    """Freeze every object as the interpreter exits, after the other exit handlers (this one is
    registered before the command imports the libraries that add theirs): the final cyclic
    collection over torch's, MLflow's and pandas' objects takes 1-2 s, paid by every stage of
    ``dvc repro`` and every command. Objects are still released as their modules are torn down;
    only unreachable cycles are left to the operating system, with the process's memory."""
    atexit.register(gc.freeze)


def show(result: Any, as_json: bool) -> None:
    """Print a command's result: ``describe()`` as text, or ``as_dict()`` (or itself) as JSON."""
    if result is None:
        return
    if as_json:
        data = result.as_dict() if hasattr(result, "as_dict") else result
        print(json.dumps(data, indent=2, default=json_default))
    elif hasattr(result, "describe"):
        print(result.describe())
    elif isinstance(result, str):
        print(result)
    else:
        print(json.dumps(result, indent=2, default=json_default))


def stage_main(
    function: Callable[..., Any], shown_as: Callable[[Any], Any] | None = None, **fixed: Any
) -> Callable[[Sequence[str] | None], Any]:
    """The ``main`` of a stage or flow module: its command line is ``function``'s (a function or a
    Prefect flow), without the parameters the module ``fixed`` itself; its result is printed as
    ``shown_as(result)`` when given."""

    def main(argv: Sequence[str] | None = None) -> Any:
        module = sys.modules.get("__main__")
        spec = getattr(module, "__spec__", None)
        prog = f"python -m {spec.name}" if spec is not None else None
        return run_command(function, argv, prog, shown_as, fixed)

    return main


__all__ = ["command_doc", "command_parser", "parse_command", "run_command", "show", "stage_main"]
