"""The ``modelupgrade`` command: every command of ``modelupgrade.commands`` as a subcommand.

``COMMANDS`` names each subcommand's function; a subcommand's options come from its function
(``modelupgrade.cli.arguments``), which is imported only when that subcommand runs, so that
``modelupgrade --help`` reads the one-line summaries from the source without importing torch.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from modelupgrade.cli.arguments import run_command

DESCRIPTION = (
    "Upgrade the embedding model of an image-retrieval system without offline re-indexing."
)

# Subcommand → "module:function", in the order --help lists them.
COMMANDS: dict[str, str] = {
    "train": "modelupgrade.commands.training:train",
    "embed": "modelupgrade.commands.training:embed",
    "adopt": "modelupgrade.commands.adopt:adopt",
    "plan": "modelupgrade.commands.plan:plan",
    "upgrade": "modelupgrade.commands.upgrade:upgrade",
    "evaluate": "modelupgrade.commands.evaluation:evaluate",
    "simulate-backfill": "modelupgrade.commands.backfill:simulate_backfill",
    "store-ingest": "modelupgrade.commands.store:store_ingest",
    "backfill": "modelupgrade.commands.store:backfill",
    "search": "modelupgrade.commands.store:search",
    "serve": "modelupgrade.commands.store:serve",
    "store-status": "modelupgrade.commands.store:store_status",
    "store-verify": "modelupgrade.commands.store:store_verify",
    "store-erase": "modelupgrade.commands.store:store_erase",
    "store-update": "modelupgrade.commands.store:store_update",
    "cutover": "modelupgrade.commands.store:cutover",
    "rollback": "modelupgrade.commands.store:rollback",
    "cleanup": "modelupgrade.commands.store:cleanup",
    "promote": "modelupgrade.commands.registry:promote",
    "lineage": "modelupgrade.commands.registry:lineage",
    "experiments": "modelupgrade.commands.experiments:experiments",
    "gpu-study": "modelupgrade.commands.gpu_study:gpu_study",
}


def load_command(name: str) -> Callable[..., Any]:
    """The function behind subcommand ``name``."""
    module, _, function = COMMANDS[name].partition(":")
    return getattr(importlib.import_module(module), function)


def command_summary(name: str) -> str:
    """The first line of the docstring of subcommand ``name``'s function, read from its source."""
    module, _, function = COMMANDS[name].partition(":")
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise LookupError(f"the module {module} of command {name!r} does not exist")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return (ast.get_docstring(node) or "").split("\n")[0]
    raise LookupError(f"{module} defines no function {function!r} for command {name!r}")


def main_parser() -> argparse.ArgumentParser:
    """The top-level parser: the list of subcommands (each parses its own options)."""
    parser = argparse.ArgumentParser(
        prog="modelupgrade",
        description=DESCRIPTION,
        epilog="`modelupgrade <command> --help` lists a command's options and their defaults.",
    )
    subcommands = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name in COMMANDS:
        subcommands.add_parser(name, help=command_summary(name), add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``modelupgrade <command> [options]``; a user error exits with code 2."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments and arguments[0] in COMMANDS:
        name = arguments[0]
        run_command(load_command(name), arguments[1:], prog=f"modelupgrade {name}")
        return
    # --help, no command or an unknown one: argparse prints the listing or the error (exit 2).
    main_parser().parse_args(arguments)


__all__ = ["COMMANDS", "command_summary", "load_command", "main", "main_parser"]
