"""`hlo-audit measure` and the host_cost rule, on the CPU with real steps: the seeds' pair as a small NNX decoder
(``hlo_audit/examples/decoder.py``: leak = per layer 2 ``Dropout(0.0)`` and 7 forked one-stream ``Rngs`` called each
step; none = no RNG state), unrolled and scanned, through ``nnx.jit`` and ``jax.jit``.

Nothing here asserts a time: state leaves are exact, and what the rule decides follows from them; the times are only
checked to exist and to be the kind of number they are (positive, min <= median <= max).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from hlo_audit import ab_verdicts
from hlo_audit.commands import measure
from hlo_audit.golden.record import GoldenRecord, record_problem
from hlo_audit.hlo.text import parse_module
from hlo_audit.host_cost import HostFigure, Spread, host_cost
from hlo_audit.matrix import Cell
from hlo_audit.report import measure_words
from hlo_audit.rules.host_cost import host_cost_text
from hlo_audit.targets import get_target
from in_process import hlo_audit_here, in_project
from projects import config, project

DECODER = "hlo_audit.examples.decoder:lower"
QUICK = measure.Rounds(rounds=2, warmup=1, calls=2, host_calls=5)
# Per unrolled layer the leak carries 9 (key, count) streams: 18 state leaves the host flattens and dispatches.
LEAK_LEAVES_PER_LAYER = 18


def decoder_cell(model: str, scan: bool, quant: str, layers: int = 2) -> Cell:
    return Cell(model=model, scan=scan, quant=quant, layers=layers, target=DECODER, batch=2, seq=8)


def figure(leaves: int, median_us: float, machine: str = "m") -> HostFigure:
    return HostFigure("nnx.jit", leaves, Spread(median_us * 0.9, median_us, median_us * 1.1), machine)


def timed(golden: HostFigure | None, now: HostFigure | None, golden_params: int, now_params: int, tolerance: float,
          command: str):
    """The rule where both sides' leaves are their figures' (each lowering says the same count)."""
    return host_cost(golden.leaves if golden else None, now.leaves if now else None, golden_params, now_params,
                     tolerance, command, golden=golden, now=now)


# --------------------------------------------------------------------------------------------------------------
# The rule, as a pure function of two figures
# --------------------------------------------------------------------------------------------------------------


def test_host_cost_gates_on_state_leaves_and_words_the_time():
    # The chip's figures (issue 33): nnx.jit 33.4 -> 59.1 ms per call for +288 state leaves (each a parameter).
    found = timed(figure(443, 33_400), figure(731, 59_100), 443, 731, 0.0, "hlo-audit golden update --only id=x")
    assert found is not None and found.worse and found.leaves_delta == 288
    text = host_cost_text(found)
    assert text.startswith("host work per call +25.7 ms (+288 state leaves) through nnx.jit: 33.4 ms -> 59.1 ms")
    assert "another machine" not in text and text.endswith("If intended: hlo-audit golden update --only id=x")
    fewer = timed(figure(731, 59_100), figure(443, 33_400), 731, 443, 0.0, "cmd")
    assert fewer is not None and not fewer.worse and "record the smaller figure" in host_cost_text(fewer)


def test_host_cost_compares_nothing_without_a_measurement_or_within_tolerance():
    assert timed(figure(443, 33_400), None, 443, 731, 0.0, "cmd") is None  # a check that measured none
    # The leaves held: the time alone (noisy, machine-bound) never fails, even doubled.
    assert timed(figure(443, 33_400), figure(443, 70_000), 443, 443, 0.0, "cmd") is None
    assert timed(figure(443, 33_400), figure(450, 34_000), 443, 450, 0.02, "cmd") is None  # +7 within 2% of 443
    other = timed(figure(443, 33_400, "a workstation"), figure(731, 59_100, "a runner"), 443, 731, 0.0, "cmd")
    assert "measured on another machine (a workstation)" in host_cost_text(other)
    # Leaves the call passes beside its entry (arguments jax prunes), as many as the golden's figure says: held.
    assert timed(figure(50, 9_000), figure(50, 9_100), 40, 40, 0.0, "cmd") is None


def test_host_cost_takes_the_golden_s_leaves_as_far_as_its_lowering_bears_them_out():
    """Issue 48: a golden's host.leaves raised from 6 to 80 (inside the plausibility bound) beside 20 more leaves per
    call read as an improvement while the time rose. Its entry's 6 parameters are what its lowering implies: +20 is
    a regression, and the claim is named. Fewer leaves than a figure claims is an improvement only where the entry
    shrank: growth outside the entry is never one."""
    forged = timed(figure(80, 2_000), figure(26, 3_000), 6, 26, 0.0, "cmd")
    assert forged is not None and forged.worse and forged.leaves_delta == 20 and forged.implied == 6
    assert "the golden claims 80 leaves, its entry's 6 parameters and this step bear out 6" in \
        host_cost_text(forged)
    # The same claim where the 20 leaves are outside this step's entry too: nothing to record, no improvement.
    assert timed(figure(80, 2_000), figure(26, 3_000), 6, 6, 0.0, "cmd") is None
    # A real improvement: the entry shrank with the leaves.
    smaller = timed(figure(80, 2_000), figure(40, 1_500), 80, 40, 0.0, "cmd")
    assert smaller is not None and not smaller.worse and smaller.leaves_delta == -40


def test_host_cost_compares_nothing_where_the_golden_records_no_count():
    """A golden that records no count of its call's leaves (an older one, or one whose count was deleted) compares
    nothing here: the part it lacks is the missing_golden rule's finding (``golden.health.lacking``), never a count
    made up from its entry, which would miss the leaves jax prunes from it."""
    assert timed(None, figure(56, 5_000), 6, 6, 0.0, "cmd") is None
    assert host_cost(None, 56, 6, 6, 0.0, "cmd") is None


def test_host_cost_judges_the_lowerings_counts_without_any_figure():
    """The counts come from each side's lowering: no figure measured or recorded, 50 more leaves jax pruned from the
    entry still fail, worded without a time; a count the golden records beyond its entry holds where this step
    passes as many."""
    grown = host_cost(56, 106, 6, 6, 0.0, "hlo-audit golden update --only id=x")
    assert grown is not None and grown.worse and grown.leaves_delta == 50 and not grown.timed
    assert host_cost_text(grown) == (
        "host work per call: 56 -> 106 state leaves the call flattens (+50 state leaves) "
        "(`hlo-audit measure` times what each costs). If intended: hlo-audit golden update --only id=x")
    assert host_cost(56, 56, 6, 6, 0.0, "cmd") is None
    shrunk = host_cost(56, 30, 30, 20, 0.0, "cmd")
    assert shrunk is not None and not shrunk.worse and "record the smaller count" in host_cost_text(shrunk)


def test_golden_record_keeps_the_figure_and_reads_older_records():
    record = {"cell": "m/scan-off/none/L2", "entry_params": 3, "by_dtype": {"f32": 3}, "by_role": {"weight": 3},
              "groups": {"w": 3}, "environment": {"jax": "0.12"}}
    older = GoldenRecord.from_json(record)
    assert older.host is None and "host" not in older.to_json()
    with_figure = replace(older, host=figure(66, 18_000))
    assert GoldenRecord.from_json(with_figure.to_json()).host == with_figure.host
    assert record_problem(with_figure.to_json(), "m/scan-off/none/L2") is None
    assert record_problem({**record, "host": {"leaves": "66"}}, "m/scan-off/none/L2") == \
        "not a golden summary: 'host' is malformed"
    assert older.call_leaves is None and older.leaves_per_call is None and "call_leaves" not in older.to_json()
    assert with_figure.leaves_per_call == 66  # an older golden's figure says its leaves
    counted = replace(with_figure, call_leaves=70)
    assert GoldenRecord.from_json(counted.to_json()).call_leaves == 70 and counted.leaves_per_call == 70
    for forged in (-1, "70", True, 7.0):
        assert record_problem({**record, "call_leaves": forged}, "m/scan-off/none/L2") == \
            "not a golden summary: 'call_leaves' is malformed"


# --------------------------------------------------------------------------------------------------------------
# Real steps on the CPU
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model,caller", [("nnxjit", "nnx.jit"), ("jaxjit", "jax.jit")])
def test_host_figure_of_the_seeds_pair(model, caller):
    """Unrolled, the leak adds 18 state leaves per layer to what each call flattens and dispatches; scanned, 18 in
    all (the streams are stacked): the host figure's leaves, per cell, through the caller the user calls."""
    target = get_target(DECODER)
    leaves = {}
    for scan in (False, True):
        for quant in ("none", "leak"):
            step = measure.traced_step(target, decoder_cell(model, scan, quant))
            found = measure.host_figure(step, QUICK)
            assert found.caller == caller and found.leaves == step.leaves
            assert 0 < found.per_call_us.low <= found.per_call_us.median <= found.per_call_us.high
            leaves[scan, quant] = found.leaves
    assert leaves[False, "leak"] - leaves[False, "none"] == 2 * LEAK_LEAVES_PER_LAYER
    assert leaves[True, "leak"] - leaves[True, "none"] == LEAK_LEAVES_PER_LAYER
    assert leaves[False, "none"] == 66 and leaves[True, "none"] == 39  # params, adamw's moments, counts, tokens


def test_measure_times_the_pair_interleaved(tmp_path):
    """The step run at its shapes through nnx.jit (the modules rebuilt from the traced arguments) and through jax.jit
    (donated state chained from call to call): timings, memory, the compiled text, the A/B comparison."""
    saved = {}
    cells = [decoder_cell("nnxjit", False, "none"), decoder_cell("nnxjit", False, "leak"),
             decoder_cell("jaxjit", False, "none")]
    report = measure.measure_cells(cells, tmp_path / "golden", QUICK, save_text=saved.__setitem__)
    assert [row.problem for row in report.cells] == ["", "", ""]
    for row in report.cells:
        t = row.timing
        assert t is not None and t.leaves == row.host.leaves and t.argument_bytes > 0 and t.compile_s > 0
        assert 0 < t.blocked_ms.low <= t.blocked_ms.median <= t.blocked_ms.high
        assert t.caller == ("nnx.jit" if row.cell.startswith("nnxjit") else "jax.jit")
        assert parse_module(saved[row.cell], row.cell).entry.name
    (compared,) = report.comparisons  # the jax.jit cell is a group of one, with no recorded timing
    assert (compared.baseline, compared.cell) == (cells[0].id, cells[1].id)
    assert compared.leaves == (66, 102) and [m.metric for m in compared.changes] == list(ab_verdicts.METRICS)
    # Nothing recorded beside goldens: no figure for the rule to compare, and measuring judged nothing itself.
    assert measure.judgeable(report) == {} and report.outcome is None and report.findings == ()


# --------------------------------------------------------------------------------------------------------------
# The rule in check: a figure recorded beside the golden, then the leak
# --------------------------------------------------------------------------------------------------------------

STEP_MODULE = '''
import dataclasses, os
from hlo_audit.examples import decoder

def lower(cell):
    """The decoder's nnx.jit step; STEP_VARIANT picks the variant (the edit a pull request makes)."""
    return decoder.lower(dataclasses.replace(cell, quant=os.environ.get("STEP_VARIANT", "none")))

lower.quant = ("none",)
'''


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A project whose one cell's golden records its host figure (`golden update`, then `measure --record`)."""
    folder = project(tmp_path_factory.mktemp("host_cost"), {"step.py": STEP_MODULE},
                     target="step:lower", models=["nnxjit"], scan=["off"])
    assert hlo_audit_here(folder, "golden", "update").returncode == 0
    ran = hlo_audit_here(folder, "measure", "--host-only", "--record", "--host-calls", "5", "--rounds", "2",
                         "--format", "json")
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["recorded"] == ["nnxjit/scan-off/none/L2"] and out["cells"][0]["host"]["leaves"] == 66
    # The lowering counts the leaves the figure's call flattens: one number, whichever measured it.
    assert json.loads((folder / "golden/nnxjit/scan-off/none/L2.json").read_text())["call_leaves"] == 66
    return folder


def _check(folder: Path, variant: str) -> dict:
    ran = hlo_audit_here(folder, "check", "--format", "json", env={"STEP_VARIANT": variant})
    return {"code": ran.returncode, **json.loads(ran.stdout)}


def test_check_fails_the_leak_on_host_work_per_call(recorded):
    out = _check(recorded, "leak")
    (finding,) = [f for f in out["findings"] if f["rule"] == "host_cost"]
    assert out["code"] == 1 and finding["severity"] == "regression"
    assert finding["details"]["leaves_delta"] == 2 * LEAK_LEAVES_PER_LAYER
    assert finding["details"]["golden"]["leaves"] == 66 and finding["details"]["now"]["leaves"] == 102
    assert finding["message"].startswith("host work per call ")
    assert "(+36 state leaves) through nnx.jit" in finding["message"]


def test_check_passes_the_same_step_against_its_figure(recorded):
    out = _check(recorded, "none")
    assert out["code"] == 0 and not [f for f in out["findings"] if f["rule"] == "host_cost"]


# --------------------------------------------------------------------------------------------------------------
# The rule in measure: judged by the gate as check judges it, the config's policy and waivers included
# --------------------------------------------------------------------------------------------------------------

LEAK_WAIVER = {"rule": "host_cost", "model": "nnxjit", "reason": "the leak is measured on purpose"}


@pytest.mark.parametrize("settings, code, severity", [
    ({}, 1, "regression"),  # the default policy: host_cost fails
    ({"policy": {"host_cost": "warn"}}, 0, "advisory"),
    ({"waive": [LEAK_WAIVER]}, 0, "waived"),
    ({"policy": {"host_cost_tolerance": 0.6}}, 0, None),  # +36 leaves on 66: within 60%
    ({"policy": {"host_cost": "off"}}, 0, None),
], ids=["default", "warn", "waived", "tolerance", "off"])
def test_measure_judges_the_leak_under_the_configs_policy(recorded, tmp_path, settings, code, severity):
    """The step grew 36 state leaves per call against the figure recorded beside its golden: `measure` fails it as
    `check` does, and the config's [policy] (host_cost's action and tolerance) and waivers decide as they do for
    `check` (measure once judged by itself, and failed whatever the config said)."""
    folder = tmp_path / "project"
    shutil.copytree(recorded, folder)
    (folder / "hlo-audit.toml").write_text(config(target="step:lower", models=["nnxjit"], scan=["off"], **settings))
    ran = hlo_audit_here(folder, "measure", "--host-only", "--host-calls", "5", "--rounds", "2", "--format", "json",
                         env={"STEP_VARIANT": "leak"})
    assert ran.returncode == code, ran.stderr[-3000:]
    out = json.loads(ran.stdout)
    found = [f for f in out["findings"] if f["rule"] == "host_cost"]
    assert [f["severity"] for f in found] == ([severity] if severity else [])
    assert out["schema"] == "hlo-audit/measure/v2" and "host_cost" not in out  # each finding once (issue 49)
    if not found:
        return
    (finding,) = found
    assert finding["details"]["leaves_delta"] == 2 * LEAK_LEAVES_PER_LAYER
    assert finding["details"]["golden"]["leaves"] == 66 and finding["details"]["now"]["leaves"] == 102
    assert "(+36 state leaves) through nnx.jit" in finding["message"]
    assert finding["message"].split(". If intended: ")[1].startswith("hlo-audit golden update --only id=")
    if severity == "waived":
        assert finding["message"].endswith("[waived: the leak is measured on purpose]")
    # What check says of the same step, under the same config: the same finding.
    checked = _check(folder, "leak")
    (same,) = [f for f in checked["findings"] if f["rule"] == "host_cost"]
    assert (same["severity"], same["details"]["leaves_delta"]) == (severity, finding["details"]["leaves_delta"])
    table = hlo_audit_here(folder, "measure", "--host-only", "--host-calls", "5", "--rounds", "1",
                           env={"STEP_VARIANT": "leak"})
    assert f"nnxjit/scan-off/none/L2: {severity}: host work per call" in table.stdout.replace("\n", " ")


def _edited_host(recorded: Path, tmp_path: Path, edit) -> Path:
    """A copy of the recorded project with its golden's host figure edited by ``edit(record)``."""
    folder = tmp_path / "project"
    shutil.copytree(recorded, folder)
    summary = folder / "golden/nnxjit/scan-off/none/L2.json"
    record = json.loads(summary.read_text())
    edit(record)
    summary.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return folder


def _measured_host_cost(folder: Path) -> tuple[int, list[dict]]:
    ran = hlo_audit_here(folder, "measure", "--host-only", "--host-calls", "5", "--rounds", "2", "--format", "json",
                         env={"STEP_VARIANT": "leak"})
    assert ran.returncode in (0, 1), ran.stderr[-3000:]
    return ran.returncode, [f for f in json.loads(ran.stdout)["findings"] if f["rule"] == "host_cost"]


def test_a_golden_s_leaves_raised_do_not_hide_growth(recorded, tmp_path):
    """Issue 48: the golden's host.leaves raised from 66 to 200 (inside the plausibility bound, 4 per parameter +
    64) beside the leak's 36 more leaves per call: `measure` exited 0 and `check` called host_cost an improvement.
    Raised with the call's count beside it, the golden's 66 entry parameters are what its lowering implies: a
    regression in both, the claim named."""
    def raise_leaves(record):
        record["host"].update(leaves=200)
        record["call_leaves"] = 200

    folder = _edited_host(recorded, tmp_path, raise_leaves)
    code, found = _measured_host_cost(folder)
    assert code == 1 and [f["severity"] for f in found] == ["regression"], found
    assert found[0]["details"]["leaves_delta"] == 2 * LEAK_LEAVES_PER_LAYER
    assert found[0]["details"]["implied_leaves"] == 66 and found[0]["details"]["golden"]["leaves"] == 200
    assert "the golden claims 200 leaves, its entry's 66 parameters and this step bear out 66" in \
        found[0]["message"]
    checked = _check(folder, "leak")
    assert [f["severity"] for f in checked["findings"] if f["rule"] == "host_cost"] == ["regression"]


def test_a_golden_s_host_figure_deleted_is_compared_by_its_call_s_leaves(recorded, tmp_path):
    """Issue 48: the golden's host figure deleted (nothing else marks it: `--host-only` records no timing) beside
    36 more leaves per call: `measure` said the rule compares nothing, exit 0. The golden's call's leaves (its
    lowering's count) are compared, worded without the golden's time; the unchanged step against it: nothing."""
    folder = _edited_host(recorded, tmp_path, lambda record: record.pop("host"))
    code, found = _measured_host_cost(folder)
    assert code == 1 and [f["severity"] for f in found] == ["regression"], found
    assert found[0]["details"]["golden"] is None and found[0]["details"]["leaves_delta"] == 2 * LEAK_LEAVES_PER_LAYER
    assert found[0]["message"].startswith("host work per call: 66 -> 102 state leaves the call flattens "
                                          "(+36 state leaves, ")
    ran = hlo_audit_here(folder, "measure", "--host-only", "--host-calls", "5", "--rounds", "2")
    assert ran.returncode == 0 and "compares its leaves, not its time" in ran.stdout.replace("\n", " "), ran.stdout


PRUNED_STEP = '''
import os
import jax
import jax.numpy as jnp


def step(state, x):
    return state["w"] - 0.1 * jnp.mean(x @ state["w"])


def lower(cell):
    """A jax.jit step whose state carries leaves it never reads (UNUSED_LEAVES of them: the edit a pull request
    makes): jax prunes them from the entry, and the host still flattens and checks each one per call."""
    unused = [jax.ShapeDtypeStruct((4,), jnp.float32) for _ in range(int(os.environ.get("UNUSED_LEAVES", "6")))]
    state = {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32), "unused": unused}
    return jax.jit(step).trace(state, jax.ShapeDtypeStruct((2, 8), jnp.float32))
'''


def test_leaves_pruned_from_the_entry_grow_unseen_by_no_golden(tmp_path):
    """Issue 48: a golden whose whole host figure (figure and timing) is deleted, beside 50 more state leaves per
    call that jax prunes from the entry (so no count, text or entry rule sees them): "1 ok", exit 0. Every golden
    records its call's leaves from its lowering (format 3), so the rule needs no figure: a regression naming +50;
    the count deleted too is a part the golden lacks (missing_golden), never a pass."""
    folder = project(tmp_path / "pruned", {"pruned_step.py": PRUNED_STEP}, target="pruned_step:lower",
                     models=["pruned"], scan=["off"])
    assert hlo_audit_here(folder, "golden", "update").returncode == 0
    summary = folder / "golden/pruned/scan-off/none/L2.json"
    written = json.loads(summary.read_text())
    # w and x reach the entry; the six unused leaves are pruned from it, and the call still passes them.
    assert (written["entry_params"], written["call_leaves"], written["format"]) == (2, 8, 3)
    ran = hlo_audit_here(folder, "measure", "--host-only", "--record", "--host-calls", "5", "--rounds", "2",
                         "--format", "json")
    assert ran.returncode == 0 and json.loads(ran.stdout)["cells"][0]["host"]["leaves"] == 8, ran.stderr[-2000:]
    record = json.loads(summary.read_text())
    assert "host" in record
    for key in ("host", "measured"):
        record.pop(key, None)
    summary.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")

    def check(env):
        ran = hlo_audit_here(folder, "check", "--format", "json", env=env)
        return ran.returncode, [f for f in json.loads(ran.stdout)["findings"] if f["severity"] != "ok"]

    assert check({"UNUSED_LEAVES": "6"}) == (0, [])
    code, found = check({"UNUSED_LEAVES": "56"})
    assert code == 1 and [(f["rule"], f["severity"]) for f in found] == [("host_cost", "regression")], found
    assert found[0]["details"]["leaves_delta"] == 50 and found[0]["details"]["now_leaves"] == 58
    assert found[0]["message"].startswith("host work per call: 8 -> 58 state leaves the call flattens "
                                          "(+50 state leaves)")
    # The count deleted as well (or the format said to be an older one): the golden lacks what the rule compares.
    for forged in ({k: v for k, v in record.items() if k != "call_leaves"},
                   {**{k: v for k, v in record.items() if k != "call_leaves"}, "format": 2}):
        summary.write_text(json.dumps(forged, indent=1, sort_keys=True) + "\n")
        code, found = check({"UNUSED_LEAVES": "56"})
        assert code == 1 and [(f["rule"], f["details"]["lacks"]) for f in found] == [
            ("missing_golden", ["call_leaves"])], found
        assert "without its call's state leaves" in found[0]["message"]


def test_measure_markdown_escapes_a_hostile_waiver_reason(recorded, tmp_path):
    """Issue 48: `measure --format markdown` wrote its tables and findings as they were: a waiver's reason holding
    `<i>` (or a `|`, a new column) reached the Markdown raw. Read back with markdown-it, as GitHub renders it."""
    folder = tmp_path / "project"
    shutil.copytree(recorded, folder)
    reason = "<i>kept</i> | <!-- hidden"
    (folder / "hlo-audit.toml").write_text(config(target="step:lower", models=["nnxjit"], scan=["off"],
                                                  waive=[{**LEAK_WAIVER, "reason": reason}]))
    ran = hlo_audit_here(folder, "measure", "--host-only", "--host-calls", "5", "--rounds", "1", "--format",
                         "markdown", env={"STEP_VARIANT": "leak"})
    assert ran.returncode == 0, ran.stderr[-3000:]
    tokens = MarkdownIt("commonmark").enable("table").parse(ran.stdout)
    html = [t.content for t in tokens if t.type == "html_block"] + [
        c.content for t in tokens for c in (t.children or []) if c.type == "html_inline"]
    assert html == [], html
    items = ["".join(c.content for c in t.children) for t in tokens if t.type == "inline" and "waived" in t.content]
    assert len(items) == 1 and items[0].endswith(f"[waived: {reason}]"), items  # shown as the text it is
    header = next(t for t in tokens if t.type == "tr_open")
    assert [t.content for t in tokens[tokens.index(header):] if t.type == "inline"][0] == "cell"


def test_measure_says_a_golden_without_a_figure_compares_nothing(tmp_path, monkeypatch):
    folder = project(tmp_path, {"step.py": STEP_MODULE}, target="step:lower", models=["nnxjit"], scan=["off"])
    monkeypatch.syspath_prepend(str(folder))  # the target's module, as a project run from its folder imports it
    ran = in_project(folder, "measure", "--host-only", "--host-calls", "5", "--rounds", "2")
    assert ran.exit_code == 0
    assert "1 of 1 cell has no host figure beside its golden, so the host_cost rule compares nothing" in \
        ran.stdout.replace("\n", " ")


def test_measure_refuses_an_unknown_axis(tmp_path, monkeypatch):
    folder = project(tmp_path, {"step.py": STEP_MODULE}, target="step:lower", models=["nnxjit"], scan=["off"])
    monkeypatch.syspath_prepend(str(folder))  # the target's module, as a project run from its folder imports it
    ran = in_project(folder, "measure", "--across", "colour")
    assert ran.exit_code == 2 and "--across colour: expected one of quant" in ran.stderr


def test_golden_update_accepts_the_leak_and_its_figure(tmp_path):
    """Accepting the change (`golden update`, the command the finding prints) re-measures the recorded figure: its
    leaves follow the step, and the check passes again. Where the leaves held, the golden keeps the figure it had
    (no rewrite for a time that moved within its noise)."""
    folder = project(tmp_path, {"step.py": STEP_MODULE}, target="step:lower", models=["nnxjit"], scan=["off"])
    summary = folder / "golden" / "nnxjit" / "scan-off" / "none" / "L2.json"
    assert hlo_audit_here(folder, "golden", "update").returncode == 0
    assert hlo_audit_here(folder, "measure", "--host-only", "--record", "--host-calls", "5").returncode == 0
    recorded = json.loads(summary.read_text())["host"]
    assert hlo_audit_here(folder, "golden", "update").returncode == 0
    assert json.loads(summary.read_text())["host"] == recorded  # leaves held: the figure as recorded
    assert hlo_audit_here(folder, "golden", "update", env={"STEP_VARIANT": "leak"}).returncode == 0
    assert json.loads(summary.read_text())["host"]["leaves"] == 102
    out = _check(folder, "leak")
    assert out["code"] == 0 and not [f for f in out["findings"] if f["rule"] == "host_cost"]


# --------------------------------------------------------------------------------------------------------------
# A verdict needs an effect, not only ranges apart (issue 40, item 6)
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("a,b,verdict,said", [
    # Three rounds whose ranges miss each other by microseconds: +0.0% was "slower, beyond noise".
    ((40.496, 40.497, 40.499), (40.500, 40.501, 40.503), False, "+0.0% (under the 1% minimum effect)"),
    # The chip's queued time of the leak (docs/chip-2026-12-05, L8 nnxjit scan-on): +0.3%, ranges apart.
    ((40.609, 40.612, 40.626), (40.72, 40.722, 40.725), False, "+0.3% (under the 1% minimum effect)"),
    ((41.893, 41.974, 42.105), (42.074, 42.106, 42.155), False, "+0.3% (within noise)"),  # ranges overlap
    ((80.564, 80.797, 80.935), (81.432, 81.811, 81.851), True, "+1.3% (slower, beyond noise)"),
    ((18.381, 19.4, 19.689), (10.0, 10.5, 11.0), True, "-45.9% (faster, beyond noise)"),
    ((100.0, 100.0, 100.0), (101.0, 101.0, 101.0), True, "+1.0% (slower, beyond noise)"),  # the floor: a verdict
])
def test_a_verdict_needs_ranges_apart_and_a_minimum_effect(a, b, verdict, said):
    change = ab_verdicts.MetricChange("queued_ms", Spread(*a), Spread(*b))
    assert change.beyond_noise is verdict
    assert measure_words.measured_change(change) == said


def test_measure_record_writes_goldens_as_golden_update_does(tmp_path):
    """`measure --record` rewrote golden summaries with mode 600 (mkstemp's), unreadable to a CI user beside the
    owner (issue 37); it writes them as `golden update` does now: one swap of the golden store, the same mode."""
    folder = project(tmp_path, {"step.py": STEP_MODULE}, target="step:lower", models=["nnxjit"], scan=["off"])
    summary = folder / "golden" / "nnxjit" / "scan-off" / "none" / "L2.json"
    assert hlo_audit_here(folder, "golden", "update").returncode == 0
    mode = summary.stat().st_mode & 0o777
    ran = hlo_audit_here(folder, "measure", "--host-only", "--record", "--host-calls", "5", "--rounds", "1")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(summary.read_text())["host"]["leaves"] == 66
    assert summary.stat().st_mode & 0o777 == mode == 0o666 & ~_umask()
    assert sorted(p.name for p in summary.parent.iterdir()) == ["L2.hlo.txt", "L2.json"]


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask
