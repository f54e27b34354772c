"""A cell that fails names where: the file that needed what was missing, not Python's import machinery."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from hlo_audit.cache import Cache
from hlo_audit.matrix import Cell
from hlo_audit.run import run_cells

TARGET = """
import importlib.util


def lower(cell):
    # As MaxText's gcloud_stub does for its optional cloud packages: find_spec, then a bare import.
    if importlib.util.find_spec("no_such_cloud_package.engine") is None:
        raise ModuleNotFoundError("no_such_cloud_package.engine")
"""


def test_a_missing_module_names_the_file_that_needs_it(tmp_path, monkeypatch):
    (tmp_path / "needy.py").write_text(textwrap.dedent(TARGET))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the project's root: its files are named from there
    (result,) = run_cells([Cell("m", False, "none", 2, target="needy:lower")], Cache(tmp_path, enabled=False))
    assert result.status == "error"
    # The innermost frame of the failure is importlib's find_spec (<frozen importlib.util>): the target's line is
    # what the user can act on.
    assert result.message == "ModuleNotFoundError: No module named 'no_such_cloud_package' (needy.py:7)"


@pytest.mark.maxtext  # needs MaxText (make compat's environment has none)
@pytest.mark.long  # make test's 15 minutes: a fresh process importing MaxText
def test_maxtext_runs_decoupled_from_its_optional_cloud_packages():
    """MaxText from its GitHub tree raises for a missing JetStream unless DECOUPLE_GCLOUD=TRUE (the released 0.2.5
    falls back to stubs): the MaxText target decouples before MaxText loads; an explicit value wins."""
    code = ("import os; from hlo_audit.targets import maxtext_config; maxtext_config.load_maxtext(); "
            "print(os.environ['DECOUPLE_GCLOUD'])")
    env = {k: v for k, v in os.environ.items() if k != "DECOUPLE_GCLOUD"}
    for given, expected in ((None, "TRUE"), ("FALSE", "FALSE")):
        run_env = env if given is None else {**env, "DECOUPLE_GCLOUD": given}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=run_env,
                                timeout=300)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split()[-1] == expected


MISMATCHED = """
import jax
import jax.numpy as jnp


def step(w, x):
    return jnp.dot(x, w).sum()  # (2, 5) @ (3, 4): contracting 5 with 3


def lower(cell):
    return jax.jit(step).trace(jnp.zeros((3, 4)), jnp.zeros((2, 5)))
"""


def test_a_failed_lowering_names_the_users_line_first_then_jax_s(tmp_path, monkeypatch):
    """jax raises a shape error deep inside its own numpy (jax/_src/numpy/...): the line a user can act on is their
    own call, named first; jax's frame follows it."""
    (tmp_path / "shape_mismatch").mkdir()
    (tmp_path / "shape_mismatch" / "step.py").write_text(textwrap.dedent(MISMATCHED))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the project's root: its files are named from there
    cell = Cell("m", False, "none", 2, target="shape_mismatch.step:lower")
    (result,) = run_cells([cell], Cache(tmp_path, enabled=False))
    assert result.status == "error"
    head, _, where = result.message.rpartition(" (")
    assert head.startswith("TypeError: dot_general requires contracting dimensions to have the same shape"), head
    user, _, raised = where.rstrip(")").partition(", raised in ")
    assert user == "shape_mismatch/step.py:7", result.message
    assert raised.startswith("jax/_src/") and raised.rpartition(":")[2].isdigit(), result.message
