"""The CLI run in this process: what a test of a command's output and exit status needs, without a process."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import traceback
from pathlib import Path

from typer.testing import CliRunner

from hlo_audit.cli import app


@dataclasses.dataclass
class Ran:
    """A CLI run in this process, read as a finished subprocess is read."""

    returncode: int
    stdout: str
    stderr: str


def hlo_audit_here(cwd: Path, *args, env: dict | None = None) -> Ran:
    """``hlo-audit ARGS`` from ``cwd``, run in this process by typer's runner: what a subprocess would show, without
    starting Python and importing jax again (~5 s a run on the CI machine). Only tests of what a process alone
    shows (the shell's exit status, signals, the streams as file descriptors, the installed entry point) start
    one. An exception that escapes the command is a traceback on stderr and exit status 1, as Python's own.
    sys.path is restored afterwards (a callable target's import puts the project folder on it)."""
    search_path = list(sys.path)
    try:
        with contextlib.chdir(cwd):
            result = CliRunner().invoke(app, [str(arg) for arg in args], env=env)
    finally:
        sys.path[:] = search_path
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return Ran(result.exit_code, result.stdout, stderr)
