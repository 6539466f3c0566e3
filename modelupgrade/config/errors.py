"""The error a bad params file raises: what is wrong with it, and how to fix it.

The config package is a leaf of the library (it imports nothing else of ``modelupgrade``), so the
base of every error a person can fix, ``HintedError`` (a message, a hint, exit code 2), lives here;
``ParamsError`` and ``modelupgrade.errors.UserError`` are its two kinds, and the
front ends catch it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError


class HintedError(Exception):
    """An error caused by input a person controls; ``hint`` tells them what to do about it."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


class ParamsError(HintedError):
    """params.yaml (or an overlay of it) does not hold a valid configuration."""


def validation_problems(err: ValidationError, key: str = "") -> list[str]:
    """One line per problem of a pydantic validation, each naming its params key.

    ``key`` is where the validated mapping sits in params.yaml (e.g. ``strategies.bct.options``).
    """
    problems = []
    for e in err.errors():
        where = ".".join([key] * bool(key) + [str(p) for p in e["loc"]]) or "<top level>"
        if e["type"] == "extra_forbidden":
            problems.append(f"{where}: unknown key (remove it or check its spelling)")
        else:
            got = e.get("input")
            shown = "" if isinstance(got, dict) else f" (got {got!r})"
            problems.append(f"{where}: {e['msg']}{shown}")
    return problems


def invalid_params(source: str | Path, problems: Sequence[str], hint: str) -> ParamsError:
    """One error that lists every problem found in the params file ``source``."""
    listed = "\n".join(f"  - {problem}" for problem in problems)
    return ParamsError(f"{source} is not valid ({len(problems)} problem(s)):\n{listed}", hint=hint)
