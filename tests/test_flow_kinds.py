"""Loops, remat, gradient reach and optimizer transforms named through `hlo-audit check` (issue 32): a Flax linen
language model and the trainer a user would write for it (tests/linen_model.py: a ``TrainState`` with
``optax.MultiSteps(chain(clip_by_global_norm, adamw))``, ``nn.remat`` blocks in a Python loop, a donated jitted step)
as a callable target, with goldens of its base step (and of its scanned form), then one pull request's change at a
time with the text rule at ``warn``: each fails by the rule of its kind, named and placed; harmless edits pass; the
attention's output projection renamed (which moves its leaves in the state's sorted order) exits 0 with the rename
advisory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import linen_model as lm
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.changes import CLIPPING, LOOP, TRIP_COUNT, WEIGHT_DECAY, Action, ChangeKind
from hlo_audit.hlo.diff import diff_modules
from hlo_audit.report.change_words import change_line
from in_process import hlo_audit_here

pytestmark = pytest.mark.xdist_group("flow_kinds")

# Each change: the golden it is checked against, the rule that catches it, the subject of its change.
CAUGHT = {
    "scan": ("base", "loops", "rolled"),
    "unscanned": ("scan", "loops", "unrolled"),
    "remat_removed": ("base", "remat", "rematerialization"),
    "remat_policy": ("base", "remat", "remat policy"),
    "stop_gradient": ("base", "gradient", "gradient reach lost"),
    "clip_removed": ("base", "gradient", "gradient clipping"),
    "scaled": ("base", "gradient", "update scaling"),
}
# What else a change is: scanned layers' weights are stacked (fewer entry parameters of other dims: the count ratchet,
# a change to judge, and the inputs' shapes); unrolled, their copies grow the program too.
# An unrolled step takes each layer's state as its own leaves: more the host flattens per call (host_cost) too.
BESIDES = {"scan": {"count", "shapes", "program_size"}, "unscanned": {"count", "shapes", "program_size", "host_cost"}}
HARMLESS = ("scopes", "helper", "reordered")
VARIANTS = [*CAUGHT, *HARMLESS, "out_renamed"]
CONFIG = """target = "linen_model:target"
models = ["lm"]
scan = ["off"]
quant = {quants}
layers = [2]
{extra}"""


def cell(variant: str) -> str:
    return f"lm/scan-off/{variant}/L2"


def write_config(project: Path, quants, extra: str = "") -> None:
    (project / "hlo-audit.toml").write_text(CONFIG.format(quants=json.dumps(list(quants)), extra=extra))


def golden_of(golden: Path, source: str, variant: str) -> None:
    """``source``'s golden (record and text) as ``variant``'s: the change checked against what its base accepted."""
    record = json.loads((golden / f"{cell(source)}.json").read_text())
    (golden / cell(variant)).parent.mkdir(parents=True, exist_ok=True)
    (golden / f"{cell(variant)}.json").write_text(json.dumps({**record, "cell": cell(variant)}, indent=1) + "\n")
    shutil.copy(golden / f"{cell(source)}.hlo.txt", golden / f"{cell(variant)}.hlo.txt")


def line_of(code: str) -> str:
    lines = [n for n, line in enumerate(Path(lm.__file__).read_text().splitlines(), 1) if code in line]
    assert len(lines) == 1, (code, lines)
    return f"linen_model.py:{lines[0]}"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The user's project: goldens of the base and scanned steps, each variant's golden its base's (the python loop
    checked against the scanned step's: a scan unrolled)."""
    project = tmp_path_factory.mktemp("flow_kinds")
    shutil.copy(lm.__file__, project / "linen_model.py")
    write_config(project, ["base", "scan"])
    updated = hlo_audit_here(project, "golden", "update")
    assert updated.returncode == 0, updated.stderr[-3000:]
    golden = project / "golden"
    golden_of(golden, "scan", "unscanned")  # first: the scan cell's golden becomes the base's below
    for variant in VARIANTS:
        if variant != "unscanned":
            golden_of(golden, "base", variant)
    return project


def check(project: Path, quants, extra: str = "") -> tuple[int, dict]:
    write_config(project, quants, extra)
    ran = hlo_audit_here(project, "check", "--format", "json")
    assert ran.returncode in (0, 1), ran.stderr[-3000:]
    return ran.returncode, json.loads(ran.stdout)


@pytest.fixture(scope="module")
def report(project) -> tuple[int, dict]:
    """One `check` of every variant with hlo_text = "warn"."""
    return check(project, ["base", *VARIANTS], '[policy]\nhlo_text = "warn"\n')


def findings(report: dict, variant: str, rule: str | None = None) -> list[dict]:
    return [f for f in report["findings"] if f["cell"] == cell(variant) and rule in (None, f["rule"])
            and f["severity"] != "ok"]


@pytest.mark.parametrize("variant", list(CAUGHT))
def test_each_change_fails_by_its_kind_named_and_placed(report, variant):
    code, out = report
    _, rule, subject = CAUGHT[variant]
    assert code == 1 and out["verdicts"][cell(variant)] == "regression", findings(out, variant)
    (finding,) = findings(out, variant, rule)
    assert finding["severity"] == "regression", finding
    changes = finding["details"]["changes"]
    assert changes[0]["subject"] == subject, changes
    assert changes[0]["place"]["paths"], changes[0]
    # Nothing else fails, but what the change is besides: the unrolled layers' own parameters (the count ratchet)
    # and the program their copies grow (the size ratchet). No size "improvement" for work lost.
    regressions = {f["rule"] for f in findings(out, variant) if f["severity"] == "regression"}
    assert rule in regressions and regressions <= {rule} | BESIDES.get(variant, set()), findings(out, variant)
    assert not [f for f in findings(out, variant, "program_size") if f["severity"] == "improvement"]


def change(report, variant: str) -> tuple[dict, str]:
    _, out = report
    (finding,) = findings(out, variant, CAUGHT[variant][1])
    return finding["details"]["changes"][0], finding["message"]


def test_loops_rolled_and_unrolled(report):
    """The two blocks as one nn.scan: a forward and a backward loop of 2 iterations, placed at the scan's line;
    the python loop against the scanned golden: the same loops unrolled."""
    rolled, said = change(report, "scan")
    assert (rolled["action"], rolled["count"], rolled["per_step"], rolled["layers"]) == ("added", 2, 2, 2)
    assert rolled["place"]["source"] == line_of('x, _ = stack(v, name="blocks")(x, None)')
    assert rolled["instructions"] < 0 and said.startswith("loops: 2 layers rolled into 2 loops of 2 iterations, body ")
    unrolled, said = change(report, "unscanned")
    assert (unrolled["action"], unrolled["count"], unrolled["per_step"]) == ("removed", 2, 2)
    # Placed where the block's copies are: one of its dots (the optimizer's per-layer updates come inline too).
    assert unrolled["place"]["op_name"].endswith("dot_general"), unrolled["place"]
    assert "/block_*/" in unrolled["place"]["op_name"] and unrolled["place"]["source"].startswith("linen_model.py:")
    assert unrolled["instructions"] == -rolled["instructions"]
    assert said.startswith("loops: 2 loops of 2 iterations, body ") and "unrolled (2 copies of the body inline)" in said


def test_remat_removed_and_its_policy_changed(report):
    removed, said = change(report, "remat_removed")
    assert (removed["action"], removed["count"], removed["layers"]) == ("removed", 2, 2)  # one barrier per block
    assert removed["instructions"] < 0 and said.startswith("remat: rematerialization removed at 2 checkpoints")
    policy, said = change(report, "remat_policy")
    ops = dict(policy["groups"])
    # nothing_saveable recomputes every dot of a block but its last (the down projection: the backward pass never
    # reads its result): q, k, v, the two attention einsums, the output projection, up: 7 per block.
    assert (policy["action"], policy["count"], ops["dot"]) == ("changed", 2, 7 * 2)
    assert policy["place"]["source"] == line_of('x = layer(v, name=f"block_{i}")(x)')
    assert "recomputed" in policy["after"]  # jax's metadata names them (rematted_computation)
    assert said.startswith("remat: policy changed at 2 checkpoints (1 per layer, 2 layers): ")
    assert "the backward pass recomputes dot +14" in said


def test_gradient_reach_lost_and_clipping_removed(report):
    lost, said = change(report, "stop_gradient")
    # Every weight of block 0 (two norms' scale and bias, q, k, v, the output projection, up and down: kernels and
    # biases), of 35 weights in all.
    assert (lost["action"], lost["count"], lost["before"], lost["after"]) == ("removed", 16, "35 weights",
                                                                             "19 reached")
    assert all(p.startswith("state.params.block_0.") for p in lost["place"]["paths"])
    assert "gradient: reach lost: 16 weights no longer updated from the loss" in said
    assert "state.params.block_0.* (16)" in said and "dot -" in said
    clipping, said = change(report, "clip_removed")
    assert (clipping["action"], clipping["before"]) == ("removed", "global norm over 35 arrays")  # one per weight
    assert clipping["instructions"] < 0
    assert said.startswith("optimizer: gradient clipping removed (global norm over 35 arrays)")
    scaling, said = change(report, "scaled")  # optax.scale(0.5) after adamw: one multiply per weight
    assert (scaling["action"], scaling["count"], scaling["before"]) == ("added", 35, "x0.5 on 35 arrays")
    assert said.startswith("optimizer: update scaling added (x0.5 on 35 arrays)")


def test_the_rename_exits_0_and_harmless_edits_pass(project):
    """With every rule at its default (hlo_text fails): the renamed output projection (its leaves move in the state's
    sorted order, and with them the parameters, the outputs, the remat barriers' values and the global norm's sum)
    is the rename advisory; named scopes, a helper function and another construction order are no change."""
    code, out = check(project, ["base", "out_renamed", *HARMLESS])
    assert code == 0, [f for f in out["findings"] if f["severity"] == "regression"]
    assert out["verdicts"] == {cell("base"): "ok", cell("out_renamed"): "advisory",
                               **{cell(v): "ok" for v in HARMLESS}}
    (text,) = findings(out, "out_renamed", "hlo_text")
    assert text["details"]["verdict"] == "renamed-only"
    (rename,) = text["details"]["renames"]
    # The kernel and bias, their accumulated gradients and adam's two moments, per block.
    assert (rename["before"], rename["after"], rename["count"]) == ("attn_out_proj", "out_proj", 2 * 4 * 2)


def test_a_rule_off_lets_its_change_through(project):
    code, out = check(project, ["base", "stop_gradient", "clip_removed"],
                       '[policy]\nhlo_text = "warn"\ngradient = "off"\n')
    assert code == 0 and not [f for f in out["findings"] if f["rule"] == "gradient"], out["findings"]


def _fori(trips: int | None):
    """A step with a loop of ``trips`` iterations (None: its one update inline, no loop)."""
    def step(x):
        if trips is None:
            return x * 2
        return jax.lax.fori_loop(0, trips, lambda _, v: v * 0.5 + jnp.tanh(v), x)

    text = jax.jit(step).lower(jax.ShapeDtypeStruct((4,), jnp.float32)).as_text(dialect="hlo")
    return analyze(text, f"trips {trips}")


def test_a_trip_count_changed_and_a_loop_added_or_removed():
    d = diff_modules(_fori(8), _fori(4), max_text_lines=0)
    (trips,) = d.named  # the bound's constant in the loop's condition is the trip count's
    assert (trips.kind, trips.subject, trips.before, trips.after) == (ChangeKind.LOOPS, TRIP_COUNT, "8 iterations",
                                                                      "4 iterations")
    for old, new, action in ((None, 8, Action.ADDED), (8, None, Action.REMOVED)):
        d = diff_modules(_fori(old), _fori(new), max_text_lines=0)
        (loop,) = [c for c in d.named if c.kind is ChangeKind.LOOPS]
        # One update inline is no unrolled copy of an 11-instruction body: a loop added or removed.
        assert (loop.subject, loop.action, loop.per_step) == (LOOP, action, 8)
        assert change_line(loop).startswith(f"loops: a loop {action.value}: 8 iterations, body 11 instructions")


def _lm(name: str):
    text = lm.traced(lm.VARIANTS.get(name, lm.Variant())).lower(lowering_platforms=("cpu",)).as_text(dialect="hlo")
    return analyze(text, name)


def test_gradient_reach_gained_and_clipping_added_from_texts():
    """The other way, from `hlo-audit diff`'s texts alone (no leaf types: the weights are the float leaves under
    ``params``): unfreezing block 0 gains 16 weights' reach, putting clipping back adds it."""
    base = _lm("base")
    d = diff_modules(_lm("stop_gradient"), base, max_text_lines=0)
    (gained,) = [c for c in d.named if c.kind is ChangeKind.GRADIENT]
    assert (gained.action, gained.count, gained.after) == (Action.ADDED, 16, "19 reached")
    assert all(p.startswith("state_params.block_0.") for p in gained.place.paths)
    d = diff_modules(_lm("clip_removed"), base, max_text_lines=0)
    (clipping,) = [c for c in d.named if c.kind is ChangeKind.TRANSFORM]
    assert (clipping.subject, clipping.action, clipping.before) == (CLIPPING, Action.ADDED,
                                                                    "global norm over 35 arrays")
    assert not [c for c in d.named if c.kind is ChangeKind.GRADIENT]  # every weight reached either way


def test_weight_decay_removed_is_named_apart_from_a_scaling():
    """adamw's weight decay (``updates + wd * params``) at 0: a multiply by 0.01 of each weight itself gone, named
    weight decay (found on flax's lm1b, where it read 'update scaling removed'); optax.scale's multiply of each update
    stays 'update scaling' (the report test above)."""
    d = diff_modules(_lm("base"), _lm("no_weight_decay"), max_text_lines=0)
    (decay,) = [c for c in d.named if c.kind is ChangeKind.TRANSFORM]
    assert (decay.subject, decay.action, decay.before) == (WEIGHT_DECAY, Action.REMOVED, "x0.01 on 35 arrays")
    assert change_line(decay).startswith("optimizer: weight decay removed (x0.01 on 35 arrays)")


def test_a_rename_that_reorders_the_state_is_renamed_only_in_diff():
    """`hlo-audit diff` of the two texts: the renamed projection moves 16 leaves in the state's order (the entry
    parameters, the outputs, the values the remat barriers carry, the global norm's sum); renamed-only, the renames
    its only named change. A real change beside it (clipping removed) is still a change."""
    base = _lm("base")
    d = diff_modules(base, _lm("out_renamed"), max_text_lines=0)
    assert (d.verdict, d.differs) == ("renamed-only", False)
    (rename,) = d.named
    assert (rename.kind, rename.before, rename.after, rename.count) == (ChangeKind.RENAME, "attn_out_proj",
                                                                         "out_proj", 16)
    moved = lm.Variant(out_name="out_proj", clip=False)
    text = lm.traced(moved).lower(lowering_platforms=("cpu",)).as_text(dialect="hlo")
    d = diff_modules(base, analyze(text, "moved"), max_text_lines=0)
    assert d.verdict == "changed" and ChangeKind.TRANSFORM in {c.kind for c in d.named}


def test_compiled_the_rename_stays_renamed_only_and_reach_lost_is_named():
    """After XLA's optimizations (fusions, their parameters in the leaves' new order too): the rename is still
    renamed-only, a frozen block still 16 weights' reach lost, clipping removed still named."""
    def compiled(name: str):
        lowered = lm.traced(lm.VARIANTS.get(name, lm.Variant())).lower(lowering_platforms=("cpu",))
        return analyze(lowered.compile().as_text(), name)

    base = compiled("base")
    assert diff_modules(base, compiled("out_renamed"), max_text_lines=0).verdict == "renamed-only"
    d = diff_modules(base, compiled("stop_gradient"), max_text_lines=0)
    (lost,) = [c for c in d.named if c.kind is ChangeKind.GRADIENT]
    assert (lost.action, lost.count) == (Action.REMOVED, 16)
    d = diff_modules(base, compiled("clip_removed"), max_text_lines=0)
    assert [(c.subject, c.action) for c in d.named if c.kind is ChangeKind.TRANSFORM] == [(CLIPPING, Action.REMOVED)]
