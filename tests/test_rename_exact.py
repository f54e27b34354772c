"""Renamed-only is identical after the rename, RNG derivation included (issue 37 item 5), and renames and reorders
pair by structure, whatever the order of the state's leaves (issue 39 item 4).

A rename may change the literals folded into keys only as a rename explains them (linen folds a hash of each module's
path: tests/test_linen_rename.py): salts that were distinct stay distinct. Two layers drawing one mask beside a rename
(``fold_in`` salts 11, 22 -> 11, 11), or a key folded once more, is an RNG change and fails. A rename or a field
reorder is renamed-only (exit 0) in a scanned NNX stack, a linen trainer with a global-norm clip and a dataclass
pytree; a multiply beside it is still named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rename_models as rm
from hlo_audit.hlo.changes import RNG_DERIVATION, ChangeKind
from in_process import cli_diff, hlo_audit_here
from in_process import diff_texts as diff
from in_process import named_of_kind as kinds
from projects import checking, judged_against_base

# -- issue 37 item 5: RNG derivation is part of the program -----------------------------------------------------


def test_a_rename_alone_is_renamed_only():
    d = diff(rm.salted(), rm.salted(up="up_proj"))
    assert (d.verdict, d.differs) == ("renamed-only", False), (d.verdict, d.changes)
    (rename,) = kinds(d, ChangeKind.RENAME)
    assert (rename.before, rename.after, rename.count) == ("up", "up_proj", 2)


def test_a_rename_with_salts_another_one_to_one_is_renamed_only():
    """A renamed module folds other literals (linen's path hashes): distinct salts that stay distinct are a rename's."""
    d = diff(rm.salted(), rm.salted(up="up_proj", salts=(33, 44)))
    assert d.verdict == "renamed-only", (d.verdict, d.changes)


def test_a_rename_with_salts_collapsed_is_an_rng_change(tmp_path):
    """Both layers drawing one mask (salts 11, 22 -> 11, 11) beside a rename: changed, named as RNG derivation."""
    d = diff(rm.salted(), rm.salted(up="up_proj", salts=(11, 11)))
    assert (d.verdict, d.changes, d.differs) == ("changed", ["rng"], True)
    (rng,) = [c for c in d.named if c.subject == RNG_DERIVATION]
    assert "salts 11, 22; 2 distinct" in rng.before and "salts 11, 11; 1 distinct" in rng.after, rng
    assert kinds(d, ChangeKind.RENAME)  # the rename is still said
    ran = cli_diff(tmp_path, rm.salted(), rm.salted(up="up_proj", salts=(11, 11)))
    assert ran.exit_code == 1 and ran.stdout.startswith("verdict: changed (rng)"), ran.stdout
    assert "RNG derivation calls" in ran.stdout and "salts 11, 11" in ran.stdout


def test_salts_collapsed_without_a_rename_still_fail():
    """Both layers folding one salt draw one mask: a key drawn twice, which strips to the program of two salts but
    is no RNG bookkeeping (issue 47): changed (rng), the reused key named."""
    d = diff(rm.salted(), rm.salted(salts=(11, 11)))
    assert d.differs and (d.verdict, d.changes) == ("changed", ["rng"])
    assert [(c.subject, c.before, c.after) for c in kinds(d, ChangeKind.RNG_KEYS)] == [("reused key", "0", "1")]


def test_a_rename_with_a_key_folded_once_more_is_an_rng_change():
    """An RNG op more beside a rename (the stripped programs are alike: the mask is RNG state either way)."""
    d = diff(rm.salted(), rm.salted(up="up_proj", extra="fold_in"))
    assert (d.verdict, d.changes) == ("changed", ["rng"])
    (rng,) = [c for c in d.named if c.subject == RNG_DERIVATION]
    assert rng.before.startswith("fold_in x2") and rng.after.startswith("fold_in x3"), rng


def test_a_rename_with_a_multiply_is_that_change():
    d = diff(rm.salted(), rm.salted(up="up_proj", extra="multiply"))
    assert d.verdict == "changed" and "ops" in d.changes and "rng" not in d.changes
    assert kinds(d, ChangeKind.OPS) and kinds(d, ChangeKind.RENAME)


def test_the_gate_passes_a_rename_and_fails_it_with_salts_collapsed(tmp_path):
    """`check` against the base's golden: the rename an advisory (exit 0), the rename with one mask a regression."""
    module = Path(rm.__file__)
    project = judged_against_base(tmp_path / "project", module, "salted", ("renamed", "renamed_salts_collapsed"))
    checking(project, module, "salted", rm.SALTED)
    ran = hlo_audit_here(project, "check", "--format", "json", "--no-cache")
    assert ran.returncode == 1, ran.stderr[-3000:]
    report = json.loads(ran.stdout)
    verdicts = report["verdicts"]
    assert verdicts["salted/scan-off/renamed/L2"] == "advisory", report["findings"]
    assert verdicts["salted/scan-off/renamed_salts_collapsed/L2"] == "regression", report["findings"]
    (text,) = [f for f in report["findings"]
               if f["cell"] == "salted/scan-off/renamed_salts_collapsed/L2" and f["rule"] == "hlo_text"]
    assert text["severity"] == "regression" and "changed (rng)" in text["message"], text


# -- issue 39 item 4: renames and reorders pair by structure ------------------------------------------------------


# Each model: its base, the rename, the rename beside a multiply.
RENAMES = {
    "scanned_nnx": (rm.scanned_nnx, lambda: rm.scanned_nnx("ff_in"), lambda: rm.scanned_nnx("ff_in", extra=True)),
    "linen": (rm.linen_attention, lambda: rm.linen_attention("out_proj"),
              lambda: rm.linen_attention("out_proj", extra=True)),
}


@pytest.mark.parametrize("model", RENAMES)
def test_a_rename_that_reorders_leaves_is_renamed_only_and_a_change_beside_it_is_named(model, tmp_path):
    base, renamed, changed = (make() for make in RENAMES[model])
    d = diff(base, renamed)
    assert (d.verdict, d.changes) == ("renamed-only", []), (d.verdict, d.changes, d.named)
    assert kinds(d, ChangeKind.RENAME)
    ran = cli_diff(tmp_path, base, renamed)
    assert ran.exit_code == 0 and ran.stdout.startswith("verdict: renamed-only"), ran.stdout
    d = diff(base, changed)
    assert d.verdict == "changed" and "ops" in d.changes and kinds(d, ChangeKind.OPS), (d.verdict, d.changes)


def test_a_field_reorder_is_renamed_only_and_a_change_beside_it_is_named(tmp_path):
    old, reordered = rm.dataclass_fields(), rm.dataclass_fields(("wo", "wv", "wk", "wq"))
    assert old != reordered
    d = diff(old, reordered)
    assert (d.verdict, d.changes) == ("renamed-only", []), (d.verdict, d.changes, d.named)
    (order,) = kinds(d, ChangeKind.RENAME)
    assert (order.subject, order.count) == ("order", 4)
    assert sorted(path[-2:] for path, _ in order.groups) == ["wk", "wo", "wq", "wv"], order.groups
    ran = cli_diff(tmp_path, old, reordered)
    assert ran.exit_code == 0 and ran.stdout.startswith("verdict: renamed-only"), ran.stdout
    d = diff(old, rm.dataclass_fields(("wo", "wv", "wk", "wq"), extra=True))
    assert d.verdict == "changed" and "ops" in d.changes and kinds(d, ChangeKind.OPS), (d.verdict, d.changes)
