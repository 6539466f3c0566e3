"""User-facing errors: one exception type that carries what went wrong and how to fix it.

Stages and the CLI catch ``USER_ERRORS`` at the top and print them without a traceback, so that a
person who gave bad input reads a sentence, not a stack. ``UserError`` and the config's
``ParamsError`` (a bad params file) are both ``HintedError``s: the config is a leaf of the library,
so the common base lives there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pydantic import ValidationError

from modelupgrade.config.errors import HintedError, validation_problems

F = TypeVar("F", bound=Callable[..., object])


class UserError(HintedError):
    """An error caused by input the user controls (files, params, arguments).

    ``hint`` tells the user what to do about it.
    """


def not_valid(err: ValidationError, what: str, hint: str) -> UserError:
    """``what`` (a sentence without its end) failed ``err``'s validation: its first problems."""
    return UserError(f"{what}: {'; '.join(validation_problems(err)[:5])}", hint=hint)


class DataValidationError(UserError):
    """A data expectation failed; nothing downstream may run on this data."""


# Bad input the user controls (a bad params file is one): reported as one error line and exit code
# 2, never retried.
USER_ERRORS: tuple[type[HintedError], ...] = (HintedError,)

# Exit codes of a command that ran but did not do all of its work (its result's ``exit_code``; the
# CLI prints its ``exit_message`` as the error line). A user error exits with 2.
EXIT_INCOMPLETE = 1  # some items failed or were skipped; the message counts them and says where
EXIT_STOPPED = 143  # stopped by SIGTERM (128 + 15, what a shell reports for a SIGTERM-ed process)
