"""Verdicts of the semantic diff on real lowerings and on targeted edits."""

from __future__ import annotations

import pytest

import nnx_models
from nnx_models import ModelSpec
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.diff import diff_modules
from hlo_audit.hlo.text import parse_module


def _diff(old_spec: ModelSpec, new_spec: ModelSpec, **kw):
    return diff_modules(analyze(nnx_models.hlo_text(old_spec), "old"), analyze(nnx_models.hlo_text(new_spec), "new"),
                        **kw)


@pytest.mark.parametrize("old,new,pattern,count", [
    (ModelSpec(layers=4), ModelSpec(layers=4, dropout_rate=0.0), "state.layers_*.dropout.rngs.*", 8),
    (ModelSpec(scan=True), ModelSpec(scan=True, dropout_rate=0.0), "state.layers.dropout.rngs.*", 2),
    (ModelSpec(rngs=False), ModelSpec(), "state.rngs.*", 4),
], ids=["unrolled-dropout0", "scanned-dropout0", "model-rngs"])
def test_leaked_rng_state_is_rng_state_only(old, new, pattern, count):
    d = _diff(old, new)
    assert d.verdict == "rng-state-only" and d.differs
    assert d.by_dtype_delta == {"u32": count}
    assert d.by_role_delta == {"rng_count": count // 2, "rng_key": count // 2}
    assert {(g.role, g.dtype, g.pattern, g.count) for g in d.params_added} == {
        ("rng_key", "u32", pattern, count // 2), ("rng_count", "u32", pattern, count // 2)}
    assert d.params_removed == []
    # And the other way round: the fix removes exactly those.
    back = _diff(new, old)
    assert back.verdict == "rng-state-only"
    assert sum(g.count for g in back.params_removed) == -count


def test_drawing_dropout_is_a_real_change():
    d = _diff(ModelSpec(dropout_rate=0.0), ModelSpec(dropout_rate=0.5))
    assert d.verdict == "changed"
    assert "ops" in d.changes
    assert d.opcode_dtype_delta["select:f32"] > 0  # the dropout mask is applied
    assert d.entry_params == (13, 13)


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
