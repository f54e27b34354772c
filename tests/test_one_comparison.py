"""One comparison per cell (issue 32): ``check``, ``diff``, ``report --format json`` and ``explain`` say the same
numbers about one cell against its golden, because all four read one ``comparison.CellDelta`` / ``comparison.Structural``.

A team's own NNX model (tests/team_model.py) with goldens of its base step; each variant is checked against the
base's golden, then the same cell is diffed (its raw lowering, as ``lower`` writes it, against its golden's text),
reported and explained. Then the gate's direction, from plain data without jax: fewer weights is a change to judge,
fewer RNG parameters an improvement; and the program-size sentence that once read "+0 instructions, 1742 -> 1961".
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path

import pytest

import team_model as tm
from hlo_audit import audit
from hlo_audit.commands.inputs import cell_program
from hlo_audit.comparison import CellDelta, Structural, TextVerdict
from hlo_audit.golden.record import Golden, GoldenRecord
from hlo_audit.hlo.changes import Action, Change, ChangeKind
from hlo_audit.hlo.params import ParamSummary
from hlo_audit.judging.gate import Gate
from hlo_audit.matrix import Cell
from hlo_audit.policy import Policy
from hlo_audit.report.change_words import change_line
from hlo_audit.report.matrix import matrix_view
from hlo_audit.results import LoweredCell, Severity
from hlo_audit.rules.count import CountKind
from in_process import hlo_audit_here
from test_named_rules import cell, golden_of_base_for, write_config

pytestmark = pytest.mark.xdist_group("named_rules")

VARIANTS = ("remat_removed", "unrolled_8x", "f32_up", "up_renamed", "bias")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("one_comparison")
    shutil.copy(tm.__file__, folder / "team_model.py")
    write_config(folder, ["base"])
    assert hlo_audit_here(folder, "golden", "update").returncode == 0
    write_config(folder, ["base", *VARIANTS], '[policy]\nhlo_text = "warn"\n')
    golden_of_base_for(folder / "golden", VARIANTS)
    return folder


def json_of(project: Path, *args) -> dict:
    ran = hlo_audit_here(project, *args, "--format", "json")
    assert ran.returncode in (0, 1), ran.stderr[-3000:]
    return json.loads(ran.stdout)


@pytest.fixture(scope="module")
def checked(project) -> dict:
    return json_of(project, "check")


@pytest.fixture(scope="module")
def reported(project, checked) -> dict:
    return {c["id"]: c for c in json_of(project, "report")["cells"]}


@pytest.mark.parametrize("variant", VARIANTS)
def test_check_diff_report_and_explain_say_the_same_numbers(project, checked, reported, variant):
    cid = cell(variant)
    raw = project / f"{variant}.hlo.txt"
    assert hlo_audit_here(project, "lower", cid, "--output", raw).returncode == 0
    diffed = json_of(project, "diff", project / "golden" / f"{cid}.hlo.txt", raw)
    explained = json_of(project, "explain", cid)["against_golden"]
    report = reported[cid]
    # Entry parameters: golden and now, by dtype.
    assert (diffed["entry_params"]["old"], diffed["entry_params"]["new"]) == (
        explained["entry_params"]["golden"], explained["entry_params"]["now"])
    assert report["golden_delta"] == explained["entry_params"]["now"] - explained["entry_params"]["golden"]
    assert {k: v for k, v in report["by_dtype_delta"].items() if v} == explained["by_dtype_delta"] == \
        diffed["by_dtype_delta"]
    # The programs' sizes: diff's, explain's and (where the rule judged them) check's program-size finding's.
    sizes = {k: (v["golden"], v["now"]) for k, v in explained["sizes"].items()}
    assert {k: (v["old"], v["new"]) for k, v in diffed["sizes"].items()} == sizes
    assert diffed["per_step_by_opcode"] == explained["per_step_by_opcode"]
    judged = [f for f in checked["findings"] if f["cell"] == cid and f["rule"] == "program_size"]
    for finding in judged:
        assert {k: (v["golden"], v["now"]) for k, v in finding["details"]["sizes"].items()} == sizes
    program = next((c for c in diffed["named"] if c["kind"] == "program_size"), None)
    if program is not None:  # the named change's own before/after are the match's counts too
        assert (int(program["before"].split()[0]), int(program["after"].split()[0])) == sizes["instructions"]
    # The text's verdict: what check's text finding and diff say.
    verdict = {"renamed": "renamed-only", "changed": "changed"}[explained["text"]]
    assert diffed["verdict"] == verdict
    text = [f for f in checked["findings"] if f["cell"] == cid and f["rule"] == "hlo_text"]
    assert [f["details"]["verdict"] for f in text] == [verdict]
    # An unrolled loop's growth is the loops rule's, remat's shrink the remat rule's: no size finding counts them
    # again; biases added are work no other rule names, and the size finding's numbers are the others'.
    assert bool(judged) is (variant == "bias")


def test_one_changed_cell_is_one_comparison_object_in_check_report_explain_and_diff(project, monkeypatch):
    """Through the library in one process, a changed cell's comparison is built once, by its outcome: the report's
    view and explain's program hold the very object the gate judged by (``is``, not equal numbers), the program-size
    finding's sizes are its structural account's, and `diff`'s numbers come out of the same code path
    (``Structural.of_analyses``), equal to it."""
    built: list[Structural] = []
    of_analyses = Structural.of_analyses.__func__

    def spied(cls, *args, **kwargs):
        made = of_analyses(cls, *args, **kwargs)
        built.append(made)
        return made

    monkeypatch.setattr(Structural, "of_analyses", classmethod(spied))
    cid = cell("bias")
    search_path = list(sys.path)
    try:
        with contextlib.chdir(project):
            plan = audit.plan(None, f"id={cid}")
            results = list(audit.execute(plan))
            outcome = audit.check(plan, results)
            result = next(r for r in results if r.cell.id == cid)
            delta = outcome.deltas[cid]
            view = next(v for v in matrix_view(outcome).cells if v.result.cell.id == cid)
            program = cell_program(result, outcome)
            raw = project / "bias.library.hlo.txt"
            raw.write_text(audit.cell_text(cid))
            diffed = audit.diff_inputs(str(project / "golden" / f"{cid}.hlo.txt"), str(raw))
    finally:
        sys.path[:] = search_path
    assert delta is not None and delta.text is TextVerdict.CHANGED
    assert outcome.delta(result) is delta and view.compared is delta and program.against is delta
    structural = delta.structural
    finding = next(f for f in outcome.findings if f.cell == cid and f.rule == "program_size")
    assert finding.facts.sizes["instructions"] is structural.instructions
    assert any(made is structural for made in built) and any(made is diffed.structural for made in built)
    assert diffed.structural.sizes == structural.sizes
    assert diffed.structural.per_step_by_opcode == structural.per_step_by_opcode
    # The entry parameters: the structural account holds the cell's comparison's own (one object), and `diff`'s come
    # out of the same ``ParamDelta.between``, equal to it.
    assert structural.params is delta.params and diffed.structural.params == delta.params


@pytest.mark.parametrize("variant, grows_leaves", [("bias", True), ("f32_up", False)])
def test_every_number_of_one_changed_cell_is_the_same_in_every_command(project, tmp_path, variant, grows_leaves):
    """A changed cell against a golden of its base step that records the base's host figure (`measure --record`),
    each command run on its own through the library call the CLI makes: `check`, `report`, `explain` (the cell),
    `diff` (its raw lowering against its golden's text) and `measure` (its host figure, judged through the gate).
    Every number each shows of the cell is read from that command's result, and they are the same: the entry
    parameters in all, by dtype and by role; the instruction counts, the sizes and what moved per opcode; the named
    changes' FLOPs and instructions; the host figure's state leaves. Biases add state leaves (a host_cost finding in
    both commands that measure it); f32 up-projections move FLOPs (precision) and keep the leaves (none in either)."""
    folder = tmp_path / "project"
    shutil.copytree(project, folder)
    cid, base = cell(variant), "team/scan-off/base/L2"
    rounds = audit.measuring.Rounds(rounds=1, warmup=0, calls=1, host_calls=3)
    search_path = list(sys.path)
    try:
        with contextlib.chdir(folder):
            recorded = audit.measure(audit.plan(None, f"id={base}"), rounds, timing=False, record=True)
            assert recorded.recorded == (base,)
            golden_of_base_for(folder / "golden", [variant])  # the base's record, its host figure with it
            plan = audit.plan(None, f"id={cid}")
            results = list(audit.execute(plan))
            checked = audit.check(plan, results)
            reported = next(v for v in audit.report(plan, results).cells if v.result.cell.id == cid)
            explained = audit.load_program(cid)
            raw = folder / f"{variant}.raw.hlo.txt"
            raw.write_text(audit.cell_text(cid))
            diffed = audit.diff_inputs(str(folder / "golden" / f"{cid}.hlo.txt"), str(raw)).structural
            measured = audit.measure(plan, rounds, timing=False)
    finally:
        sys.path[:] = search_path
    check, explain, measure = checked.deltas[cid], explained.against, measured.outcome.deltas[cid]
    report = reported.compared
    # Entry parameters: in all, by dtype and role (report reads counts only: no text compared there).
    params = [d.params for d in (check, report, explain, measure)] + [diffed.params]
    assert all((p.golden, p.now, p.by_dtype, p.by_role) == (params[0].golden, params[0].now, params[0].by_dtype,
                                                            params[0].by_role) for p in params)
    # Biases (and their optimizer moments) are parameters more; f32 up-projections compute in f32 on the same ones.
    assert bool(params[0].by_dtype) is (params[0].now > params[0].golden) is grows_leaves
    # The programs: instructions as the match counts them, sizes, per opcode, and each named change's numbers.
    accounts = [check.structural, explain.structural, measure.structural, diffed]
    assert report.structural is None  # report compares no text (it prints counts only)

    def numbers(s):
        return (s.instructions, s.sizes, s.per_step_by_opcode, [(c.kind, c.flops, c.instructions, c.count)
                                                                 for c in s.diff.named])

    assert all(numbers(s) == numbers(accounts[0]) for s in accounts)
    assert any(c.flops for c in accounts[0].diff.named) is not grows_leaves  # f32_up's FLOPs moved to f32
    # The host figure: check's host_cost finding and measure's, the same leaves (their times are each run's own).
    in_check = [f for f in checked.findings if f.cell == cid and f.rule == "host_cost"]
    in_measure = [f for f in measured.findings if f.rule == "host_cost"]
    assert len(in_check) == len(in_measure) == int(grows_leaves)
    assert [f.severity for f in in_check] == [f.severity for f in in_measure]
    leaves = [[(f.facts.golden.leaves, f.facts.now.leaves, f.facts.leaves_delta) for f in found]
              for found in (in_check, in_measure)]
    assert leaves[0] == leaves[1] and all(delta > 0 for _, _, delta in leaves[0])
    assert checked.exit_code == 1 and measured.exit_code == int(grows_leaves)


def test_the_raw_lowering_and_the_canonical_text_diff_alike(project):
    """A raw lowering repeats computations its canonical text prints once: diffed raw against the golden it counted
    them (issue 32: -41 instructions where check said -95); both are now compared as their canonical texts."""
    cid = cell("remat_removed")
    raw, canonical = project / "rr.raw.hlo.txt", project / "rr.canonical.hlo.txt"
    assert hlo_audit_here(project, "lower", cid, "--output", raw).returncode == 0
    assert hlo_audit_here(project, "lower", cid, "--normalized", "--output", canonical).returncode == 0
    golden = project / "golden" / f"{cid}.hlo.txt"
    one, other = json_of(project, "diff", golden, raw), json_of(project, "diff", golden, canonical)
    for key in ("verdict", "entry_params", "sizes", "per_step_by_opcode", "match", "computations_added",
                "computations_removed", "opcode_dtype_delta"):
        assert one[key] == other[key], key
    assert one["match"]["instructions"][0] > one["match"]["instructions"][1]
    assert one["computations_added"] == [] and len(one["computations_removed"]) == one["match"][
        "computations_deleted"]
    same = json_of(project, "diff", raw, canonical)
    assert same["verdict"] == "identical-after-normalization"


# --------------------------------------------------------------------------------------------------------------
# The gate from plain data: no jax, no lowering
# --------------------------------------------------------------------------------------------------------------

CELL = Cell("m", False, "none", 2)


def result_of(by_role: dict[str, int], dtype: str = "f32") -> LoweredCell:
    total = sum(by_role.values())
    summary = ParamSummary(entry_params=total, by_dtype={dtype: total}, by_role=by_role, groups={}, bytes_by_role={})
    return LoweredCell(cell=CELL, summary=summary)


def golden_of(by_role: dict[str, int]) -> Golden:
    total = sum(by_role.values())
    record = GoldenRecord(cell=CELL.id, entry_params=total, by_dtype={"f32": total}, by_role=by_role, groups={},
                          environment={})
    return Golden(CELL.id, record, None)


def count_finding(golden: dict[str, int], now: dict[str, int]):
    result, stored = result_of(now), golden_of(golden)
    delta = CellDelta.for_cell(result, stored)
    findings = Gate(Policy({}), "hlo-audit golden update").judge_cell(result, stored, delta, None)[0]
    return delta, next(f for f in findings if f.rule in ("count", "all"))


@pytest.mark.parametrize("golden, now, kind, severity", [
    ({"weight": 6, "rng_key": 2}, {"weight": 6, "rng_key": 4}, CountKind.GREW, Severity.REGRESSION),
    ({"weight": 6, "rng_key": 4}, {"weight": 6, "rng_key": 2}, CountKind.SHRANK, Severity.IMPROVEMENT),
    ({"weight": 6, "optimizer_state": 12}, {"weight": 4, "optimizer_state": 8}, CountKind.CHANGED,
     Severity.REGRESSION),
    ({"weight": 6, "rng_key": 4}, {"weight": 4, "rng_key": 2}, CountKind.CHANGED, Severity.REGRESSION),
])
def test_a_shrinking_step_is_an_improvement_only_where_a_user_would_call_it_one(golden, now, kind, severity):
    delta, finding = count_finding(golden, now)
    assert delta.text is TextVerdict.NOT_COMPARED and delta.params.delta == sum(now.values()) - sum(golden.values())
    assert finding.facts.kind is kind and finding.severity is severity


def test_the_same_counts_match_their_golden():
    delta, finding = count_finding({"weight": 6}, {"weight": 6})
    assert not delta.params.counts_moved and finding.rule == "all" and finding.severity is Severity.OK


def test_a_program_size_change_beside_named_changes_says_both_numbers():
    """The kinds named before it took the whole change: what is left is said as such, beside the program's change
    (the sentence once read "+0 instructions (+0.0%), 1742 instructions -> 1961")."""
    rest = Change(ChangeKind.PROGRAM_SIZE, Action.CHANGED, "instructions", count=0, before="1742 instructions",
                  after="1961 instructions", instructions=0)
    line = change_line(rest)
    assert "+0 instructions besides the changes named above" in line and "(+219, +12.6%)" in line
    whole = Change(ChangeKind.PROGRAM_SIZE, Action.REMOVED, "instructions", count=95, before="492 instructions",
                   after="397 instructions", instructions=-95)
    assert "-95 instructions (-19.3%), 492 instructions -> 397 instructions" in change_line(whole)


def test_the_printed_command_accepts_each_named_change_once(tmp_path):
    """Each finding's accept command, run once, clears it: the cell passes, and running it again writes nothing."""
    shutil.copy(tm.__file__, tmp_path / "team_model.py")
    write_config(tmp_path, ["base"])
    assert hlo_audit_here(tmp_path, "golden", "update").returncode == 0
    changed = ("remat_removed", "unrolled_8x", "f32_up", "donation_removed", "debug_print")
    write_config(tmp_path, ["base", *changed], '[policy]\nhlo_text = "warn"\n')
    golden_of_base_for(tmp_path / "golden", changed)
    report = json_of(tmp_path, "check")
    for variant in changed:
        failing = [f for f in report["findings"] if f["cell"] == cell(variant) and f["severity"] == "regression"]
        assert failing, variant
        commands = {f["message"].rsplit("If intended: ", 1)[1].strip() for f in failing}
        assert len(commands) == 1, commands  # one command accepts every finding of the cell
        args = commands.pop().split()[1:]
        assert hlo_audit_here(tmp_path, *args).returncode == 0
        assert json_of(tmp_path, "check", "--only", f"id={cell(variant)}")["verdicts"][cell(variant)] == "ok"
        again = hlo_audit_here(tmp_path, *args)
        assert again.returncode == 0 and "0 written" in again.stdout + again.stderr, again.stdout + again.stderr
