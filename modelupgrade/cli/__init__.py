"""The ``modelupgrade`` command: the whole workflow for people who work without DVC.

Each command group lives in its own module of this package and exposes ``register(app)``.
"""

from __future__ import annotations

import importlib

import typer

from modelupgrade.errors import USER_ERRORS
from modelupgrade.runtime import setup_logging

app = typer.Typer(
    name="modelupgrade",
    help="Upgrade the embedding model of an image-retrieval system without offline re-indexing.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Modules that contribute commands, in the order --help lists them; each defines
# register(app: typer.Typer) -> None.
_COMMAND_MODULES: tuple[str, ...] = ("workflow", "store", "registry")


def _register_commands() -> None:
    for module_name in _COMMAND_MODULES:
        importlib.import_module(f"modelupgrade.cli.{module_name}").register(app)


_register_commands()


def main() -> None:
    setup_logging()
    try:
        app()
    except USER_ERRORS as err:
        typer.echo(f"error: {err}", err=True)
        raise SystemExit(err.exit_code) from None
