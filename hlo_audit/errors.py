"""User-facing errors: one line on stderr, exit code 2, never a traceback."""

from __future__ import annotations

import functools
import sys

import typer

from hlo_audit.cache import CacheError
from hlo_audit.config import ConfigError
from hlo_audit.files import OutputError
from hlo_audit.golden.store import GoldenError
from hlo_audit.hlo.text import HloParseError
from hlo_audit.lowering import TargetError
from hlo_audit.matrix import MatrixError
from hlo_audit.usage import InputError

EXIT_OK, EXIT_DIFFERENCE, EXIT_INPUT_ERROR = 0, 1, 2

USER_ERRORS = (InputError, HloParseError, ConfigError, MatrixError, TargetError, GoldenError, OutputError,
               CacheError)


def print_error(message: object) -> None:
    """The one line a user error prints on stderr (control characters in it made visible: it may quote input)."""
    print(f"hlo-audit: error: {_one_line(message)}", file=sys.stderr)


def warn(message: object) -> None:
    """A problem that changes nothing about the result (a job summary that could not be written): one line on
    stderr."""
    print(f"hlo-audit: warning: {_one_line(message)}", file=sys.stderr)


def _one_line(message: object) -> str:
    from hlo_audit.report.escape import visible  # noqa: PLC0415 (rich loads only when an error is printed)

    return visible(message)


def exit_on_input_error(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as exc:
            print_error(exc)
            raise typer.Exit(EXIT_INPUT_ERROR) from None
        except KeyboardInterrupt:
            print("hlo-audit: interrupted", file=sys.stderr)
            raise typer.Exit(130) from None
    return wrapper
