"""A weight renamed in nanodo's linen trainer is renamed-only (issue 47 item 4), and a real change beside the rename is
still named.

On google-deepmind/nanodo's trainer, ``attn_out_proj -> out_proj`` was "changed (attributes)" (the count rule calling
it renamed): the rename moves the projection's leaves after ``key``'s, and nanodo's metrics take running (Welford)
means over the leaves in tree order, ``m * (S / S') + sum(x) / S'`` with literals Python computes for that order, so
the renamed step computes the same means by other chains of other literals. tests/nanodo_linen.py is that trainer in
small (which nanodo files it follows: its doc); the rename there was "changed (attributes)", 51 instructions changed.
reorder.py reads such a chain as its terms with their weights (linear_forms.py), the weights alike as far as the
literals' rounding explains, so the rename is renamed-only; a weight that differs (a leaf counted one element larger),
a leaf left out of the clip's global norm or an extra multiply is still a change, and named.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import nanodo_linen as nl
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.hlo.linear_forms import Region, Regions, Weight, WeightIds
from in_process import cli_diff, hlo_audit_here
from in_process import diff_texts as diff
from in_process import named_of_kind as kinds
from projects import checking, judged_against_base


@pytest.fixture(scope="module")
def base() -> str:
    return nl.lowered_text()


def test_the_projection_renamed_is_renamed_only(base, tmp_path):
    renamed = nl.lowered_text(**nl.VARIANTS["renamed"])
    # The leaves moved: the canonical texts differ, and not by the parameters' names alone.
    assert analyze(base, "old").normalized != analyze(renamed, "new").normalized
    d = diff(base, renamed)
    assert (d.verdict, d.changes, d.differs) == ("renamed-only", [], False), (d.verdict, d.changes, d.named)
    (rename,) = kinds(d, ChangeKind.RENAME)
    assert (rename.before, rename.after, rename.count) == ("attn_out_proj", "out_proj", 8), rename
    ran = cli_diff(tmp_path, base, renamed)
    assert ran.exit_code == 0 and ran.stdout.startswith("verdict: renamed-only"), ran.stdout
    assert "rename: attn_out_proj -> out_proj, 8 parameters" in ran.stdout


# Each change beside the rename: the kinds of change, and a named change that says it.
CHANGED = {
    "norm_without_leaf": (["ops", "shapes"], ChangeKind.PROGRAM_SIZE),  # the global norm's sum a term shorter
    "multiply": (["ops", "shapes"], ChangeKind.OPS),  # the attention's output doubled
    "mean_weight": (["ops", "shapes"], ChangeKind.CONSTANTS),  # a running mean's weights other ones
}


@pytest.mark.parametrize("change", CHANGED)
def test_a_change_beside_the_rename_is_changed_and_named(base, change, tmp_path):
    text = nl.lowered_text(**nl.VARIANTS[f"renamed_{change}"])
    d = diff(base, text)
    expected, kind = CHANGED[change]
    assert (d.verdict, d.changes, d.differs) == ("changed", expected, True), (d.verdict, d.changes)
    assert kinds(d, kind) and kinds(d, ChangeKind.RENAME), [(c.kind, c.subject) for c in d.named]
    ran = cli_diff(tmp_path, base, text)
    assert ran.exit_code == 1 and ran.stdout.startswith("verdict: changed (ops, shapes)"), ran.stdout


def test_the_changed_weight_is_named_by_its_literals(base):
    """The running means count the first leaf one element larger: every size after it is one more."""
    d = diff(base, nl.lowered_text(**nl.VARIANTS["renamed_mean_weight"]))
    sizes = {(c.before, c.after) for c in kinds(d, ChangeKind.CONSTANTS)}
    assert {("256", "257"), ("1256", "1257")} <= sizes, sizes


def test_the_gate_passes_the_rename_and_fails_a_leaf_left_out_of_the_norm(tmp_path):
    """`check` against the base's golden: the rename passes (exit 0, an advisory); beside a leaf left out of the
    clip's global norm it is a regression."""
    module = Path(nl.__file__)
    project = judged_against_base(tmp_path / "project", module, "nanodo", ("renamed", "renamed_norm_without_leaf"))
    checking(project, module, "nanodo", ["renamed"])
    ran = hlo_audit_here(project, "check", "--format", "json", "--no-cache")
    assert ran.returncode == 0, (ran.stdout[-3000:], ran.stderr[-3000:])
    assert json.loads(ran.stdout)["verdicts"] == {"nanodo/scan-off/renamed/L2": "advisory"}
    checking(project, module, "nanodo", ["renamed_norm_without_leaf"])
    ran = hlo_audit_here(project, "check", "--format", "json", "--no-cache")
    assert ran.returncode == 1, ran.stderr[-3000:]
    report = json.loads(ran.stdout)
    assert report["verdicts"] == {"nanodo/scan-off/renamed_norm_without_leaf/L2": "regression"}, report["findings"]
    (text,) = [f for f in report["findings"] if f["rule"] == "hlo_text"]
    assert text["severity"] == "regression" and "changed (ops, shapes)" in text["message"], text


# -- what makes a reduction over the leaves the same in another order ---------------------------------------------

SIZES = {"a": 2, "b": 3, "c": 5}


def _welford(mean_and_size, x):
    mean, size = mean_and_size
    new_size = size + x.size
    return mean * (size / new_size) + jnp.sum(x) / new_size, new_size


def _welford_doubled(mean_and_size, x):
    """The running mean with each leaf's sum doubled and halved again: the same value, a multiply more per leaf."""
    mean, size = mean_and_size
    new_size = size + x.size
    return mean * (size / new_size) + (jnp.sum(x) * 2.0) / (2 * new_size), new_size


def _moving_average(mean_and_count, x):
    mean, count = mean_and_count
    return mean * 0.5 + jnp.sum(x) * 0.5, count + 1


def _reduced(step, renamed: dict[str, str]) -> str:
    """``jax.tree.reduce(step)`` over leaves of sizes 2, 3, 5, some renamed (``a -> d`` moves ``a`` last)."""
    tree = {renamed.get(name, name): jax.ShapeDtypeStruct((size,), jnp.float32) for name, size in SIZES.items()}
    jax.clear_caches()
    return jax.jit(lambda t: jax.tree.reduce(step, t, (0., 0.))[0]).lower(tree).as_text(dialect="hlo")


def test_a_running_mean_in_another_order_is_renamed_only_a_moving_average_is_not():
    """A running mean weighs every leaf ``1 / S``, whatever the order (its literals differ); an exponential moving
    average weighs the last leaf most, so a leaf moved last is weighed otherwise: a change, though the ops are alike.
    The same mean computed with an op more per leaf is a change too."""
    d = diff(_reduced(_welford, {}), _reduced(_welford, {"a": "d"}))
    assert d.verdict == "renamed-only", (d.verdict, d.changes, d.named)
    d = diff(_reduced(_welford, {}), _reduced(_welford_doubled, {"a": "d"}))
    assert d.verdict == "changed" and "ops" in d.changes, (d.verdict, d.changes)
    (size,) = kinds(d, ChangeKind.PROGRAM_SIZE)
    assert size.instructions == 4, size  # a multiply per leaf (3) and the literal 2.0 they share
    d = diff(_reduced(_moving_average, {}), _reduced(_moving_average, {"a": "d"}))
    assert (d.verdict, d.changes) == ("changed", ["attributes"]), (d.verdict, d.changes)


def _ids(*weights: tuple[float, int], precision: int = 24) -> list[int]:
    region = Region(tuple((f"t{n}", Weight(Fraction(value), literals)) for n, (value, literals) in enumerate(weights)),
                    Weight(Fraction(0), 0), precision, (("add", len(weights) - 1),))
    number = WeightIds([Regions({0: region}, frozenset())])
    return [number(Weight(Fraction(value), literals), precision) for value, literals in weights]


def test_weights_are_alike_within_their_literals_rounding_and_no_further():
    ulp = 2.0 ** -23  # f32's unit in the last place at 1
    # One literal each: alike within 2 * (1 + 1) * 2^-24, two units in the last place; three apart they are not.
    assert len(set(_ids((1.0, 1), (1.0 + 2 * ulp, 1)))) == 1
    assert len(set(_ids((1.0, 1), (1.0 + 3 * ulp, 1)))) == 2
    # No literal (a sum's ones): alike only when equal.
    assert len(set(_ids((1.0, 0), (1.0 + ulp, 0)))) == 2
    # Weights each alike the next, spanning nine units where two literals explain two: never one number for two
    # weights more than two units apart.
    ids = _ids(*((1.0 + n * ulp, 1) for n in range(10)))
    assert len(set(ids)) == 4 and all(abs(i - j) <= 2 for i in range(10) for j in range(10) if ids[i] == ids[j]), ids
    # bf16's 8 bits: 2^-7 apart is within two literals' rounding.
    assert len(set(_ids((1.0, 1), (1.0 + 2.0 ** -7, 1), precision=8))) == 1
