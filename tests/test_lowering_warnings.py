"""What a lowering warns is the cell's, summarized once per run (issue 34, item 6), and a warning jax gives for what
the user chose is said only when asked (issue 40, item 6).

jax warns "Some donated buffers were not usable" on every lowering of a step that donates a buffer no output can
reuse: before, one warning per cell on stderr, in the middle of the run's lines. Now each cell's result carries
its warnings (kept in the cache with it, brought back from worker processes), nothing is printed as it happens,
and the report says once which warnings came from how many cells. That donation is the user's choice: its line
("2 cells warned while lowering: Some donated buffers were not usable (2)") was on every run of a step that
donates; it is now under `check --verbose` only. Any other warning is said on every run. A step that donates
nothing it cannot alias warns nothing and the report says nothing of warnings.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from hlo_audit.cache import Cache
from hlo_audit.matrix import Cell
from hlo_audit.results import CellResult
from hlo_audit.run import run_cells
from in_process import hlo_audit_here
from projects import project

DONATED = "Some donated buffers were not usable"

# A step that donates its batch too: no output has the batch's shape, so jax cannot alias it and warns.
STEP = """import jax
import jax.numpy as jnp


def lower(cell):
    def step(w, x):
        for _ in range(cell.layers):
            x = jnp.tanh(x @ w)
        return w - 0.1 * x.sum() * w
    donate = (0, 1) if cell.quant == "donates_batch" else (0,)
    return jax.jit(step, donate_argnums=donate).trace(jnp.ones((8, 8)), jnp.ones((3, 8)))
"""


@pytest.fixture
def donating(tmp_path, monkeypatch) -> Path:
    folder = project(tmp_path / "repo", {"donating_step.py": STEP}, target="donating_step:lower",
                     models=["w"], scan=["off"], quant=["donates_batch", "donates_weights"], layers=[2, 3])
    monkeypatch.syspath_prepend(str(folder))
    return folder


def test_a_chosen_warning_is_said_once_under_verbose_and_never_as_it_happens(donating):
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        made = hlo_audit_here(donating, "golden", "update")
        checked = hlo_audit_here(donating, "check")  # from the cache: the warnings are the cached results' too
        report = hlo_audit_here(donating, "check", "--format", "markdown")
        verbose = hlo_audit_here(donating, "check", "--verbose")
    ran = (made, checked, report, verbose)
    assert all(r.returncode == 0 for r in ran), made.stderr + checked.stderr
    assert not [w for w in escaped if DONATED in str(w.message)], [str(w.message) for w in escaped]
    for quiet in (made, checked, report):
        assert DONATED not in quiet.stdout + quiet.stderr and "warned while lowering" not in quiet.stdout
    assert verbose.stdout.count(f"2 cells warned while lowering: {DONATED} (2)") == 1, verbose.stdout
    assert DONATED not in verbose.stderr


OWN_WARNING = """import warnings

from donating_step import lower as donating


def lower(cell):
    if cell.layers == 2:
        warnings.warn("the step's own warning: read me")
    return donating(cell)
"""


def test_a_warning_the_user_did_not_choose_is_said_on_every_run(donating):
    """One cell of four warns something of its own: that is said on every run (the donation only with --verbose)."""
    (donating / "own_warning.py").write_text(OWN_WARNING)
    config = donating / "hlo-audit.toml"
    config.write_text(config.read_text().replace('"donating_step:lower"', '"own_warning:lower"'))
    made = hlo_audit_here(donating, "golden", "update")
    assert made.returncode == 0, made.stderr
    own = "the step's own warning"
    for ran in (made, hlo_audit_here(donating, "check")):
        assert ran.stdout.count(f"2 cells warned while lowering: {own} (2)") == 1, ran.stdout
        assert DONATED not in ran.stdout
    verbose = hlo_audit_here(donating, "check", "--verbose").stdout
    assert f"3 cells warned while lowering: {DONATED} (2); {own} (2)" in verbose, verbose


def test_each_cell_carries_its_own_warnings(donating, tmp_path):
    cells = [Cell("w", False, q, 2, target="donating_step:lower") for q in ("donates_batch", "donates_weights")]
    batch, weights = run_cells(cells, Cache(tmp_path, enabled=False))  # each cell in a process of its own
    assert batch.ok and weights.ok
    assert batch.warnings == (DONATED,) and weights.warnings == ()
    assert CellResult.from_record(batch.to_record()).warnings == (DONATED,)  # kept in the results cache


def test_warnings_come_back_from_worker_processes(donating):
    ran = hlo_audit_here(donating, "check", "--no-cache", "--jobs", "2", "--verbose")
    assert ran.returncode == 1, ran.stderr  # no goldens yet
    assert f"2 cells warned while lowering: {DONATED} (2)" in ran.stdout, ran.stdout
    assert DONATED not in ran.stderr


def test_a_step_that_warns_nothing_says_nothing_of_warnings(tmp_path, monkeypatch):
    folder = project(tmp_path / "quiet", {"donating_step.py": STEP}, target="donating_step:lower",
                     models=["w"], scan=["off"], quant=["donates_weights"], layers=[2])
    monkeypatch.syspath_prepend(str(folder))
    made = hlo_audit_here(folder, "golden", "update")
    assert made.returncode == 0, made.stderr
    assert "warned while lowering" not in made.stdout + made.stderr
