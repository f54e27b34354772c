"""`init` survives cells the target refuses (issue 40 item 3): `init --maxtext --model gemma4-26b --model gemma4-e2b`
exited 1 on gemma4-e2b scan-on with one 25,586-character line (MaxText's whole config dict). A refused cell is
written as an [[exclude]] of the config with the target's reason on one line (a long one cut, the whole text kept
under the cache), the other goldens are made, exit 0 with a note; `init --exclude` leaves cells out outright.

A callable target of the test's own that refuses as MaxText does (its model's configuration rejecting scan on for
one model: ``CellConfigError`` with a 25,000-character message) and as a user's function does (``Unavailable`` for
one depth of another model).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from in_process import hlo_audit_here

TARGET = '''
import jax
import jax.numpy as jnp

from hlo_audit import Unavailable
from hlo_audit.lowering import CellConfigError

CONFIG_DICT = "{" + ", ".join(f"'key_{i}': {i}" for i in range(2000)) + "}"


def lower(cell):
    if cell.model == "e2b" and cell.scan:
        raise CellConfigError("scan_layers=True is not supported for gemma4-e2b; config: " + CONFIG_DICT)
    if cell.model == "wide" and cell.layers == 4:
        raise Unavailable("wide at 4 layers needs more memory than this host has")

    def step(x):
        for _ in range(cell.layers):
            x = jnp.sin(x) * 2.0
        return x

    return jax.jit(step).trace(jnp.ones((8,), jnp.float32))


lower.scan = ("on", "off")
'''


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "refusing_target.py").write_text(TARGET)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def init(repo: Path, *extra: str):
    return hlo_audit_here(repo, "init", "--callable", "refusing_target:lower", "--model", "e2b", "--model", "wide",
                          "--layers", "2,4", *extra)


def test_init_excludes_the_refused_cells_with_their_reason_and_makes_the_other_goldens(repo):
    made = init(repo)
    assert made.returncode == 0, made.stdout + made.stderr[-3000:]
    text = (repo / "hlo-audit.toml").read_text()
    config = tomllib.loads(text)
    # e2b scan on refused at both depths: the series whole; wide refused at L4 only: that depth.
    assert config["exclude"] == [{"model": "e2b", "scan": "on", "quant": "none"},
                                 {"model": "wide", "scan": "off", "quant": "none", "layers": 4},
                                 {"model": "wide", "scan": "on", "quant": "none", "layers": 4}], text
    # Each reason on one line of the config, a long one cut with a pointer to the whole text.
    assert max(len(line) for line in text.splitlines()) < 400
    (cut,) = [line for line in text.splitlines() if "scan_layers=True is not supported for gemma4-e2b" in line]
    assert cut.startswith("# refused by the model's configuration: ") and "characters; the whole reason: " in cut
    kept = repo / cut.rsplit("the whole reason: ", 1)[1].rstrip(")")
    assert kept.is_relative_to(repo / ".hlo-audit-cache") and "'key_1999': 1999" in kept.read_text()
    assert "# unavailable: wide at 4 layers needs more memory than this host has" in text
    # The other cells' goldens, and nothing of the refused ones.
    goldens = sorted(str(p.relative_to(repo / "golden")) for p in (repo / "golden").rglob("*.json"))
    assert goldens == ["e2b/scan-off/none/L2.json", "e2b/scan-off/none/L4.json", "wide/scan-off/none/L2.json",
                       "wide/scan-on/none/L2.json"], goldens
    notes = [line for line in made.stdout.splitlines() if line.startswith("note: excluded ")]
    assert len(notes) == 3 and all(len(line) < 500 for line in notes), notes
    assert "note: excluded 2 cells (e2b/scan-on/none/L2, e2b/scan-on/none/L4) in hlo-audit.toml" in made.stdout
    assert max(len(line) for line in made.stdout.splitlines() + made.stderr.splitlines()) < 600
    # What init wrote gates: check passes on it.
    checked = hlo_audit_here(repo, "check")
    assert checked.returncode == 0, checked.stdout[-2000:]


def test_init_exclude_leaves_cells_out_outright(repo):
    made = init(repo, "--exclude", "model=e2b,scan=on", "--exclude", "model=wide,layers=4")
    assert made.returncode == 0, made.stdout + made.stderr[-3000:]
    text = (repo / "hlo-audit.toml").read_text()
    assert tomllib.loads(text)["exclude"] == [{"model": "e2b", "scan": "on"}, {"model": "wide", "layers": 4}]
    assert "# named by init --exclude" in text and "note: excluded" not in made.stdout  # nothing was refused
    assert len(list((repo / "golden").rglob("*.json"))) == 4


@pytest.mark.parametrize("value,said", [("model", "expects KEY=VALUE"), ("colour=red", "unknown key 'colour'"),
                                        ("layers=many", "exclude[0].layers")])
def test_init_exclude_refuses_a_bad_rule_in_one_line_and_writes_nothing(repo, value, said):
    made = init(repo, "--exclude", value)
    assert made.returncode == 2 and said in made.stderr and len(made.stderr.strip().splitlines()) == 1, made.stderr
    assert sorted(p.name for p in repo.iterdir()) == ["refusing_target.py"]


def test_init_where_every_cell_is_refused_fails_naming_each_reason(repo):
    """Issue 48: with every cell refused, init wrote no golden and exited 0, and the next `check` said "passed: 1
    unavailable". Nothing to gate is init's failure: exit 1, each cell's reason said, the last line saying why."""
    ran = hlo_audit_here(repo, "init", "--callable", "refusing_target:lower", "--model", "wide", "--layers", "4")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    skipped = [line for line in lines if line.startswith("skipped ")]
    assert skipped == [f"skipped wide/scan-{scan}/none/L4: unavailable: wide at 4 layers needs more memory than this "
                       "host has" for scan in ("off", "on")], lines
    assert lines[-1].startswith("init: the target refused every cell (2, each reason above): no golden was made"), lines
    assert not any(line.startswith("next: hlo-audit check (it passes now)") for line in lines)
    assert not (repo / "golden").exists()
