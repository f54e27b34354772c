"""State by type: roles from what a leaf is, layers folded by structure, nnx.jit steps with real paths.

Every number comes from a real lowering: ``nnx_models``' held-RNG model (per layer, ``self.noise_source =
rngs.fork()`` or ``self.rng = nnx.Rngs(0)``: one never-drawn stream, a key and a count, under a name no rule
knows, in blocks ``cell_0``, ``cell_1``... under a name the old layer rules did not know), a step whose state
only types describe (``typed_state_traced``), a model quantized by qwix (a third-party NNX library), the
committed goldens' real modules and, marked ``maxtext``, MaxText's own train step.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import nnx_models
from hlo_audit.analysed import Param
from hlo_audit.attribution import arg_keys, arg_leaves
from hlo_audit.commands.explain import explain
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.params import collapse_layers, name_role
from hlo_audit.lowering import Lowering
from hlo_audit.matrix import Cell
from hlo_audit.stages.lowered import hlo_text
from hlo_audit.targets.callable import CallableTarget, jax_stage

ROOT = Path(__file__).resolve().parents[1]
TARGET = "nnx_models:held_rng_target"
HOLDER_ATTRIBUTE = {"fork": "noise_source", "own": "rng"}


def lowered_cell(jit: str, holder: str, layers: int) -> Lowering:
    """The held-RNG model's step as the callable target lowers it (``cell.model`` is the jit, ``quant`` the holder)."""
    return CallableTarget(TARGET).lower(Cell(model=jit, scan=False, quant=holder, layers=layers, target=TARGET))


def analysed(lowering: Lowering, source: str = "<cell>"):
    return analyze(lowering.text, source, lowering.arg_keys, lowering.captured, lowering.arg_leaves)


def described(analysis):
    """What a twin must agree on: every parameter's path, role, dtype, dims and pattern, and every RNG stream."""
    params = [(p.path, p.role, p.dtype, p.shape.dims, p.pattern) for p in analysis.params]
    return params, [(s.path, s.pattern, s.verdict, s.increments) for s in analysis.rng.streams]


@pytest.mark.parametrize("jit", ["jax", "nnx"])
@pytest.mark.parametrize("holder", ["fork", "own"])
def test_held_rng_state_is_rng_state_by_type(holder, jit):
    layers = 3
    lowering = lowered_cell(jit, holder, layers)
    analysis = analysed(lowering)
    attribute = HOLDER_ATTRIBUTE[holder]
    rng = [p for p in analysis.params if p.is_rng]
    assert analysis.summary.by_role == {"weight": 4 * layers, "rng_count": layers, "rng_key": layers, "input": 1}
    assert {p.kind for p in rng} == {"nnx.RngKey", "nnx.RngCount"}
    assert analysis.summary.groups[f"model.cell_*.{attribute}.*"] == 2 * layers
    assert {(s.path, s.verdict) for s in analysis.rng.streams} == {
        (f"model.cell_{i}.{attribute}.default", "carried") for i in range(layers)}
    assert {s.pattern for s in analysis.rng.streams} == {f"model.cell_*.{attribute}.default"}
    # The names alone call this state `other` (u32 under a state root): the old rules' verdict, which types replace.
    assert {name_role(p.path, p.shape) for p in rng} == {"other"}
    # An HLO file has no types: NNX's RngStream structure (sibling key u32[2] / count u32[]) says so. nnx.jit's HLO
    # names its parameters by flat index (`model.states[0][3]`): the tool's text is told the graph's paths.
    from_text = analyze(lowering.text)
    assert [(p.path, p.role) for p in from_text.params] == [(p.path, p.role) for p in analysis.params]
    assert Counter(s.verdict for s in from_text.rng.streams) == {"carried": layers}


@pytest.mark.parametrize("holder", ["fork", "own"])
@pytest.mark.parametrize("jit,twin", [("nnx", "jax"), ("nnx_lowered", "jax"), ("nnx_grad", "jax_grad")])
def test_an_nnx_jit_step_is_its_jax_jit_twin(jit, twin, holder):
    """nnx.jit's arguments are flat leaf lists (`.states[0][17]`); the graph gives them back their paths and types."""
    nnx_step, jax_step = analysed(lowered_cell(jit, holder, 2)), analysed(lowered_cell(twin, holder, 2))
    assert lowered_cell(jit, holder, 2).arg_leaves is not None
    params, streams = described(nnx_step)
    twin_params, twin_streams = described(jax_step)
    if jit == "nnx_grad":  # nnx.grad wraps the loss in `*args`: jax names its arguments args[0], args[1]
        assert params[0][0].startswith("args.0.cell_0.") and params[-1][0] == "args.1"

        def renamed(text):
            return re.sub(r"^args\.1$", "x", re.sub(r"^args\.0\.", "model.", text))

        params = [(renamed(p[0]), *p[1:4], renamed(p[4])) for p in params]
        streams = [(renamed(s[0]), renamed(s[1]), *s[2:]) for s in streams]
    assert params == twin_params
    assert streams == twin_streams and len(streams) == 2
    assert not any(".states." in p[0] for p in params)
    assert {p.kind for p in nnx_step.params} == {"nnx.Param", "nnx.RngKey", "nnx.RngCount", None}


def test_a_traced_nnx_jit_is_accepted_and_anything_else_named():
    from hlo_audit.lowering import TargetError

    traced = nnx_models.held_rng_traced(2, "fork", "nnx")
    assert not isinstance(traced, jax.stages.Traced) and isinstance(jax_stage(traced), jax.stages.Traced)
    target = CallableTarget(TARGET)
    target.function = lambda cell: "not a step"
    with pytest.raises(TargetError, match=r"returned str, expected a jax Traced \(jax.jit\(f\).trace\(...\) or "
                                          r"nnx.jit\(f\).trace\(...\)\) or Lowered"):
        target.lower(Cell(model="nnx", scan=False, quant="fork", layers=2, target=TARGET))


def test_kinds_survive_the_cache():
    lowering = lowered_cell("nnx", "own", 2)
    back = Lowering.from_cache(lowering.text, json.loads(json.dumps(lowering.meta())))
    assert back.arg_leaves == lowering.arg_leaves and back.arg_keys == lowering.arg_keys
    assert [p.to_record() for p in analysed(back).params] == [p.to_record() for p in analysed(lowering).params]


def test_types_say_what_names_do_not():
    """No argument named as state, no key under an `rngs` owner: each role comes from the leaf's type."""
    lowered = nnx_models.typed_state_traced().lower(lowering_platforms=("cpu",))
    analysis = analyze(lowered.as_text(dialect="hlo"), "<typed>", arg_keys(lowered), None, arg_leaves(lowered))
    by_path = {p.path: (p.role, p.kind) for p in analysis.params}
    assert by_path == {
        "seed": ("rng_key", "prng_key"),  # jax.random.key(0): a typed key, whatever its name
        # jax.random.PRNGKey's raw u32[2]: no type says it is a key, the step does: it draws from it (a bernoulli)
        "noise": ("rng_key", None),
        "adam.0.count": ("optimizer_state", "optax.ScaleByAdamState"),
        "adam.0.mu.w": ("optimizer_state", "optax.ScaleByAdamState"),
        "adam.0.nu.w": ("optimizer_state", "optax.ScaleByAdamState"),
        "ts.step": ("step", "TrainState.step"),
        "ts.params.w": ("weight", "TrainState.params"),
        "net.linear.bias": ("weight", "nnx.Param"),
        "net.linear.kernel": ("weight", "nnx.Param"),
        "net.norm.bias": ("weight", "nnx.Param"),
        "net.norm.scale": ("weight", "nnx.Param"),
        "net.norm.mean": ("batch_stat", "nnx.BatchStat"),
        "net.norm.var": ("batch_stat", "nnx.BatchStat"),
        "net.last": ("cache", "nnx.Cache"),
        "x": ("input", None),
    }
    # By names (the old rules, now the fallback), none of the typed leaves but three gets its role.
    named = {p.path: name_role(p.path, p.shape) for p in analysis.params if p.kind}
    agree = {path for path, role in named.items() if role == by_path[path][0]}
    assert agree == {"adam.0.mu.w", "adam.0.nu.w", "ts.step"}
    assert [(s.path, s.verdict) for s in analysis.rng.streams] == [("seed", "drawn"), ("noise", "drawn")]


def test_layers_fold_by_structure_and_explain_finds_them():
    analysis = analysed(lowered_cell("jax", "fork", 4))
    assert analysis.summary.groups == {
        "model.cell_*.noise_source.*": 8, "model.cell_*.linear.bias": 4, "model.cell_*.linear.kernel": 4,
        "model.cell_*.proj.bias": 4, "model.cell_*.proj.kernel": 4, "x": 1}
    assert collapse_layers("model.cell_3.linear.kernel") == "model.cell_3.linear.kernel"  # names alone do not
    assert {p.layer_prefix for p in analysis.params} == {"model.cell_*", None}
    records = [p.to_record() for p in analysis.params]
    tree = explain([Param.from_record(r) for r in records], "held", depth=2, top=0)
    assert [(c.name, c.count) for c in tree.ordered()] == [
        ("model.cell_*.*.kernel", 8), ("model.cell_*.*.bias", 8), ("model.cell_*.noise_source.*", 8), ("x", 1)]
    assert [(c.name, c.count) for c in tree.children["model.cell_*.*.kernel"].ordered()] == [("linear", 4), ("proj", 4)]
    # A record without the structure's layer prefix (a result stored before it existed): by name, no family.
    old = explain([Param.from_record({k: v for k, v in r.items() if k != "layer_prefix"}) for r in records], "held",
                  depth=2, top=0)
    assert len(old.children) == 6


def _golden_texts():
    return sorted(glob.glob(str(ROOT / "golden/**/*.hlo.txt"), recursive=True))


def _folded_by_name(groups: dict[str, int]) -> dict[str, int]:
    """A golden's groups with `<word>_layers_N` folded as structure folds them now."""
    folded: Counter[str] = Counter()
    for pattern, n in groups.items():
        folded[re.sub(r"\b((?:\w+_)?layers)_\d+\b", r"\1_*", pattern)] += n
    return dict(folded)


def test_committed_goldens_keep_their_roles_and_fold_their_layer_lists():
    """The real modules of every committed golden: roles as the golden counted them; MaxText's wi_0 / wi_1 (equal
    shapes, inside a layer) stay apart; deepseek's dense_layers_N / moe_layers_N fold like layers_N."""
    texts = _golden_texts()
    assert len(texts) >= 40
    for path in texts:
        golden = json.loads(Path(path.replace(".hlo.txt", ".json")).read_text())
        summary = analyze(Path(path).read_text(), path).summary
        assert summary.by_role == golden["by_role"], path
        assert summary.groups == _folded_by_name(golden["groups"]), path
    deepseek = analyze((ROOT / "golden/deepseek3-test/scan-off/int8/L2.hlo.txt").read_text()).summary.groups
    assert deepseek["state.model.decoder.dense_layers_*.mlp.wi_0.kernel"] == 1
    assert deepseek["state.model.decoder.moe_layers_*.DeepSeekMoeBlock_0.shared_experts.wi_1.kernel"] == 1
    scanned = analyze((ROOT / "golden/llama3-8b/scan-on/int8/L2.hlo.txt").read_text()).params
    kernel = next(p for p in scanned if p.path == "state.model.decoder.layers.mlp.wi_0.kernel")
    assert kernel.pattern == "state.model.decoder.layers.mlp.wi_0.kernel"  # wi_0 / wi_1 inside the stack: apart
    assert kernel.layer_prefix == "state.model.decoder.layers"  # the scanned stack, by its u32[L] RNG counts


def test_a_third_party_nnx_library_qwix():
    """qwix (PyPI, installed with MaxText) quantizes an NNX model for training: per layer it adds a QuantStat
    (a pytree inside one Variable) and, for stochastic rounding, the Rngs its docs say to set, shared by every
    module. Roles and streams by type; the layer list folds though only its first layer shows the shared Rngs."""
    qwix = pytest.importorskip("qwix")

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(16, 16, rngs=rngs)

        def __call__(self, x):
            return nnx.relu(self.linear(x))

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.cells = nnx.List([Block(rngs) for _ in range(3)])

        def __call__(self, x):
            for cell in self.cells:
                x = cell(x)
            return x

    rule = qwix.QtRule(module_path=".*", weight_qtype="int8", act_qtype="int8", act_static_scale=True,
                       bwd_qtype="int8", bwd_stochastic_rounding="uniform")
    model = qwix.quantize_model(Net(nnx.Rngs(0)), qwix.QtProvider([rule]), jnp.ones((4, 16)),
                                rngs=nnx.Rngs(stochastic_rounding=1))
    model.set_attributes(qwix_rngs=nnx.Rngs(stochastic_rounding=1))

    def train_step(model, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(model, nnx.Param), grads))
        return loss

    lowered = jax_stage(nnx.jit(train_step).trace(model, jax.ShapeDtypeStruct((4, 16), jnp.float32))).lower()
    analysis = analyze(hlo_text(lowered), "<qwix>", arg_keys(lowered), None, arg_leaves(lowered))
    state = nnx.state(model)
    counts = Counter(p.kind for p in analysis.params)
    assert counts["nnx.Param"] == len(jax.tree.leaves(nnx.state(model, nnx.Param))) == 6
    assert counts["nnx.RngKey"] == len(jax.tree.leaves(nnx.state(model, nnx.RngKey))) == 1
    assert counts["nnx.Variable:QuantStat"] == len(jax.tree.leaves(nnx.state(model, qwix.QuantStat))) == 6
    assert len(analysis.params) == len(jax.tree.leaves(state)) + 1
    assert [(s.path, s.verdict) for s in analysis.rng.streams] == [
        ("model.cells.0.linear.qwix_rngs.stochastic_rounding", "drawn")]
    assert analysis.summary.groups["model.cells.*.linear.kernel"] == 3
    assert analysis.summary.groups["model.cells.*.linear.dot_general0_lhs.sum_of_absmax"] == 3


HELD_RNG_TARGET = '''
"""A user's project: a model that holds a never-drawn Rngs per layer, under names no rule knows."""
import jax
import jax.numpy as jnp
from flax import nnx


class Block(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(8, 8, rngs=rngs)
        self.noise_source = rngs.fork()

    def __call__(self, x):
        return nnx.relu(self.linear(x))


class Model(nnx.Module):
    def __init__(self, layers, rngs):
        self.stages = nnx.List([Block(rngs) for _ in range(layers)])

    def __call__(self, x):
        for stage in self.stages:
            x = stage(x)
        return x


def lower(cell):
    model = nnx.eval_shape(lambda: Model(cell.layers, nnx.Rngs(0)))

    def train_step(model, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(model, nnx.Param), grads))
        return loss

    return nnx.jit(train_step).trace(model, jax.ShapeDtypeStruct((4, 8), jnp.float32))


lower.full_depth = {"held": 8}
'''


def test_rng_scaling_fails_on_held_rng_state_through_the_cli(tmp_path):
    (tmp_path / "held.py").write_text(textwrap.dedent(HELD_RNG_TARGET))
    (tmp_path / "hlo-audit.toml").write_text('target = "held:lower"\nmodels = ["held"]\nscan = ["off"]\n'
                                             'quant = ["none"]\nlayers = [2, 4]\n')

    def hlo_audit(*args):
        return subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=tmp_path, capture_output=True,
                              text=True, env={**os.environ, "COLUMNS": "200"}, timeout=600)

    update = hlo_audit("golden", "update")
    assert update.returncode == 0, update.stderr
    golden = json.loads((tmp_path / "golden/held/scan-off/none/L4.json").read_text())
    assert golden["by_role"] == {"input": 1, "rng_count": 4, "rng_key": 4, "weight": 8}
    assert golden["groups"]["model.stages.*.noise_source.*"] == 8
    check = hlo_audit("check")
    out = " ".join(check.stdout.split())
    assert check.returncode == 1, out
    assert "RNG parameters grow by 2 per layer in an unrolled model (rng_key +1, rng_count +1; depths 2, 4)" in out
    rng = hlo_audit("rng", "held/scan-off/none/L4", "--format", "json", "--streams")
    assert rng.returncode == 1, rng.stderr  # it carries streams it never draws from: dead state
    doc = json.loads(rng.stdout)
    assert (doc["streams"], doc["carried"]) == (4, 4)
    streams = [(s["path"], s["verdict"]) for s in doc["stream_list"]]
    assert streams == [(f"model.stages.{i}.noise_source.default", "carried") for i in range(4)]


@pytest.mark.maxtext
@pytest.mark.xdist_group("maxtext")
def test_maxtext_state_is_typed_and_its_golden_roles_hold(session_lowerings):
    """MaxText's own train step: every state leaf has an NNX type (Param, RngKey, RngCount, OptState's kinds, and
    fp8's bridged `_overwrite_with_gradient` collection), and the by_role counts and groups are the golden's. The
    lowering is the session's (the maxtext matrix run's cell), with its recorded leaf types."""
    cell = Cell(model="llama3-8b", scan=False, quant="int8", layers=2)
    _, lowering = session_lowerings.lower(cell)
    analysis = analysed(lowering, cell.id)
    golden = json.loads((ROOT / "golden/llama3-8b/scan-off/int8/L2.json").read_text())
    assert analysis.summary.by_role == golden["by_role"]
    assert analysis.summary.groups == golden["groups"]
    kinds = Counter(p.kind for p in analysis.params)
    assert kinds == {"nnx.RngKey": 45, "nnx.RngCount": 45, "nnx.OptVariable": 42, "nnx.Param": 21,
                     "nnx.OptArray": 2, "nnx.OptState": 1, None: 5}
    assert all(p.path.startswith("data.") for p in analysis.params if p.kind is None)
