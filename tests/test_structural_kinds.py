"""Issue 32's structural kinds end to end: a user's FSDP adamw step over 8 CPU devices (tests/sharded_step.py), at
stages lowered and compiled, with goldens of its base step, then one pull request's change at a time through
`hlo-audit check` with the text rule at ``warn`` (as under any jax other than the goldens').

Each regression fails, named by its kind (``sharding``, ``collectives``, ``shapes``, ``ops``) and placed; none is
called ``precision``; harmless edits (named scopes, ``jnp.dot`` for ``@``, a helper function, reordered
construction) pass; with the rules that named a change turned off, the change passes. jax's device count is fixed
when it starts, so every check runs in one process of its own with 8 host devices (``_DRIVER``), once per module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sharded_step as ss
from hlo_audit.config import load_config
from hlo_audit.hlo.change_structure import sharding_key

pytestmark = pytest.mark.xdist_group("structural_kinds")

REGRESSIONS = ("constraint_removed", "up_replicated", "psum_added", "batch_16", "non_causal", "transposed")
HARMLESS = ("named_scopes", "dot_call", "helper", "reordered")
STAGES = ("lowered", "compiled")
RULES = ("sharding", "collectives", "shapes", "ops")
# The rule each regression must be named by, at each stage (others may name what follows from it: a compiled step's
# collectives move with its shardings and shapes).
NAMED = {
    ("constraint_removed", "lowered"): "sharding", ("constraint_removed", "compiled"): "collectives",
    ("up_replicated", "lowered"): "sharding", ("up_replicated", "compiled"): "sharding",
    ("psum_added", "lowered"): "collectives", ("psum_added", "compiled"): "collectives",
    ("batch_16", "lowered"): "shapes", ("batch_16", "compiled"): "shapes",
    ("non_causal", "lowered"): "ops", ("non_causal", "compiled"): "ops",
    ("transposed", "lowered"): "ops", ("transposed", "compiled"): "ops",
}
CONFIG = """target = "sharded_step:target"
models = ["fsdp"]
scan = ["off"]
quant = {quants}
layers = [2]
{extra}
[[matrix]]
stage = "compiled"
"""

# Run in a process of its own with 8 host devices: `golden update` of the base, then `check` of every variant
# against the base's golden with hlo_text at warn, then each regression again with the rules that named it off.
_DRIVER = """
import json, shutil, sys
from pathlib import Path
from typer.testing import CliRunner
from hlo_audit.cli import app

folder, regressions, variants, config = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3].split(","), sys.argv[4]
named = ("sharding", "collectives", "shapes", "ops", "precision", "program_size")

def run(*args):
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result

def write(quants, extra=""):
    (folder / "hlo-audit.toml").write_text(config.format(quants=json.dumps(quants), extra=extra))

write(["base"])
assert run("golden", "update").exit_code == 0
golden = folder / "golden" / "fsdp" / "scan-off"
for variant in variants:
    (golden / variant / "L2").mkdir(parents=True)
    for base, mine in ((golden / "base" / "L2", golden / variant / "L2"), (golden / "base" / "L2.json",
                       golden / variant / "L2.json"), (golden / "base" / "L2.hlo.txt", golden / variant / "L2.hlo.txt")):
        if base.is_dir():
            for f in base.iterdir():
                record = f.read_text().replace("fsdp/scan-off/base/", f"fsdp/scan-off/{variant}/")
                (mine / f.name).write_text(record)
        else:
            mine.write_text(base.read_text().replace("fsdp/scan-off/base/", f"fsdp/scan-off/{variant}/"))
write(["base", *variants], '[policy]\\nhlo_text = "warn"\\n')
warned = run("check", "--format", "json")
reports = {"warn": [warned.exit_code, json.loads(warned.stdout)]}
for variant in regressions:
    fired = sorted({f["rule"] for f in reports["warn"][1]["findings"]
                    if f["cell"].startswith(f"fsdp/scan-off/{variant}/") and f["severity"] == "regression"
                    and f["rule"] in named})
    write(["base", *variants], '[policy]\\nhlo_text = "warn"\\n' + "".join(f'{r} = "off"\\n' for r in fired))
    off = run("check", "--format", "json", "--only", f"quant={variant}")
    reports[variant] = [off.exit_code, json.loads(off.stdout), fired]
moved = folder / "moved"  # the goldens as another jax wrote them: the text is advisory by itself
shutil.copytree(folder / "golden", moved)
for path in moved.rglob("*.json"):
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "environment": {**record["environment"], "jax": "0.0.1"}}))
write(["base", *variants], f'golden_dir = "{moved}"')
checked = run("check", "--format", "json")
reports["moved"] = [checked.exit_code, json.loads(checked.stdout)]
(folder / "reports.json").write_text(json.dumps(reports))
"""


def cell(variant: str, stage: str) -> str:
    return f"fsdp/scan-off/{variant}/L2" + ("/compiled" if stage == "compiled" else "")


def model_line(code: str) -> str:
    lines = [n for n, line in enumerate(Path(ss.__file__).read_text().splitlines(), 1) if code in line]
    assert len(lines) == 1, (code, lines)
    return f"sharded_step.py:{lines[0]}"


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("structural_kinds")
    shutil.copy(ss.__file__, folder / "sharded_step.py")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run([sys.executable, "-c", _DRIVER, str(folder), ",".join(REGRESSIONS),
                          ",".join((*REGRESSIONS, *HARMLESS)), CONFIG], cwd=folder, env=env, capture_output=True,
                         text=True, timeout=900)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads((folder / "reports.json").read_text())


def findings(report: dict, variant: str, stage: str, rule: str | None = None) -> list[dict]:
    return [f for f in report["findings"] if f["cell"] == cell(variant, stage) and rule in (None, f["rule"])]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("variant", REGRESSIONS)
def test_each_regression_fails_named_and_placed(reports, variant, stage):
    code, report = reports["warn"]
    assert code == 1 and report["verdicts"][cell(variant, stage)] == "regression"
    rule = NAMED[(variant, stage)]
    (finding,) = findings(report, variant, stage, rule)
    assert finding["severity"] == "regression", finding
    changes = finding["details"]["changes"]
    assert changes and {c["kind"] for c in changes} == {rule}
    assert all(c["place"]["computation"] for c in changes), changes
    assert not findings(report, variant, stage, "precision")  # never misnamed precision
    (text,) = findings(report, variant, stage, "hlo_text")
    assert text["severity"] == "advisory"


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("variant", HARMLESS)
def test_harmless_edits_pass(reports, variant, stage):
    _, report = reports["warn"]
    assert report["verdicts"][cell(variant, stage)] in ("ok", "advisory"), findings(report, variant, stage)
    assert not [f for f in findings(report, variant, stage) if f["rule"] in RULES]


def test_the_base_matches_its_golden(reports):
    _, report = reports["warn"]
    assert {report["verdicts"][cell("base", s)] for s in STAGES} == {"ok"}


@pytest.mark.parametrize("variant", REGRESSIONS)
def test_the_rules_are_what_catch_each_change(reports, variant):
    """With the named rules that fired turned off (and the text rule at warn), the change passes: each of the four
    new rules is among those that catch one."""
    code, report, fired = reports[variant]
    # program_size besides where the program shrank beyond its tolerance (fewer instructions is a change to judge).
    assert set(fired) & set(RULES) and not set(fired) - {*RULES, "program_size"}, fired
    assert code == 0, [f for f in report["findings"] if f["severity"] == "regression"]
    assert {report["verdicts"][cell(variant, s)] for s in STAGES} <= {"advisory", "ok"}
    assert not [f for s in STAGES for f in findings(report, variant, s) if f["rule"] in fired]


def test_every_new_rule_catches_some_change(reports):
    fired = {rule for variant in REGRESSIONS for rule in reports[variant][2]}
    assert set(RULES) <= fired


def test_what_the_findings_say(reports):
    """The numbers behind the findings, from the model: six parameters made replicated, four constraints removed
    (two layers, forward and backward), two all-reduces of a psum (forward and its transpose), the inputs doubled,
    the causal mask's ops removed, transposes added."""
    _, report = reports["warn"]
    (replicated,) = [c for c in findings(report, "up_replicated", "lowered", "sharding")[0]["details"]["changes"]
                     if c["subject"] == "parameters"]
    assert (replicated["count"], replicated["before"], replicated["after"]) == (
        6, "{devices=[8,1]<=[8]}", "{replicated}")
    assert {p for p, _ in replicated["groups"]} == {"state.0.layer_*.up", "state.1.0.mu.layer_*.up",
                                                    "state.1.0.nu.layer_*.up"}
    message = findings(report, "up_replicated", "lowered", "sharding")[0]["message"]
    assert "sharding: 6 parameters {devices=[8,1]<=[8]} -> {replicated}" in message
    (removed,) = findings(report, "constraint_removed", "lowered", "sharding")[0]["details"]["changes"]
    assert (removed["action"], removed["subject"], removed["count"]) == ("removed", "sharding constraint", 4)
    assert removed["before"] == "{devices=[1,8,1]<=[8]}"
    gathers = [c for c in findings(report, "up_replicated", "compiled", "collectives")[0]["details"]["changes"]
               if c["subject"] == "all-gather" and c["action"] == "removed"]
    assert gathers and all("state.0.layer_*.up" in c["place"]["paths"] for c in gathers)
    assert all(c["bytes"] > 0 and c["per_step"] == c["count"] for c in gathers)
    for stage in STAGES:
        (psum,) = findings(report, "psum_added", stage, "collectives")[0]["details"]["changes"]
        assert (psum["action"], psum["subject"], psum["count"], psum["per_step"]) == ("added", "all-reduce", 2, 2)
        assert psum["bytes"] == 2 * ss.BATCH // ss.DEVICES * ss.SEQ * ss.WIDTH * 4
        # Compiled, the forward all-reduce and its transpose keep jax's op_names of each pass (``jvp()``,
        # ``transpose(jvp())``): one change still, at the model's one line.
        assert psum["place"]["source"] == model_line("jax.lax.psum(")
        assert "collectives: all-reduce added x2, 2 runs per step" in findings(
            report, "psum_added", stage, "collectives")[0]["message"]
    for stage in STAGES:
        inputs = [c for c in findings(report, "batch_16", stage, "shapes")[0]["details"]["changes"]
                  if c["subject"] == "inputs"]
        assert [(c["count"], c["groups"], c["place"]["paths"]) for c in inputs] == [(2, [["x2", 2]], ["x", "y"])]
    assert "shapes: 2 inputs x2 (f32[8,8,16] -> f32[16,8,16]" in findings(
        report, "batch_16", "lowered", "shapes")[0]["message"]
    mask = {op: n for c in findings(report, "non_causal", "compiled", "ops")[0]["details"]["changes"]
            for op, n in c["groups"]}
    assert mask["iota"] < 0 and mask["compare"] < 0 and mask["select"] < 0
    transposes = findings(report, "transposed", "lowered", "ops")[0]["details"]["changes"]  # forward, backward
    assert sum(n for c in transposes for op, n in c["groups"] if op == "transpose") == 4
    assert all(c["action"] == "added" and c["groups"] == [["transpose", 2]] for c in transposes), transposes
    assert {c["place"]["source"] for c in transposes} == {model_line("probs = probs.swapaxes(")}


# The kinds another jax and XLA move in an unchanged step: advisory under another environment than the golden's.
MOVE_WITH_THE_STACK = ("ops", "shapes")


@pytest.mark.parametrize("variant", (*REGRESSIONS, *HARMLESS, "base"))
def test_under_another_environment_shardings_and_collectives_gate_and_the_op_mix_is_advisory(reports, variant):
    """Goldens written under another jax: each regression is still named by its rule; shardings, collectives and
    the inputs' shapes still fail it; ops and the values' shapes are advisory and say why (jax 0.11.2 against 0.12's
    goldens moves 74 ops of this unchanged compiled step); unchanged and harmless steps pass."""
    code, report = reports["moved"]
    assert code == 1
    if variant not in REGRESSIONS:
        assert {report["verdicts"][cell(variant, s)] for s in STAGES} <= {"ok", "advisory"}
        return
    for stage in STAGES:
        assert findings(report, variant, stage, NAMED[(variant, stage)])
        for f in findings(report, variant, stage):
            inputs = f["rule"] == "shapes" and any(c["subject"] == "inputs" for c in f["details"]["changes"])
            if f["rule"] in MOVE_WITH_THE_STACK and not inputs:
                assert f["severity"] == "advisory" and "the environment differs from the golden's" in f["message"]
            elif f["rule"] in ("sharding", "collectives") or inputs:
                assert f["severity"] == "regression", f
    # Caught by a sharding, a collective or the inputs' shapes: still a regression of those rules; the mask made
    # non-causal, by its op mix alone: advisory, named (and the program size, which shrank beyond its tolerance).
    gating = {f["rule"] for s in STAGES for f in findings(report, variant, s) if f["severity"] == "regression"}
    assert bool(gating & {"sharding", "collectives", "shapes"}) is (variant != "non_causal"), gating


@pytest.mark.parametrize("golden,now,same", [
    # A compiled parameter as jax 0.12 and 0.11.2 print it: one sharding in two notations.
    ("{devices=[8,1]<=[8]}", "{mesh['fsdp'=8], [{'fsdp'}, {}]}", True),
    ("{devices=[8,1,1]<=[8]}", "{mesh['fsdp'=8], [{'fsdp'}, {}, {}]}", True),
    ("{replicated}", "{mesh['fsdp'=8], [{}, {}]}", True),
    ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", "{mesh['data'=2,'model'=4], [{'data'}, {}]}", True),
    # What the regressions change.
    ("{devices=[8,1]<=[8]}", "{replicated}", False),
    ("{devices=[1,8,1]<=[8]}", "{devices=[8,1,1]<=[8]}", False),
    ("{mesh['fsdp'=8], [{'fsdp'}, {}]}", "{mesh['fsdp'=8], [{}, {'fsdp'}]}", False),
])
def test_a_sharding_is_compared_by_what_it_says(golden, now, same):
    assert (sharding_key(golden) == sharding_key(now)) is same


def test_the_new_rules_are_policy_keys(tmp_path):
    (tmp_path / "hlo-audit.toml").write_text('[policy]\nsharding = "warn"\nops = "off"\n')
    rules = load_config(cwd=tmp_path).rules
    assert [rules.actions[r] for r in RULES] == ["warn", "fail", "fail", "off"]


def test_remat_s_copies_of_a_sharding_constraint_are_remat_not_constraints_added():
    """Remat added around a block whose output is constrained: the backward pass recomputes the block and with it a
    copy of its ``with_sharding_constraint`` (MaxText's remat PR: "sharding: 24 constraints added"). The copy is
    remat's (under the checkpoint in jax's name stack): one remat change, no sharding change."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from hlo_audit.comparison import Structural
    from hlo_audit.hlo.analysis import analyze

    mesh = Mesh(np.array(jax.devices("cpu")[:1]), ("x",))

    def block(w, h):
        h = jax.lax.with_sharding_constraint(h @ w, NamedSharding(mesh, P("x", None)))
        return jnp.tanh(h) * h

    def text(remat: bool) -> str:
        def loss(ws, h):
            for w in ws:
                h = (jax.checkpoint(block) if remat else block)(w, h)
            return jnp.sum(h)
        ws, h = [jnp.ones((8, 8))] * 2, jnp.ones((4, 8))
        return jax.jit(jax.grad(loss)).lower(ws, h).as_text(dialect="hlo", debug_info=True)

    before, after = text(False), text(True)
    assert after.count("custom_call_target=\"Sharding\"") > before.count("custom_call_target=\"Sharding\"")
    named = Structural.of_inputs(analyze(before, "a"), analyze(after, "b")).diff.named
    kinds = [c.kind.value for c in named if c.kind.value not in ("header", "instructions")]
    assert kinds == ["remat"], [(c.kind.value, c.subject) for c in named]


def test_remat_that_writes_no_barrier_is_remat_and_its_constraint_copies_are_not_constraints_added():
    """``nnx.remat(prevent_cse=False, policy=checkpoint_dots)`` around blocks whose values are constrained (as
    MaxText's scanned layers and its remat PR lower): no opt-barrier is written, the recomputation is named by jax's
    name stack alone (``rematted_computation``); and the match pairs an old forward constraint with remat's copy of
    it, leaving the forward one "added" (MaxText's remat PR: "3 sharding constraints added", 28 forward constraints
    before and after). One remat change, no sharding change."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from hlo_audit.comparison import Structural
    from hlo_audit.hlo.analysis import analyze

    mesh = Mesh(np.array(jax.devices("cpu")[:1]), ("x",))

    def shard(h):
        return jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P()))

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.q, self.k, self.o = (nnx.Linear(8, 8, rngs=rngs) for _ in range(3))

        def __call__(self, x):
            q, k = shard(self.q(x)), shard(self.k(x))
            return shard(x + jnp.tanh(self.o(shard(jax.nn.softmax(q @ k.T) @ x))))

    class Model(nnx.Module):
        def __init__(self, rngs, remat):
            self.blocks, self.remat = nnx.List([Block(rngs) for _ in range(2)]), remat

        def __call__(self, x):
            for b in self.blocks:
                remat = nnx.remat(b, prevent_cse=False, policy=jax.checkpoint_policies.checkpoint_dots)
                x = (remat if self.remat else b)(x)
            return x

    def analysed(remat: bool):
        graphdef, state = nnx.split(Model(nnx.Rngs(0), remat))

        def loss(state, x):
            return jnp.sum(nnx.merge(graphdef, state)(x))
        text = jax.jit(jax.grad(loss)).lower(state, jnp.ones((4, 8))).as_text(dialect="hlo", debug_info=True)
        return analyze(text, str(remat))

    before, after = analysed(False), analysed(True)
    assert not any(i.opcode == "opt-barrier" for c in after.module.computations.values() for i in c.instructions)
    named = Structural.of_inputs(before, after).diff.named
    kinds = {c.kind.value for c in named}
    assert "remat" in kinds and "sharding" not in kinds, [(c.kind.value, c.subject, c.count) for c in named]
    (remat,) = [c for c in named if c.kind.value == "remat"]
    assert (remat.action.value, remat.layers) == ("added", 2)


def test_a_place_is_past_maxtext_s_tunix_shims():
    """MaxText's tunix adapter, once imported, replaces jax.lax.with_sharding_constraint (and top_k) for every caller
    with a shim (``tunix_adapter.py:43``): a constraint's frames are the shim's, then the model's call. The place is
    the model's line, as if the shim were jax's own (MaxText's remat PR was placed at tunix_adapter.py:43)."""
    from hlo_audit.hlo.locations import Locations

    files = {1: "/site-packages/maxtext/integration/tunix/tunix_adapter.py", 2: "/site-packages/jax/_src/lax.py",
             3: "/work/repo/maxtext/layers/attentions.py"}
    locations = {1: {"file_name_id": 2, "line": 900}, 2: {"file_name_id": 1, "line": 43},
                 3: {"file_name_id": 3, "line": 512}}
    # Innermost first: jax's own frame, the shim, the model's call (a parent is its caller's number plus one).
    frames = {1: {"file_location_id": 1, "parent_frame_id": 3}, 2: {"file_location_id": 2, "parent_frame_id": 4},
              3: {"file_location_id": 3, "parent_frame_id": 0}}
    assert Locations.of_tables(files, locations, frames).frame(1) == "attentions.py:512"
    files[1] = "/work/repo/my_shims.py"  # a project's own wrapper stays its place
    assert Locations.of_tables(files, locations, frames).frame(1) == "my_shims.py:43"
