"""Entry parameters: state paths from three independent sources agree; roles and groups."""

from __future__ import annotations

import pytest

import nnx_models
from hlo_audit.hlo.params import (
    classify,
    collapse_layers,
    entry_params,
    group_pattern,
    path_from_keystr,
    path_from_mangled_name,
)
from hlo_audit.hlo.source import pick_dump_module
from hlo_audit.hlo.text import parse_file, parse_module, parse_shape
from nnx_models import ModelSpec


def test_mangled_names_and_dump_metadata_give_the_same_paths(dump_folder):
    """jax text only has mangled names; the dump has op_name metadata. Both decode to one path."""
    from_names = [p.path for p in entry_params(parse_module(nnx_models.hlo_text(ModelSpec(dropout_rate=0.5))))]
    dump = parse_file(pick_dump_module(dump_folder))
    assert all('op_name="' in p.attrs["metadata"] for p in dump.entry.parameters)
    from_metadata = [p.path for p in entry_params(dump)]
    assert from_names == from_metadata
    assert "state.layers_0.dropout.rngs.key" in from_names
    assert from_names[-1] == "x"


@pytest.mark.parametrize("spec", [ModelSpec(layers=4, dropout_rate=0.5), ModelSpec(bridge="nodraw"),
                                  ModelSpec(scan=True, dropout_rate=0.0), ModelSpec(rngs=False)],
                         ids=nnx_models.spec_name)
def test_roles_match_the_model_state(spec):
    params = entry_params(parse_module(nnx_models.hlo_text(spec)))
    expected = nnx_models.expected_counts(spec)
    roles = [p.role for p in params]
    assert roles.count("rng_key") == expected["rng_keys"]
    assert roles.count("rng_count") == expected["rng_counts"]
    assert roles.count("input") == 1  # x
    assert roles.count("weight") == expected["f32"] - 1
    assert all(p.dtype == "u32" for p in params if p.is_rng)


def test_paths_decoded_from_names():
    name = ("state__model____decoder____layers_3____mlp____wi_0____AqtDotGeneral_0____to_nnx__rngs____aqt"
            "____key___value.2")
    assert path_from_mangled_name(name) == (
        "state.model.decoder.layers_3.mlp.wi_0.AqtDotGeneral_0.to_nnx__rngs.aqt.key")
    assert path_from_mangled_name("x.1") == "x"
    assert path_from_mangled_name("state__opt_state___0___mu__") == "state.opt_state.0.mu"


def test_paths_from_keystr():
    assert path_from_keystr(r"state[\'layers_0\'][\'rngs\'][\'count\'].value") == "state.layers_0.rngs.count"
    assert path_from_keystr("data['inputs']") == "data.inputs"
    assert path_from_keystr("jit(f)/add") is None  # an op_name that is no key path


def test_groups_fold_rng_streams_and_layer_indices():
    path = "state.model.decoder.layers_31.mlp.wi_0.AqtDotGeneral_0.to_nnx__rngs.aqt.count"
    assert group_pattern(path) == "state.model.decoder.layers_*.mlp.wi_0.AqtDotGeneral_0.to_nnx__rngs.*"
    assert group_pattern("state.model.decoder.layers_3.mlp.wi_0.kernel") == (
        "state.model.decoder.layers_*.mlp.wi_0.kernel")
    assert collapse_layers("params.layers.3.kernel") == "params.layers.*.kernel"
    assert collapse_layers("params.wi_0.kernel") == "params.wi_0.kernel"


@pytest.mark.parametrize("path,shape,role", [
    ("state.model.decoder.layers_0.self_attention.rngs.aqt.key", "u32[2]", "rng_key"),
    ("state.model.decoder.layers_0.self_attention.rngs.aqt.count", "u32[]", "rng_count"),
    ("state.layers.dropout.rngs.count", "u32[4]", "rng_count"),  # scanned: stacked counts
    ("state.model.decoder.layers_0.mlp.wi_0.kernel", "f32[8,8]", "weight"),
    ("state.optimizer.opt_state.0.mu.decoder.layers_0.mlp.wi_0.kernel", "f32[8,8]", "optimizer_state"),
    ("state.optimizer.opt_state.0.count", "s32[]", "optimizer_state"),
    ("state.optimizer.step", "u32[]", "step"),
    ("data.inputs", "s32[1,128]", "input"),
    ("state.model.decoder.some_int_buffer", "s32[4]", "other"),
])
def test_roles(path, shape, role):
    assert classify(path, parse_shape(shape)) == role


@pytest.mark.parametrize("path,shape,kind,role", [
    # Kinds as attribution records them from MaxText's and the held-RNG models' lowerings (test_state_types).
    ("model.cell_0.noise_source.default.key", "u32[2]", "nnx.RngKey", "rng_key"),
    ("model.cell_0.noise_source.default.count", "u32[]", "nnx.RngCount", "rng_count"),
    ("seed", "u32[2]", "prng_key", "rng_key"),
    ("state.optimizer.step", "u32[]", "nnx.OptState", "step"),
    ("state.optimizer.opt_state.0.count", "s32[]", "nnx.OptArray", "optimizer_state"),
    ("adam.0.count", "s32[]", "optax.ScaleByAdamState", "optimizer_state"),
    ("net.norm.mean", "f32[8]", "nnx.BatchStat", "batch_stat"),
    ("net.last", "f32[4,8]", "nnx.Cache", "cache"),
    ("ts.params.w", "f32[8,8]", "TrainState.params", "weight"),
    # A type not in the table (fp8's bridged Linen collection) leaves the role to names, as the goldens have it.
    ("state.model.decoder.layers_0.mlp.wi_0.Fp8DirectDotGeneralOp_0.input_amax_history", "f32[1024]",
     "nnx.Variable:_overwrite_with_gradient", "weight"),
])
def test_roles_by_kind(path, shape, kind, role):
    assert classify(path, parse_shape(shape), kind) == role
