"""A golden is evidence (issue 34, item 1): a golden that lacks what a rule compares is a finding naming what it lacks
and the golden update that writes it, never a silent pass; and `golden update` rewrites such a golden ("unchanged"
means the stored record equals what it would write).

The team's model (tests/team_model.py) with goldens of its base step: a pull request that drops the step's donation
and one that adds a ``jax.debug.print``, each checked against the base's golden with its ``"hlo"`` null and its text
deleted (what passed, "1 ok; no findings", before), as a summary of the current format (damaged) and as one of the
first format (older). The example MLP's golden without its RNG increments shows `golden update` rewriting it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import team_model as tm
from hlo_audit.golden.record import GOLDEN_FORMAT, GoldenRecord, record_problem
from in_process import hlo_audit_here
from projects import project as example_project
from test_named_rules import cell, write_config  # the team model's project, as the named rules' tests write it

pytestmark = pytest.mark.xdist_group("golden_integrity")

BASE = "team/scan-off/base/L2"
CHANGES = ("donation_removed", "debug_print")
def check(folder: Path, *args) -> tuple[int, dict]:
    ran = hlo_audit_here(folder, "check", "--format", "json", *args)
    assert ran.returncode in (0, 1), ran.stderr[-3000:]
    return ran.returncode, json.loads(ran.stdout)


def failing(report: dict, cell_id: str) -> list[dict]:
    return [f for f in report["findings"] if f["cell"] == cell_id and f["severity"] == "regression"]


@pytest.fixture(scope="module")
def team(tmp_path_factory) -> Path:
    """The team's project: the base step's golden, lowered once, and each change's cell lowered once into the cache
    by the first check."""
    folder = tmp_path_factory.mktemp("integrity")
    shutil.copy(tm.__file__, folder / "team_model.py")
    write_config(folder, ["base"])
    updated = hlo_audit_here(folder, "golden", "update")
    assert updated.returncode == 0, updated.stderr[-3000:]
    write_config(folder, ["base", *CHANGES])
    return folder


def goldens_of_base(golden: Path, edit) -> None:
    """The base cell's golden as each change's (a pull request checked against what its base accepted), its summary
    edited by ``edit`` (a dict -> None); the text kept only where the edited summary names it."""
    record = json.loads((golden / f"{BASE}.json").read_text())
    text = (golden / f"{BASE}.hlo.txt").read_text()
    for change in CHANGES:
        mine = {**record, "cell": cell(change)}
        edit(mine)
        (golden / cell(change)).parent.mkdir(parents=True, exist_ok=True)
        (golden / f"{cell(change)}.json").write_text(json.dumps(mine, indent=1, sort_keys=True) + "\n")
        kept = golden / f"{cell(change)}.hlo.txt"
        if mine.get("hlo") is None:
            kept.unlink(missing_ok=True)
        else:
            kept.write_text(text)


def without_text(record: dict) -> None:
    record["hlo"] = None


def without_text_of_the_first_format(record: dict) -> None:
    record["hlo"] = None
    del record["format"]


def test_a_change_against_the_golden_with_its_text_is_caught_by_its_rule(team):
    """The control: with the text, each change is its named rule's regression (the text is what they compare)."""
    goldens_of_base(team / "golden", lambda record: None)
    code, report = check(team)
    assert code == 1 and report["verdicts"][BASE] == "ok"
    assert {f["rule"] for f in failing(report, cell("donation_removed"))} >= {"donation"}
    assert {f["rule"] for f in failing(report, cell("debug_print"))} >= {"host_transfer"}


@pytest.mark.parametrize("edit, said", [
    (without_text, f"damaged: says golden format {GOLDEN_FORMAT}, yet without its text"),
    (without_text_of_the_first_format, "written by an older hlo-audit (golden format 1) without its text"),
])
def test_a_golden_without_its_text_is_a_missing_golden_regression_naming_it(team, edit, said):
    """``"hlo": null`` and the text deleted: before issue 34, read as an older golden, "1 ok; no findings" for a
    lost donation and an added debug print. Now each cell fails, by missing_golden, naming the text, the rules it
    turns off and the golden update that writes it; the base (a complete golden) still matches."""
    goldens_of_base(team / "golden", edit)
    code, report = check(team)
    assert code == 1 and report["verdicts"][BASE] == "ok", report["findings"]
    for change in CHANGES:
        assert report["verdicts"][cell(change)] == "regression"
        (finding,) = failing(report, cell(change))
        assert finding["rule"] == "missing_golden", finding
        assert said in finding["message"], finding["message"]
        # Every rule that reads the text's diff (its spec's ``reads``), named up to four and counted past them.
        assert ("the rules donation, host_transfer, rng_keys, precision and 13 more have nothing to compare for "
                "this cell") in finding["message"]
        command = f"hlo-audit golden update --only id={cell(change)}"
        assert finding["message"].endswith(command) and finding["details"]["regenerate"] == command
        assert finding["details"]["lacks"] == ["hlo"]
        assert finding["details"]["damaged"] is (edit is without_text)
    # The finding is missing_golden's: that rule off (the user's choice), the gate no longer fails on it.
    write_config(team, ["base", *CHANGES], '[policy]\nmissing_golden = "off"\n')
    try:
        code, report = check(team)
    finally:
        write_config(team, ["base", *CHANGES])
    assert code == 0 and not failing(report, cell("debug_print")), report["findings"]


def test_golden_update_rewrites_a_golden_without_a_part_it_writes(tmp_path):
    """The example MLP's golden without its RNG counter increments, of the first format: check names what it lacks
    (the count rule compares increments); `golden update` writes that cell (not "unchanged"), the other stays
    unchanged, and check then passes."""
    folder = example_project(tmp_path / "mlp", quant=["none", "dropout0"], layers=[2], scan=["off"])
    assert hlo_audit_here(folder, "golden", "update").returncode == 0
    edited = "mlp/scan-off/dropout0/L2"
    summary = folder / "golden" / f"{edited}.json"
    written = summary.read_text()
    record = json.loads(written)
    assert record["format"] == GOLDEN_FORMAT and "by_verdict" in record["rng_increments"]
    del record["rng_increments"], record["format"]
    summary.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    code, report = check(folder)
    (finding,) = failing(report, edited)
    assert code == 1 and finding["rule"] == "missing_golden" and finding["details"]["lacks"] == ["rng_increments"]
    assert ("(golden format 1) without RNG counter increments: the rule count has nothing to compare for this cell; "
            f"refresh it with: hlo-audit golden update --only id={edited}") in finding["message"]
    assert report["verdicts"]["mlp/scan-off/none/L2"] == "ok"
    updated = hlo_audit_here(folder, "golden", "update")
    assert updated.returncode == 0 and "1 written, 1 unchanged" in updated.stdout, updated.stdout
    assert summary.read_text() == written
    code, report = check(folder)
    assert code == 0 and not failing(report, edited), report["findings"]
    again = hlo_audit_here(folder, "golden", "update")
    assert "0 written, 2 unchanged" in again.stdout, again.stdout


def test_the_record_says_its_format_and_reads_one_without_as_the_first():
    base = {"cell": "k/scan-off/none/L1", "entry_params": 1, "by_dtype": {"f32": 1}, "by_role": {"input": 1},
            "groups": {"x": 1}, "environment": {"jax": "0.12.0.1"}}
    assert GoldenRecord.from_json(base).format == 1
    assert GoldenRecord.from_json({**base, "format": GOLDEN_FORMAT}).to_json()["format"] == GOLDEN_FORMAT
    assert record_problem({**base, "format": GOLDEN_FORMAT}, base["cell"]) is None
    assert record_problem({**base, "format": "2"}, base["cell"]) == "not a golden summary: 'format' is malformed"
    assert record_problem({**base, "format": GOLDEN_FORMAT + 1}, base["cell"]) == (
        f"written by a newer hlo-audit (golden format {GOLDEN_FORMAT + 1}; this one reads formats up to "
        f"{GOLDEN_FORMAT})")
