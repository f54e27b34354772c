"""The CLI run in this process: what a test of a command's output and exit status needs, without a process.

One place for every test that runs a command: ``cli`` (the command line as given), ``in_project`` (the same with
the project's config), ``hlo_audit_here`` (from a folder, read as a finished subprocess is). A Python exception
escaping a command fails the test: a user would see a traceback, never an exit code."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import traceback
from pathlib import Path

from typer.testing import CliRunner, Result

from hlo_audit.cli import app


def cli(*args, env: dict | None = None, columns: int | None = None, input: str | bytes | None = None) -> Result:
    """``hlo-audit ARGS`` by typer's runner; ``columns``: the terminal width tables are drawn for; ``input``: stdin."""
    settings = {**({"COLUMNS": str(columns)} if columns else {}), **(env or {})}
    result = CliRunner().invoke(app, [str(a) for a in args], input=input, env=settings or None)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"hlo-audit {' '.join(map(str, args))} raised "
                             f"{type(result.exception).__name__}: {result.exception}") from result.exception
    return result


def in_project(project: Path, *args, config: bool = True, **options) -> Result:
    """``hlo-audit ARGS --config PROJECT/hlo-audit.toml`` (``config=False``: as given), options as ``cli``'s."""
    return cli(*args, *(["--config", project / "hlo-audit.toml"] if config else []), **options)


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


def diff_texts(old: str, new: str):
    """Two modules' texts compared as ``hlo-audit diff`` compares them (``hlo.diff.diff_modules``), no text diff."""
    from hlo_audit.hlo.analysis import analyze
    from hlo_audit.hlo.diff import diff_modules

    return diff_modules(analyze(old, "old"), analyze(new, "new"), max_text_lines=0)


def cli_diff(tmp_path: Path, old: str, new: str) -> Result:
    """``hlo-audit diff`` of two modules' texts, written to ``tmp_path``."""
    (tmp_path / "old.hlo").write_text(old)
    (tmp_path / "new.hlo").write_text(new)
    return cli("diff", tmp_path / "old.hlo", tmp_path / "new.hlo")


def named_of_kind(d, kind) -> list:
    """A diff's named changes of one kind (``ChangeKind``)."""
    return [c for c in d.named if c.kind is kind]
