"""A user's mistake is one line on stderr and exit 2, naming what and where, never a traceback (issue 37, item 8).

Before: a syntax error or an exception at import in a callable target was a 74-line traceback and exit 1 from
`check`, `list` and `init`; `measure` on a host without the asked device 87 lines; `--save-compiled` into a file a
traceback; `--rounds`, `--calls`, `--host-calls` without a maximum (a typo ran until killed); `--baseline abc` a
ValueError. A few cases run the console script in a subprocess (what a shell sees, with no runner to catch an
exception); the rest run the CLI in this process, where an escaping exception fails the test (``in_process``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hlo_audit import host
from in_process import hlo_audit_here
from projects import project

REPO = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).with_name("hlo-audit")

SYNTAX_ERROR = """
import jax


def lower(cell)
    return None
"""

RAISES_AT_IMPORT = """
import jax

SETTINGS = {"width": 16}
DEPTH = SETTINGS["depth"]


def lower(cell):
    return None
"""

# jax itself raises, called from the module's own line: the user's line first, then where it was raised.
JAX_RAISES_AT_IMPORT = """
import jax.numpy as jnp

TABLE = jnp.zeros((4, 4)) @ jnp.zeros((3, 4))


def lower(cell):
    return None
"""

IMPORTS_WHAT_IS_MISSING = """
import jax
import no_such_package_anywhere


def lower(cell):
    return None
"""

GOOD = """
import jax
import jax.numpy as jnp


def step(x):
    return x * 2


def lower(cell):
    return jax.jit(step).trace(jnp.zeros((4,)))
"""


@pytest.fixture(autouse=True)
def no_heartbeat(monkeypatch):
    """A slow host (CI's two cores under load) may take the preflight's child processes past the 30 s heartbeat; its
    progress line is not what these tests are about: they want the error's one line alone."""
    monkeypatch.setenv("HLO_AUDIT_HEARTBEAT", "3600")


def shell(cwd: Path, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    """The console script, as a shell runs it."""
    run_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    run_env.pop("GITHUB_STEP_SUMMARY", None)
    return subprocess.run([str(CLI), *map(str, args)], cwd=cwd, capture_output=True, text=True, env=run_env,
                          timeout=300, check=False)


def one_line(ran) -> str:
    """The one line on stderr, exit 2, no traceback."""
    lines = ran.stderr.splitlines()
    assert ran.returncode == 2, (ran.returncode, ran.stderr[-3000:])
    assert len(lines) == 1 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    return lines[0]


def target_project(folder: Path, module: str, source: str) -> Path:
    """A project whose callable target is ``module:lower``, written from ``source`` (a module name of its own per
    test: a module imported in this process stays imported)."""
    return project(folder, {f"{module}.py": textwrap.dedent(source)}, target=f"{module}:lower", models=["m"],
                   scan=["off"])


# --------------------------------------------------------------------------------------------------------------
# The target's module fails at import
# --------------------------------------------------------------------------------------------------------------


def test_a_syntax_error_in_the_target_is_its_file_and_line_through_the_shell(tmp_path):
    folder = target_project(tmp_path, "model_with_typo", SYNTAX_ERROR)
    for command in ("list", "check"):
        line = one_line(shell(folder, command))
        assert line == ("hlo-audit: error: hlo-audit.toml: target: target 'model_with_typo:lower': importing "
                        "'model_with_typo' failed: SyntaxError: expected ':' (model_with_typo.py:5)"), line


def test_init_names_the_syntax_error_and_writes_nothing(tmp_path):
    (tmp_path / "typo_init.py").write_text(textwrap.dedent(SYNTAX_ERROR))
    line = one_line(shell(tmp_path, "init", "--callable", "typo_init:lower", "--model", "m"))
    assert line.endswith("importing 'typo_init' failed: SyntaxError: expected ':' (typo_init.py:5)"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["typo_init.py"]


@pytest.mark.parametrize("command", [
    ("list",), ("run",), ("check",), ("golden", "update"), ("lower", "m/scan-off/none/L2"), ("measure",),
    ("rng", "m/scan-off/none/L2"), ("explain", "m/scan-off/none/L2"), ("report",), ("scaling",),
])
def test_an_exception_at_import_names_the_users_frame_in_every_command(tmp_path, command):
    module = "raises_" + "_".join(command).replace("/", "_").replace("-", "_")
    folder = target_project(tmp_path, module, RAISES_AT_IMPORT)
    line = one_line(hlo_audit_here(folder, *command))
    assert line.endswith(f"importing {module!r} failed: KeyError: 'depth' ({module}.py:5)"), line
    assert not (folder / "golden").exists() and not (folder / ".hlo-audit-cache").exists()


def test_an_exception_jax_raises_at_import_names_the_users_line_first(tmp_path):
    folder = target_project(tmp_path, "jax_raises_at_import", JAX_RAISES_AT_IMPORT)
    line = one_line(hlo_audit_here(folder, "list"))
    head, _, where = line.partition(" failed: TypeError: ")
    user, _, raised = where.rpartition(" (")[2].rstrip(")").partition(", raised in ")
    assert user == "jax_raises_at_import.py:4", line
    assert raised.startswith("jax/_src/"), line


def test_a_module_the_target_imports_missing_names_the_importing_line(tmp_path):
    folder = target_project(tmp_path, "needs_missing", IMPORTS_WHAT_IS_MISSING)
    line = one_line(hlo_audit_here(folder, "check"))
    assert line.endswith("importing 'needs_missing' failed: ModuleNotFoundError: No module named "
                         "'no_such_package_anywhere' (needs_missing.py:3)"), line
    # The target's own module missing is said as before: nothing of it to point at.
    (folder / "needs_missing.py").unlink()
    line = one_line(hlo_audit_here(folder, "check"))
    assert line.endswith("cannot import 'needs_missing': No module named 'needs_missing'"), line


HOSTILE_MODULES = [
    ("exits_at_import", "import sys\nsys.exit(3)\n", "SystemExit: 3 (exits_at_import.py:2)"),
    ("null_byte", "x = 1\x00\n", "SyntaxError: source code string cannot contain null bytes (null_byte.py)"),
    ("not_utf8", 'x = "\udcff"\n', "SyntaxError: (unicode error) 'utf-8' codec can't decode byte 0xff in "
                                   "position 0: invalid start byte (not_utf8.py:1)"),
    ("str_raises", "class Odd(Exception):\n    def __str__(self):\n        raise ValueError('no')\n\n\nraise Odd()\n",
     "Odd: Odd (str_raises.py:6)"),
    ("says_lines", "raise ValueError('one\\ntwo\\x1b[31m')\n", "ValueError: one two\\x1b[31m (says_lines.py:1)"),
    ("recurses", "def f(n):\n    return f(n + 1)\n\n\nf(0)\n", "RecursionError: maximum recursion depth exceeded "
                                                             "(recurses.py:2)"),
]


@pytest.mark.parametrize("module,source,said", HOSTILE_MODULES, ids=[m for m, _, _ in HOSTILE_MODULES])
def test_a_module_failing_at_import_in_any_way_is_one_line(tmp_path, module, source, said):
    (tmp_path / f"{module}.py").write_bytes(source.encode("utf-8", "surrogateescape"))
    (tmp_path / "hlo-audit.toml").write_text(f'target = "{module}:lower"\nmodels = ["m"]\n')
    line = one_line(hlo_audit_here(tmp_path, "list"))
    assert line.endswith(f"importing {module!r} failed: {said}"), line


# --------------------------------------------------------------------------------------------------------------
# measure
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(host._has_accelerator_device(), reason="the host has an accelerator: it may start the backend")
def test_measure_on_a_host_without_the_asked_device_is_one_line(tmp_path):
    folder = target_project(tmp_path, "good_step", GOOD)
    line = one_line(shell(folder, "measure", env={"JAX_PLATFORMS": "tpu"}))
    assert line.startswith("hlo-audit: error: measure: JAX_PLATFORMS=tpu asks for tpu, which this host cannot "
                           "start ("), line
    assert line.endswith("; this host has cpu (1 x cpu)"), line


@pytest.mark.skipif(host._has_accelerator_device(), reason="the host has an accelerator: it may start the backend")
def test_a_backend_the_host_cannot_start_is_one_line_before_any_cell_lowers(tmp_path):
    """`check` and `run` lowered every cell into the same failure (exit 1, "a failing cell"): now one line, exit 2,
    asked of a child process before any cell lowers, with workers or without."""
    folder = target_project(tmp_path, "good_platforms", GOOD)
    for ran in (shell(folder, "run", "--jobs", "2", env={"JAX_PLATFORMS": "bogus"}),
                hlo_audit_here(folder, "check", env={"JAX_PLATFORMS": "bogus"})):
        line = one_line(ran)
        assert line.startswith("hlo-audit: error: JAX_PLATFORMS=bogus asks for bogus, which this host cannot start "
                               "(Backend 'bogus' is not in the list of known backends"), line
        assert line.endswith("; this host has cpu (1 x cpu)"), line


# Each bound as typer words it: the pinned typer (0.29) in pydantic's words, the oldest it supports (0.15, make
# compat) in click's range.
@pytest.mark.parametrize("option,value,said", [
    ("--rounds", "1e23", ("Input should be a valid integer", "is not a valid integer")),
    ("--rounds", "100000000000000000000000", ("less than or equal to 100", "1<=x<=100.")),
    ("--rounds", "0", ("greater than or equal to 1", "1<=x<=100.")),
    ("--rounds", "-3", ("greater than or equal to 1", "1<=x<=100.")),
    ("--rounds", "1.5", ("Input should be a valid integer", "is not a valid integer")),
    ("--host-calls", "1e20", ("Input should be a valid integer", "is not a valid integer")),
    ("--host-calls", "100000000000000000000", ("less than or equal to 100000", "1<=x<=100000.")),
    ("--calls", "10001", ("less than or equal to 10000", "1<=x<=10000.")),
    ("--warmup", "-1", ("greater than or equal to 0", "0<=x<=1000.")),
    ("--warmup", "1001", ("less than or equal to 1000", "0<=x<=1000.")),
])
def test_measure_bounds_its_numeric_options(tmp_path, option, value, said):
    line = one_line(hlo_audit_here(tmp_path, "measure", option, value))
    assert line.startswith(f"hlo-audit: error: measure: Invalid value for '{option}': ") and any(
        words in line for words in said), line


def test_measure_save_compiled_where_no_folder_can_be_is_one_line_and_writes_nothing(tmp_path):
    folder = target_project(tmp_path, "good_save", GOOD)
    (folder / "afile").write_text("kept")
    for where, said in (("afile", "not a folder"), ("afile/below", "cannot write: Not a directory"),
                        ("", "expected a folder, got an empty path"), ("/dev/null", "not a folder")):
        line = one_line(hlo_audit_here(folder, "measure", "--rounds", "1", "--save-compiled", where))
        assert line.startswith("hlo-audit: error: --save-compiled") and line.endswith(said), line
    assert (folder / "afile").read_text() == "kept"
    assert sorted(p.name for p in folder.iterdir()) == ["afile", "good_save.py", "hlo-audit.toml"]


def test_measure_save_compiled_makes_its_folder_only_when_it_writes(tmp_path):
    folder = target_project(tmp_path, "good_saved", GOOD)
    ran = hlo_audit_here(folder, "measure", "--rounds", "1", "--calls", "1", "--save-compiled", "out/compiled")
    assert ran.returncode == 0, ran.stderr
    assert [p.name for p in (folder / "out" / "compiled").iterdir()] == ["m__scan-off__none__L2.hlo.txt"]


@pytest.mark.parametrize("args,said", [
    (("--across", "layers", "--baseline", "abc"), "--baseline abc: no selected cell has layers 'abc' (they have 2)"),
    (("--across", "scan", "--baseline", "maybe"), "--baseline maybe: no selected cell has scan 'maybe' (they have "
                                                  "off)"),
    (("--baseline", "a\x01b"), "--baseline a\\x01b: no selected cell has quant 'a\\x01b' (they have none)"),
])
def test_measure_baseline_no_cell_has_is_one_line(tmp_path, args, said):
    folder = target_project(tmp_path, "good_baseline", GOOD)
    assert one_line(hlo_audit_here(folder, "measure", *args)) == f"hlo-audit: error: {said}"


# --------------------------------------------------------------------------------------------------------------
# Other commands' options
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args,said", [
    (("count", "--top", "-1", "x.hlo"), "count: Invalid value for '--top': "),
    (("diff", "--max-lines", "-1", "a.hlo", "b.hlo"), "diff: Invalid value for '--max-lines': "),
    # A file ignores --module; a broken one was accepted for it, and refused only for a dump folder.
    (("count", "--module", "(", "x.hlo"), "--module '(': not a regular expression: missing ), unterminated"),
    # diff reads its inputs first (issue 41: one canonical side at a time), so a missing file is named before the
    # pattern; both are one line, exit 2.
    (("diff", "--module", "[", "a.hlo", "b.hlo"), "a.hlo: no such file"),
])
def test_options_that_can_mean_nothing_are_refused(tmp_path, args, said):
    line = one_line(hlo_audit_here(tmp_path, *args))
    assert line.startswith(f"hlo-audit: error: {said}"), line
