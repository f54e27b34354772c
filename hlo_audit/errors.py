"""User-facing errors: one line on stderr, exit code 2, never a traceback."""

from __future__ import annotations

import functools
import sys

import typer
from typer.core import TyperGroup

try:  # typer 0.2x carries its own copy of click; the exceptions its parser raises are that copy's
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover (typer on click itself)
    from click import exceptions as click_errors

from hlo_audit import termination
from hlo_audit.cache import CacheError
from hlo_audit.config import ConfigError
from hlo_audit.files import NoWorkingDirectory, OutputError
from hlo_audit.golden.snapshot import GoldenError
from hlo_audit.hlo.text import HloParseError
from hlo_audit.lowering import TargetError
from hlo_audit.matrix import MatrixError
from hlo_audit.preflight import EnvironmentProblem
from hlo_audit.usage import EXIT_DIFFERENCE, EXIT_INPUT_ERROR, EXIT_OK, InputError  # noqa: F401 (usage's codes)

# click 8.2 raises this once it has printed a bare command's help; click 8.1 (typer 0.15, the low end of the range
# users get) has no such class and exits by itself: nothing to catch there.
_HELP_PRINTED = getattr(click_errors, "NoArgsIsHelpError", ())

USER_ERRORS = (InputError, HloParseError, ConfigError, MatrixError, TargetError, GoldenError, OutputError,
               CacheError, EnvironmentProblem, NoWorkingDirectory)


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


class OneLineUsageErrors(TyperGroup):
    """The command group whose usage errors (an unknown option, ``--jobs 0``, ``--top abc``, a missing argument) are
    said as every other input error is: one line on stderr naming the command and how to get its help, exit 2
    (click's own is a 3-6 line box). Used by ``CliRunner`` as by the console script."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _HELP_PRINTED:  # the help is printed already
            sys.exit(EXIT_INPUT_ERROR)
        except click_errors.UsageError as exc:
            print_error(usage_line(exc))
            sys.exit(EXIT_INPUT_ERROR)
        except click_errors.ClickException as exc:
            print_error(exc.format_message())
            sys.exit(exc.exit_code)
        except typer.Abort:  # end of input at a prompt (hlo-audit asks none)
            sys.exit(EXIT_INPUT_ERROR)
        sys.exit(code if isinstance(code, int) else EXIT_OK)


def usage_line(exc) -> str:
    """``run: Invalid value for '--jobs' / '-j': ... (hlo-audit run --help)``."""
    path = exc.ctx.command_path if exc.ctx is not None else ""
    command = path.partition(" ")[2]
    text = " ".join(exc.format_message().split())
    return f"{command + ': ' if command else ''}{text}{f' ({path} --help)' if path else ''}"


def exit_on_input_error(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as exc:
            stop = termination.stop_behind(exc)  # an error a signal caused is the signal's: 130, not 2
            if stop is not None:
                termination.announce(stop)
                raise typer.Exit(termination.exit_code(stop)) from None
            print_error(exc)
            raise typer.Exit(EXIT_INPUT_ERROR) from None
        except KeyboardInterrupt as stop:  # Ctrl-C, and SIGTERM / SIGHUP the same way (hlo_audit.termination)
            termination.announce(stop)
            raise typer.Exit(termination.exit_code(stop)) from None
    return wrapper
