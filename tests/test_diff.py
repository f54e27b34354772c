"""Verdicts of the semantic diff on real lowerings and on targeted edits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

import nnx_models
from hlo_audit.comparison import Structural
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.hlo.diff import diff_modules
from hlo_audit.hlo.rng import strip_rng_state
from hlo_audit.hlo.text import parse_module
from hlo_audit.stages.lowered import hlo_text
from nnx_models import ModelSpec
from xla_oracle import our_counts, xla_counts


def _diff(old_spec: ModelSpec, new_spec: ModelSpec, **kw):
    return diff_modules(analyze(nnx_models.hlo_text(old_spec), "old"), analyze(nnx_models.hlo_text(new_spec), "new"),
                        **kw)


def _compared(old_spec: ModelSpec, new_spec: ModelSpec) -> Structural:
    """The two lowerings as `diff` compares them: the program's diff and the entry parameters' (``ParamDelta``)."""
    return Structural.of_analyses(analyze(nnx_models.hlo_text(old_spec), "old"),
                                  analyze(nnx_models.hlo_text(new_spec), "new"))


@pytest.mark.parametrize("old,new,pattern,count", [
    (ModelSpec(layers=4), ModelSpec(layers=4, dropout_rate=0.0), "state.layers_*.dropout.rngs.*", 8),
    (ModelSpec(scan=True), ModelSpec(scan=True, dropout_rate=0.0), "state.layers.dropout.rngs.*", 2),
    (ModelSpec(rngs=False), ModelSpec(), "state.rngs.*", 4),
], ids=["unrolled-dropout0", "scanned-dropout0", "model-rngs"])
def test_leaked_rng_state_is_rng_state_only(old, new, pattern, count):
    compared = _compared(old, new)
    d = compared.diff
    assert d.verdict == "rng-state-only" and d.differs
    assert compared.params.by_dtype == {"u32": count}
    assert compared.params.by_role == {"rng_count": count // 2, "rng_key": count // 2}
    assert {(g.role, g.dtype, g.pattern, g.count) for g in d.params_added} == {
        ("rng_key", "u32", pattern, count // 2), ("rng_count", "u32", pattern, count // 2)}
    assert d.params_removed == []
    # And the other way round: the fix removes exactly those.
    back = _diff(new, old)
    assert back.verdict == "rng-state-only"
    assert sum(g.count for g in back.params_removed) == -count


def test_drawing_dropout_is_a_real_change():
    compared = _compared(ModelSpec(dropout_rate=0.0), ModelSpec(dropout_rate=0.5))
    d = compared.diff
    assert d.verdict == "changed"
    assert "ops" in d.changes
    assert d.opcode_dtype_delta["select:f32"] > 0  # the dropout mask is applied
    assert (compared.params.golden, compared.params.now) == (13, 13)


def test_more_layers_change_parameters_and_ops():
    d = _diff(ModelSpec(layers=2), ModelSpec(layers=4))
    assert d.verdict == "changed"
    assert d.changes[:2] == ["parameters", "ops"]
    assert {g.pattern: g.count for g in d.params_added} == {"state.layers_*.linear.kernel": 2,
                                                           "state.layers_*.linear.bias": 2}


def test_identical_and_text_diff_bound():
    spec = ModelSpec(dropout_rate=0.5)
    a = analyze(nnx_models.hlo_text(spec), "a")
    assert diff_modules(a, a).verdict == "identical"
    d = _diff(ModelSpec(layers=2), ModelSpec(layers=4), max_text_lines=10)
    assert len(d.text_diff) == 10 and d.text_diff_omitted > 0


COUNTER = '''HloModule m, entry_computation_layout={(f32[4]{0}, u32[]{:S(1)}, u32[2]{0})->(f32[4]{0}, u32[], u32[2]{0})}

ENTRY %main (w: f32[4], state__rngs____count___value.1: u32[], state__rngs____key___value.1: u32[2]) -> (f32[4], u32[], u32[2]) {
  %w = f32[4]{0} parameter(0)
  %state__rngs____count___value.1 = u32[] parameter(1)
  %state__rngs____key___value.1 = u32[2]{0} parameter(2)
  %one = u32[] constant(1)
  %inc = u32[] add(%state__rngs____count___value.1, %one)
  %two = f32[] constant(2)
  %b = f32[4]{0} broadcast(%two), dimensions={}
  %y = f32[4]{0} multiply(%w, %b)
  ROOT %out = (f32[4]{0}, u32[], u32[2]{0}) tuple(%y, %inc, %state__rngs____key___value.1)
}
'''
NO_COUNTER = '''HloModule m, entry_computation_layout={(f32[4]{0})->(f32[4]{0})}

ENTRY %main (w: f32[4]) -> (f32[4]) {
  %w = f32[4]{0} parameter(0)
  %two = f32[] constant(2)
  %b = f32[4]{0} broadcast(%two), dimensions={}
  %y = f32[4]{0} multiply(%w, %b)
  ROOT %out = (f32[4]{0}) tuple(%y)
}
'''


def test_count_increments_are_bookkeeping():
    """A carried stream's count is incremented every step (seed 000's 673 counter kernels): still RNG state."""
    d = diff_modules(analyze(NO_COUNTER, "fixed"), analyze(COUNTER, "leaky"))
    assert d.verdict == "rng-state-only"
    assert d.opcode_dtype_delta == {"add:u32": 1, "constant:u32": 1, "parameter:u32": 2}


def test_keys_read_beside_texts_that_show_no_draw_decide_whether_it_is_bookkeeping():
    """XLA's texts show no draw: the keys a stage read of the module jax handed XLA (``keys``) decide whether RNG state
    is all that differs. One side drawing from a key twice is no bookkeeping (issue 47, item 3)."""
    from hlo_audit.hlo.rng_keys import REUSED, KeyHazard, KeyReport

    old, new = analyze(NO_COUNTER, "fixed"), analyze(COUNTER, "leaky")
    drawn_twice = KeyHazard(REUSED, (("main", "a"), ("main", "b")), 2, False, (), (("main", "bernoulli"),) * 2)
    assert diff_modules(old, new, keys=(KeyReport(), KeyReport())).verdict == "rng-state-only"
    assert diff_modules(old, new, keys=(KeyReport((drawn_twice,)), KeyReport((drawn_twice,)))).verdict == \
        "rng-state-only"
    d = diff_modules(old, new, keys=(KeyReport(), KeyReport((drawn_twice,))))
    assert (d.verdict, d.changes) == ("changed", ["rng"])


def test_rng_used_by_the_model_is_a_change():
    drawn = COUNTER.replace("%y = f32[4]{0} multiply(%w, %b)",
                            "%c = f32[] convert(%state__rngs____count___value.1)\n"
                            "  %cb = f32[4]{0} broadcast(%c), dimensions={}\n"
                            "  %y = f32[4]{0} multiply(%w, %cb)")
    d = diff_modules(analyze(NO_COUNTER, "fixed"), analyze(drawn, "drawn"))
    assert d.verdict == "changed"


def test_layout_and_sharding_changes_are_named():
    relaid = NO_COUNTER.replace("%y = f32[4]{0} multiply", "%y = f32[4]{0:T(4)} multiply")
    assert diff_modules(analyze(NO_COUNTER), analyze(relaid)).changes == ["layouts"]
    sharded = NO_COUNTER.replace("%w = f32[4]{0} parameter(0)", "%w = f32[4]{0} parameter(0), sharding={replicated}")
    assert diff_modules(analyze(NO_COUNTER), analyze(sharded)).changes == ["shardings"]


def _drop_header_attribute(text: str, key: str) -> str:
    module = parse_module(text)
    value = module.header_attrs[key]
    header, rest = text.split("\n", 1)
    start = header.index(f", {key}=")
    assert header[start + len(key) + 3:].startswith(value)
    return header[:start] + header[start + len(key) + 3 + len(value):] + "\n" + rest


def test_default_entry_layout_added_is_no_change_without_rng():
    """Two modules with no RNG state, one spelling out the default entry layout: nothing changed."""
    text = nnx_models.hlo_text(ModelSpec(rngs=False, dropout_rate=None))
    assert not any(p.is_rng for p in analyze(text).params)
    bare = _drop_header_attribute(text, "entry_computation_layout")
    d = diff_modules(analyze(bare, "bare"), analyze(text, "with-layout"))
    assert d.verdict == "identical-after-normalization" and not d.differs


def test_no_rng_state_is_never_rng_state_only():
    """Stripping RNG state drops a mesh declaration nothing uses; without RNG state that is a real change."""
    text = nnx_models.hlo_text(ModelSpec(rngs=False, dropout_rate=None))
    header, rest = text.split("\n", 1)
    declared = header + ", frontend_attributes={xla.sdy.meshes={empty_mesh = #sdy.mesh<[]>}}\n" + rest
    d = diff_modules(analyze(text, "a"), analyze(declared, "b"))
    assert d.verdict == "changed" and d.changes == ["attributes"]


# Compiled, SPMD-partitioned modules, as XLA prints them after optimization: the header enumerates every entry
# parameter and output (aliases, layouts, propagation flags, PJRT's per-argument and per-result lists), and so
# does the ROOT tuple's sharding. REVERTED carries two never-drawn RNG streams between the weights, the step
# last (parameter 6, output 1); RELEASED is the same step without them. Every per-position value that is not
# RNG state differs from its neighbours (b's memory space, the step's propagation flag, the aliases' order),
# so a strip that drops or renumbers the wrong entry cannot come out equal.
COMPILED_REVERTED = """HloModule jit_train_step, is_scheduled=true, input_output_alias={ {0}: (0, {}, may-alias), {1}: (6, {}, may-alias), {2}: (1, {}, may-alias), {3}: (2, {}, may-alias), {4}: (3, {}, may-alias), {5}: (4, {}, may-alias), {6}: (5, {}, may-alias) }, entry_computation_layout={(f32[8]{0:T(256)}, u32[]{:T(128)}, u32[2]{0:T(128)}, f32[8]{0:T(256)}, u32[]{:T(128)}, /*index=5*/u32[2]{0:T(128)}, s32[]{:T(128)})->(f32[8]{0:T(256)}, s32[]{:T(128)}, u32[]{:T(128)}, u32[2]{0:T(128)}, f32[8]{0:T(256)}, /*index=5*/u32[]{:T(128)}, u32[2]{0:T(128)})}, allow_spmd_sharding_propagation_to_parameters={false,false,false,false,false,false,true}, allow_spmd_sharding_propagation_to_output={false,true,false,false,false,false,false}, num_partitions=4, frontend_attributes={arg_layout_modes="default;default;default;default;default;default;default",arg_memory_spaces="0;0;0;1;0;0;0",out_layout_modes="default;default;default;default;default;default;default",out_memory_spaces="0;0;0;0;1;0;0"}

ENTRY %main.12_spmd (param.0: f32[8], param.1: u32[], param.2: u32[2], param.3: f32[8], param.4: u32[], param.5: u32[2], param.6: s32[]) -> (f32[8], s32[], u32[], u32[2], f32[8], /*index=5*/u32[], u32[2]) {
  %param.0 = f32[8]{0:T(256)} parameter(0), metadata={op_name="state[\\'model\\'][\\'w\\'].value"}
  %param.1 = u32[]{:T(128)} parameter(1), metadata={op_name="state[\\'model\\'][\\'dropout\\'][\\'rngs\\'][\\'dropout\\'][\\'count\\'].value"}
  %param.2 = u32[2]{0:T(128)} parameter(2), metadata={op_name="state[\\'model\\'][\\'dropout\\'][\\'rngs\\'][\\'dropout\\'][\\'key\\'].value"}
  %param.3 = f32[8]{0:T(256)} parameter(3), metadata={op_name="state[\\'model\\'][\\'b\\'].value"}
  %param.4 = u32[]{:T(128)} parameter(4), metadata={op_name="state[\\'model\\'][\\'attention_op\\'][\\'rngs\\'][\\'params\\'][\\'count\\'].value"}
  %param.5 = u32[2]{0:T(128)} parameter(5), metadata={op_name="state[\\'model\\'][\\'attention_op\\'][\\'rngs\\'][\\'params\\'][\\'key\\'].value"}
  %param.6 = s32[]{:T(128)} parameter(6), metadata={op_name="state[\\'step\\'].value"}
  %copy.1 = u32[2]{0:T(128)} copy(%param.2)
  %constant.1 = s32[]{:T(128)} constant(1)
  %add.1 = s32[]{:T(128)} add(%param.6, %constant.1)
  %multiply.1 = f32[8]{0:T(256)} multiply(%param.0, %param.3)
  %add.2 = f32[8]{0:T(256)} add(%param.3, %multiply.1)
  ROOT %tuple.1 = (f32[8]{0:T(256)}, s32[]{:T(128)}, u32[]{:T(128)}, u32[2]{0:T(128)}, f32[8]{0:T(256)}, /*index=5*/u32[]{:T(128)}, u32[2]{0:T(128)}) tuple(%multiply.1, %add.1, %param.1, %copy.1, %add.2, /*index=5*/%param.4, %param.5), sharding={{devices=[4]<=[4]}, {maximal device=0}, {replicated}, {replicated}, {devices=[4]<=[4]}, {replicated}, {replicated}}
}
"""
COMPILED_RELEASED = """HloModule jit_train_step, is_scheduled=true, input_output_alias={ {0}: (0, {}, may-alias), {1}: (2, {}, may-alias), {2}: (1, {}, may-alias) }, entry_computation_layout={(f32[8]{0:T(256)}, f32[8]{0:T(256)}, s32[]{:T(128)})->(f32[8]{0:T(256)}, s32[]{:T(128)}, f32[8]{0:T(256)})}, allow_spmd_sharding_propagation_to_parameters={false,false,true}, allow_spmd_sharding_propagation_to_output={false,true,false}, num_partitions=4, frontend_attributes={arg_layout_modes="default;default;default",arg_memory_spaces="0;1;0",out_layout_modes="default;default;default",out_memory_spaces="0;0;1"}

ENTRY %main.12_spmd (param.0: f32[8], param.1: f32[8], param.2: s32[]) -> (f32[8], s32[], f32[8]) {
  %param.0 = f32[8]{0:T(256)} parameter(0), metadata={op_name="state[\\'model\\'][\\'w\\'].value"}
  %param.1 = f32[8]{0:T(256)} parameter(1), metadata={op_name="state[\\'model\\'][\\'b\\'].value"}
  %param.2 = s32[]{:T(128)} parameter(2), metadata={op_name="state[\\'step\\'].value"}
  %constant.1 = s32[]{:T(128)} constant(1)
  %add.1 = s32[]{:T(128)} add(%param.2, %constant.1)
  %multiply.1 = f32[8]{0:T(256)} multiply(%param.0, %param.1)
  %add.2 = f32[8]{0:T(256)} add(%param.1, %multiply.1)
  ROOT %tuple.1 = (f32[8]{0:T(256)}, s32[]{:T(128)}, f32[8]{0:T(256)}) tuple(%multiply.1, %add.1, %add.2), sharding={{devices=[4]<=[4]}, {maximal device=0}, {devices=[4]<=[4]}}
}
"""


def _edit(text: str, old: str, new: str, count: int = 1) -> str:
    assert text.count(old) == count, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


# Real changes to the released module that are not RNG state, and the kinds diff must name for each.
COMPILED_CHANGES = {
    "alias-of-b-dropped": (_edit(COMPILED_RELEASED, ", {2}: (1, {}, may-alias)", ""), ["attributes"]),
    "alias-of-b-must": (_edit(COMPILED_RELEASED, "{2}: (1, {}, may-alias)", "{2}: (1, {}, must-alias)"),
                        ["attributes"]),
    "step-propagation-flag": (_edit(COMPILED_RELEASED, "parameters={false,false,true}", "parameters={false,false,false}"),
                              ["attributes"]),
    "b-memory-space": (_edit(COMPILED_RELEASED, 'arg_memory_spaces="0;1;0"', 'arg_memory_spaces="0;0;0"'),
                       ["attributes"]),
    "step-s64": (_edit(COMPILED_RELEASED, "s32[]", "s64[]", count=8), ["parameters", "shapes"]),
}


@pytest.mark.parametrize("text", [COMPILED_REVERTED, COMPILED_RELEASED, *(t for t, _ in COMPILED_CHANGES.values())],
                         ids=["reverted", "released", *COMPILED_CHANGES])
def test_compiled_style_modules_are_what_xla_parses(text):
    assert our_counts(text) == xla_counts(text)


def test_compiled_rng_state_leaves_no_trace_in_header_or_root():
    """Seed 000's compiled TPU pairs in small: the two streams' four u32 parameters and outputs go from every
    per-position list of the header and the ROOT tuple, and what remains is renumbered as RELEASED numbers it."""
    reverted, released = analyze(COMPILED_REVERTED, "reverted"), analyze(COMPILED_RELEASED, "released")
    stripped, kept = strip_rng_state(reverted.module, reverted.params)
    assert [p.path for p in kept] == ["state.model.w", "state.model.b", "state.step"]
    assert stripped.header_attrs == released.module.header_attrs
    assert stripped.entry.root.attrs["sharding"] == released.module.entry.root.attrs["sharding"]
    compared = Structural.of_analyses(reverted, released)
    params = compared.params
    assert (compared.diff.verdict, compared.diff.changes) == ("rng-state-only", [])
    assert params.by_dtype == {"u32": -4} and params.by_role == {"rng_count": -2, "rng_key": -2}
    assert (params.golden, params.now) == (7, 3)
    assert diff_modules(released, reverted).verdict == "rng-state-only"


@pytest.mark.parametrize("changed,kinds", COMPILED_CHANGES.values(), ids=COMPILED_CHANGES)
def test_compiled_change_besides_rng_state_is_changed(changed, kinds):
    d = diff_modules(analyze(COMPILED_REVERTED, "reverted"), analyze(changed, "changed"))
    assert (d.verdict, d.changes) == ("changed", kinds)
    d = diff_modules(analyze(changed, "changed"), analyze(COMPILED_REVERTED, "reverted"))
    assert (d.verdict, d.changes) == ("changed", kinds)


# Two reductions whose reducers jax emits once per call site: identical bodies under two names.
TWO_REDUCERS = """HloModule jit_sums

region_0.1 {
  a.2 = f32[] parameter(0)
  b.3 = f32[] parameter(1)
  ROOT add.4 = f32[] add(a.2, b.3)
}

region_1.5 {
  a.6 = f32[] parameter(0)
  b.7 = f32[] parameter(1)
  ROOT add.8 = f32[] add(a.6, b.7)
}

ENTRY main.9 {
  x.10 = f32[4,8] parameter(0)
  zero.11 = f32[] constant(0)
  rows.12 = f32[4] reduce(x.10, zero.11), dimensions={1}, to_apply=region_0.1
  cols.13 = f32[8] reduce(x.10, zero.11), dimensions={0}, to_apply=region_1.5
  ROOT out.14 = (f32[4], f32[8]) tuple(rows.12, cols.13)
}
"""


def test_a_golden_text_against_its_raw_lowering_has_no_opcode_deltas():
    """The canonical text prints identical computations once; the raw module beside it holds both: the same
    program, so no op counts as added (they used to: add:f32 +1, parameter:f32 +2)."""
    raw = analyze(TWO_REDUCERS, "raw")
    assert xla_counts(TWO_REDUCERS)["computations"] == 3
    canonical = raw.normalized
    assert canonical.count("\n%region") == 1  # one reducer printed
    d = diff_modules(analyze(canonical, "golden"), raw)
    assert (d.verdict, d.opcode_dtype_delta) == ("identical-after-normalization", {})
    # A real change still counts: the second reducer multiplies, a computation of its own (its 2 parameters too).
    changed = TWO_REDUCERS.replace("ROOT add.8 = f32[] add(a.6, b.7)", "ROOT multiply.8 = f32[] multiply(a.6, b.7)")
    d = diff_modules(analyze(canonical, "golden"), analyze(changed, "new"))
    assert d.verdict == "changed" and d.opcode_dtype_delta == {"multiply:f32": 1, "parameter:f32": 2}


# Kinds of change, each built from real lowerings: jax's own steps for an abstract 4-device mesh (nothing runs), one
# thing changed at a time. Every kind compares like with like: a computation only one side has is ops and shapes,
# never the shardings of what it shares a shape with elsewhere.
MESH = AbstractMesh((4,), ("x",))


def _arg(shape, spec=PartitionSpec()):
    return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(MESH, spec))


def _lowered(f, state_key: str = "w", weight_spec=PartitionSpec(), bias: bool = False):
    state = {state_key: _arg((8, 8), weight_spec)} | ({"b": _arg((8,))} if bias else {})
    args = (state, _arg((4, 8)))
    return analyze(hlo_text(jax.jit(f).trace(*args).lower(lowering_platforms=("cpu",))), f.__name__)


def _two_columns(state, x):
    return jnp.tanh(x[:, :2] @ state["w"][:2])


def _three_columns(state, x):
    return jnp.tanh(x[:, :3] @ state["w"][:3])


def _sine(state, x):
    return jnp.sin(x[:, :2] @ state["w"][:2])


def _renamed(state, x):
    return jnp.tanh(x[:, :2] @ state["v"][:2])


def _biased(state, x):
    return jnp.tanh(x[:, :2] @ state["w"][:2] + state["b"])


def _scaled_sine(x):
    return jnp.sin(x) * 2.0


def _nested(state, x):
    return jax.jit(_scaled_sine)(x @ state["w"]) + 1.0


def _inlined(state, x):
    return _scaled_sine(x @ state["w"]) + 1.0


KINDS = {
    "shapes": (lambda: _lowered(_three_columns), ["shapes"]),  # a slice of three columns, not two
    "ops": (lambda: _lowered(_sine), ["ops"]),  # sine for tanh: same shapes
    "shardings": (lambda: _lowered(_two_columns, weight_spec=PartitionSpec(None, "x")), ["shardings"]),
    "parameters": (lambda: _lowered(_biased, bias=True), ["parameters", "ops", "shapes"]),  # a bias added
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_change_from_real_lowerings(kind):
    base = _lowered(_two_columns)
    build, kinds = KINDS[kind]
    changed = build()
    for old, new in ((base, changed), (changed, base)):
        d = diff_modules(old, new)
        assert (d.verdict, d.changes) == ("changed", kinds)


def test_a_renamed_weight_is_renamed_only_and_listed():
    """state.w renamed state.v (and the function with it): the same program, verdict renamed-only, exit 0 (`differs`
    is False), the rename named; both ways."""
    base, renamed = _lowered(_two_columns), _lowered(_renamed, state_key="v")
    for old, new, (before, after) in ((base, renamed, ("w", "v")), (renamed, base, ("v", "w"))):
        d = diff_modules(old, new)
        assert (d.verdict, d.changes, d.differs) == ("renamed-only", [], False)
        renames = [c for c in d.named if c.kind is ChangeKind.RENAME]
        assert [(c.before, c.after, c.count) for c in renames] == [(before, after, 1)]
        assert renames[0].groups == ((f"state.{before} -> state.{after}", 1),)
        assert d.params_added == d.params_removed == []  # the renames are named, not added and removed
        assert {c.kind for c in d.named} == {ChangeKind.RENAME, ChangeKind.HEADER}  # the module's name too
    # A rename beside a real change is a change, the rename still named.
    d = diff_modules(base, _lowered(_sine_renamed, state_key="v"))
    assert d.verdict == "changed" and any(c.kind is ChangeKind.RENAME for c in d.named)


def _sine_renamed(state, x):
    return jnp.sin(x[:, :2] @ state["v"][:2])


def test_a_computation_one_side_lacks_is_ops_and_shapes_not_shardings():
    """A nested jit against the same code inlined: the callee's unsharded f32[4,8] parameter has no partner on the
    other side. Compared as sets per opcode and shape across all computations it met the entry's replicated ones,
    and diff said shardings."""
    nested, inlined = _lowered(_nested), _lowered(_inlined)
    callee = next(c for c in nested.module.computations.values() if c.parameters and not c.is_entry
                  and any(i.opcode == "sine" for i in c.instructions))
    assert [p.attrs.get("sharding") for p in callee.parameters] == [None]
    assert {p.attrs.get("sharding") for p in nested.module.entry.parameters} == {"{replicated}"}
    assert callee.parameters[0].shape.text in {p.shape.text for p in nested.module.entry.parameters}  # x: f32[4,8]
    for old, new in ((nested, inlined), (inlined, nested)):
        d = diff_modules(old, new)
        assert (d.verdict, d.changes) == ("changed", ["ops", "shapes"])
