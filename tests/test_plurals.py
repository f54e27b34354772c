"""Counts are said in the right number: "1 cell", "1 leaf", "1 round of 1 call" (issue 40, item 6; before: "1 cells",
"1 leaves", "1 rounds of 1 calls", "1 of 1 cells have"), on a one-cell project run through the CLI."""

from __future__ import annotations

import re
import textwrap

from in_process import hlo_audit_here
from projects import project

ONE_LEAF = """
import jax
import jax.numpy as jnp


def lower(cell):
    return jax.jit(lambda x: x * 2).trace(jnp.zeros((4,)))
"""

# A number followed by a plural count word where the number is 1: what must never be printed.
ONE_PLURAL = re.compile(r"(?<![\d.,+-])1 (cells|leaves|rounds|calls|lines|params|parameters|streams|RNG streams)\b")


def test_one_of_each_is_said_in_the_singular(tmp_path):
    folder = project(tmp_path, {"one_leaf.py": textwrap.dedent(ONE_LEAF)}, target="one_leaf:lower", models=["m"],
                     scan=["off"])
    listed = hlo_audit_here(folder, "list")
    made = hlo_audit_here(folder, "golden", "update")
    checked = hlo_audit_here(folder, "check")
    ran = hlo_audit_here(folder, "run")
    measured = hlo_audit_here(folder, "measure", "--rounds", "1", "--calls", "1", "--host-calls", "1")
    for result in (listed, made, checked, ran, measured):
        assert result.returncode == 0, result.stderr
        assert not ONE_PLURAL.search(result.stdout + result.stderr), result.stdout + result.stderr
    assert listed.stdout.rstrip().endswith("1 cell")
    assert checked.stdout.rstrip().endswith("hlo-audit check passed: 1 cell: 1 ok; no findings")
    assert "1 cell: 1 ok, 0 unavailable, 0 error" in ran.stdout
    assert "measured on cpu: cpu: 1 round of 1 call" in measured.stdout
    assert "per call (1 leaf)" in measured.stderr
    assert ("1 of 1 cell has no host figure beside its golden, so the host_cost rule compares its leaves, not its "
            "time") in \
        " ".join(measured.stdout.split())
