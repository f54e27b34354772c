"""Exit codes mean one thing: 1 is a difference, a regression or a failing cell, and only that.

What a CI runner or a shell does to the process is an environment error, one line on stderr and exit 2 (issue 27):
standard output closed (``>&-``), read by nobody any more (``| head -1`` once head is gone: a passing `check
--format json` said "regression"), on a full device (``> /dev/full``); an ``XLA_FLAGS`` XLA refuses (it aborts the
process that lowers) or a ``JAX_*`` value jax refuses (a 74-line traceback). A usage error is one line, not
click's box. A ``$GITHUB_STEP_SUMMARY`` that cannot be written (a FIFO nobody reads, a folder, a device) is a
warning and the verdict's code, never a hang. Every case runs the real console script in a subprocess, as a shell
runs it; cases that need a passing check read its goldens from a project lowered once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hlo_audit.cli import app
from projects import config

REPO = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).with_name("hlo-audit")
CONFIG = config(scan=["off"])
SMALL = "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT r = f32[2] negate(p)\n}\n"


def hlo_audit(*args, cwd: Path | None = None, env: dict | None = None, **popen) -> subprocess.CompletedProcess:
    run_env = {**os.environ, "PYTHONPATH": str(REPO)}
    run_env.pop("GITHUB_STEP_SUMMARY", None)
    run_env.update(env or {})
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("timeout", 300)
    return subprocess.run([str(CLI), *map(str, args)], cwd=cwd, stderr=subprocess.PIPE, text=True, env=run_env,
                          check=False, **popen)


def one_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    """The one line on stderr (besides the CI log's line per cell), with the exit code; never a traceback."""
    lines = [line for line in result.stderr.splitlines() if not line.startswith("hlo-audit: cell ")]
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The example NNX target, one cell, its golden written: `check` passes there (exit 0)."""
    root = tmp_path_factory.mktemp("exitcodes")
    (root / "hlo-audit.toml").write_text(CONFIG)
    result = CliRunner().invoke(app, ["golden", "update", "--config", str(root / "hlo-audit.toml")])
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("small") / "small.hlo"
    path.write_text(SMALL)
    return path


@pytest.fixture(scope="module")
def passing_report(project) -> str:
    """`check --format json` of the project: the gate passes."""
    passing = CliRunner().invoke(app, ["check", "--format", "json", "--config", str(project / "hlo-audit.toml")])
    assert passing.exit_code == 0 and json.loads(passing.stdout)["exit_code"] == 0, passing.output
    return passing.stdout


# --------------------------------------------------------------------------------------------------------------
# Standard output
# --------------------------------------------------------------------------------------------------------------


def test_standard_output_closed_is_one_line_and_exit_2(small):
    run_env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(["bash", "-c", 'exec "$0" count "$1" >&-', str(CLI), str(small)], stderr=subprocess.PIPE,
                            text=True, env=run_env, timeout=60, check=False)
    line = one_line(result)
    assert line == "hlo-audit: error: standard output is closed (>&-): redirect it to a file or /dev/null"


def test_standard_output_on_a_full_device_is_one_line_and_exit_2(small):
    with open("/dev/full", "w") as full:
        line = one_line(hlo_audit("count", small, "--format", "json", stdout=full))
    assert line == "hlo-audit: error: standard output: cannot write: No space left on device"


def test_a_passing_check_whose_reader_went_away_is_not_a_regression(project, passing_report):
    """`check --format json | head -1` with head gone: the gate passed (``passing_report``), so never exit 1; the
    pipe's end is exit 2."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the report is written
    try:
        result = hlo_audit("check", "--format", "json", cwd=project, stdout=write)
    finally:
        os.close(write)
    assert one_line(result) == "hlo-audit: error: standard output: the reader went away (broken pipe)"


def test_a_passing_check_with_both_streams_full_is_exit_2(project):
    """`check > log 2>&1` on a full volume (issue 34): the line saying standard output failed failed in turn, and a
    passing check exited 1 with no message. Now exit 2, whichever of the streams failed: both, or standard error
    alone (what the command said there is lost)."""
    run_env = {**os.environ, "PYTHONPATH": str(REPO)}
    run_env.pop("GITHUB_STEP_SUMMARY", None)
    for redirect in ("> /dev/full 2>&1", "> /dev/null 2> /dev/full"):
        ran = subprocess.run(["bash", "-c", f'exec "$0" check {redirect}', str(CLI)], cwd=project, env=run_env,
                             timeout=300, check=False)
        assert ran.returncode == 2, redirect
    with open("/dev/full", "w") as full:  # with standard error writable, the one line as before
        line = one_line(hlo_audit("check", "--format", "json", cwd=project, stdout=full))
    assert line == "hlo-audit: error: standard output: cannot write: No space left on device"
    assert hlo_audit("check", cwd=project).returncode == 0  # the same check, streams writable: it passes


# --------------------------------------------------------------------------------------------------------------
# The working directory
# --------------------------------------------------------------------------------------------------------------


def in_deleted_folder(tmp_path: Path, *args) -> subprocess.CompletedProcess:
    """``hlo-audit ARGS`` run from a folder deleted before it starts (a shell left in a removed checkout)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    run_env = {**os.environ, "PYTHONPATH": str(REPO)}
    run_env.pop("GITHUB_STEP_SUMMARY", None)
    return subprocess.run(["bash", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "-", str(gone), str(CLI),
                           *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env,
                          timeout=300, check=False)


@pytest.mark.parametrize("args, needed", [
    (("list",), "finding the config (hlo-audit.toml, pyproject.toml) needs it"),
    (("list", "--config", "hlo-audit.toml"), "--config hlo-audit.toml needs it"),
    (("init", "--callable", "hlo_audit.examples.nnx_mlp:lower", "--model", "mlp"), "init (it writes there) needs it"),
])
def test_a_deleted_working_directory_is_one_line_where_it_is_needed(tmp_path, args, needed):
    """Before issue 34, a FileNotFoundError traceback from os.getcwd()."""
    line = one_line(in_deleted_folder(tmp_path, *args))
    assert line.startswith("hlo-audit: error: the working directory no longer exists (deleted or moved away); "
                           f"{needed}: cd to an existing folder, or give paths as absolute ones"), line


def test_a_command_that_needs_no_working_directory_runs_without_one(project, tmp_path, small):
    config = project / "hlo-audit.toml"
    listed = in_deleted_folder(tmp_path, "list", "--config", config, "--format", "json")
    assert listed.returncode == 0 and len(json.loads(listed.stdout)["cells"]) == 1, listed.stderr[-2000:]
    checked = in_deleted_folder(tmp_path, "check", "--config", config)
    assert checked.returncode == 0 and "check passed" in checked.stdout, checked.stderr[-2000:]
    assert in_deleted_folder(tmp_path, "count", small).returncode == 0
    # An absolute report path needs none (it is held to its own folder: files.report_folder).
    reported = in_deleted_folder(tmp_path, "check", "--config", config, "--junit", tmp_path / "out.xml")
    assert reported.returncode == 0 and (tmp_path / "out.xml").is_file(), reported.stderr[-2000:]
    # A report path relative to it needs it: one line, before any cell runs.
    line = one_line(in_deleted_folder(tmp_path, "check", "--config", config, "--junit", "out.xml"))
    assert "--junit out.xml needs it" in line, line


# --------------------------------------------------------------------------------------------------------------
# The environment jax and XLA start in
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,value,said", [
    ("JAX_ENABLE_X64", "maybe", "invalid truth value 'maybe' for environment 'JAX_ENABLE_X64'"),
    ("JAX_DEBUG_NANS", "2", "invalid truth value '2' for environment 'JAX_DEBUG_NANS'"),
    ("JAX_NUM_CPU_DEVICES", "abc", 'Invalid value "abc" for JAX flag jax_num_cpu_devices'),
])
def test_a_jax_variable_jax_refuses_is_one_line_and_exit_2(project, name, value, said):
    line = one_line(hlo_audit("check", cwd=project, env={name: value}))
    assert line.startswith("hlo-audit: error: jax cannot start with this environment (") and said in line, line
    assert f"{name}={value}" in line


def test_xla_flags_xla_refuses_are_one_line_and_exit_2_before_any_cell(project):
    line = one_line(hlo_audit("run", "--no-cache", "--jobs", "2", cwd=project, env={"XLA_FLAGS": "--bogus_flag"}))
    assert line == ("hlo-audit: error: XLA_FLAGS='--bogus_flag': XLA refuses it: Unknown flag in XLA_FLAGS: "
                    "--bogus_flag")


# --------------------------------------------------------------------------------------------------------------
# Usage
# --------------------------------------------------------------------------------------------------------------


USAGE_ERRORS = [
    (("run", "--jobs", "0"), "hlo-audit: error: run: Invalid value for '--jobs' / '-j': "),
    (("count", "--top", "abc", "x.hlo"), "hlo-audit: error: count: Invalid value for '--top': "),
    (("check", "--bogus"), "hlo-audit: error: check: No such option: --bogus"),
    (("golden", "update", "--prun"), "hlo-audit: error: golden update: No such option: --prun"),
    (("nosuchcommand",), "hlo-audit: error: No such command 'nosuchcommand'."),
]


@pytest.mark.parametrize("args,said", USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_a_usage_error_is_one_line_and_exit_2(args, said):
    result = CliRunner().invoke(app, list(args))
    lines = result.stderr.splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and result.stdout == "", result.output
    assert lines[0].startswith(said) and lines[0].endswith("--help)"), lines[0]


def test_a_usage_error_through_the_shell(tmp_path):
    assert one_line(hlo_audit("run", "--jobs", "0", cwd=tmp_path)).startswith(USAGE_ERRORS[0][1])


# --------------------------------------------------------------------------------------------------------------
# The job summary: a warning and the verdict's exit code, never a hang
# --------------------------------------------------------------------------------------------------------------


def test_a_job_summary_that_cannot_be_written_is_a_warning_and_never_a_hang(project, passing_report, tmp_path):
    shard = tmp_path / "shard.json"
    shard.write_text(passing_report)
    fifo = tmp_path / "summary.fifo"
    os.mkfifo(fifo)
    for summary, why in ((fifo, "a pipe nobody reads"), (Path("/dev/zero"), "not a regular file or a pipe")):
        result = hlo_audit("merge", shard, cwd=project, env={"GITHUB_STEP_SUMMARY": str(summary)}, timeout=60)
        assert one_line(result, code=0) == (f"hlo-audit: warning: GITHUB_STEP_SUMMARY={summary}: {why}; the job "
                                            "summary was not written")
        assert result.stdout.splitlines()[-1].startswith("hlo-audit check passed: 1 cell:")
