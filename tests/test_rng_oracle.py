"""The numerical RNG oracle (tests/rng_oracle.py) checked against itself, hand-made steps, and analyze().

The oracle is the ground truth the RNG dataflow analysis is tested against, so it is tested first: on tiny
jitted steps whose answer is known by construction (including steps that draw from a key only in a way that
cancels or only into the stream's own state), on the small NNX models, on steps that hand their RNG state through
each of XLA's pass-through constructs, and on MaxText's real train step. The MaxText cases execute the step once
per RNG stream (~3 minutes on the 2-core CI machine), so they are `long` tests (make test-long, run by .ci/run
after make test); the NNX cases, through the same constructs, are in make test.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rng_constructs
import rng_oracle
from nnx_models import ModelSpec, spec_name
from rng_oracle import OracleCase, nnx_case, stream_effects, stream_truth

# One worker builds each oracle case once (they are cached per process); the MaxText cases get their own group
# so they run beside, not after, the maxtext matrix tests.
pytestmark = pytest.mark.xdist_group("nnx_oracle")

# --------------------------------------------------------------------------------------------------------------
# The generic oracle on hand-made steps whose answer is known
# --------------------------------------------------------------------------------------------------------------


def _stream(seed, shape=()):
    key = jax.random.key(seed)
    if shape:
        key = jax.random.split(key, shape)
    return {"key": key, "count": jnp.zeros(shape, jnp.uint32)}


def _hand_state():
    return {
        "used": {"rngs": _stream(1)},
        "unused": {"rngs": _stream(2)},
        "own_only": {"rngs": _stream(3)},  # its key only feeds its own key in the new state
        "stacked": {"rngs": _stream(4, (3,))},  # scanned-style u32[3,2] key, u32[3] count
        "w": jnp.ones((4,), jnp.float32),
    }


def _hand_step(state, x):
    new = jax.tree.map(lambda a: a, state)
    for name in ("used", "unused", "own_only", "stacked"):
        new[name]["rngs"]["count"] = state[name]["rngs"]["count"] + 1
    noise = jax.random.normal(jax.random.fold_in(state["used"]["rngs"]["key"], state["used"]["rngs"]["count"]), (4,))
    stacked = jax.vmap(lambda k: jax.random.uniform(k))(state["stacked"]["rngs"]["key"])
    new["own_only"]["rngs"]["key"] = jax.random.split(state["own_only"]["rngs"]["key"])[0]
    new["w"] = state["w"] - 0.1 * x * noise + stacked[1]
    return new, jnp.sum(new["w"])


def test_hand_made_step_truth():
    step = jax.jit(_hand_step, donate_argnums=0)
    truth = stream_truth(step, (_hand_state(), jnp.ones((4,), jnp.float32)))
    assert truth == {
        "state.used.rngs": True,
        "state.unused.rngs": False,
        "state.own_only.rngs": False,
        "state.stacked.rngs": True,
    }


def test_hand_made_step_effects_name_the_changed_outputs():
    step = jax.jit(_hand_step)
    effects = stream_effects(step, (_hand_state(), jnp.ones((4,), jnp.float32)))
    assert effects["state.used.rngs"] == ("out[0].w", "out[1]")
    assert effects["state.own_only.rngs"] == ()


def test_own_key_is_excluded_only_in_the_state_output():
    """A step that returns its key through a second output is using it: that output is compared."""

    def step(state, x):
        return dict(state, rngs=dict(state["rngs"], count=state["rngs"]["count"] + 1)), jax.random.key_data(
            state["rngs"]["key"]
        )

    args = ({"rngs": _stream(0), "w": jnp.ones(())}, jnp.ones(()))
    assert stream_truth(jax.jit(step), args) == {"state.rngs": True}
    # Returned unchanged as the new state only: not used. Returned twice: the second copy is an effect.
    assert stream_truth(jax.jit(lambda state, x: (state, x)), args) == {"state.rngs": False}
    assert stream_truth(jax.jit(lambda state, x: (state, state)), args) == {"state.rngs": True}
    assert stream_truth(jax.jit(lambda state, x: (x, state)), args, state_outputs={0: 1}) == {"state.rngs": False}


def test_raw_u32_keys_with_a_count_are_streams():
    def step(state, x):
        bits = jax.random.bits(jax.random.wrap_key_data(state["rngs"]["key"]), (2,))
        return dict(state, w=state["w"] + bits.astype(jnp.float32)), x

    state = {"rngs": {"key": jax.random.key_data(jax.random.key(0)), "count": jnp.zeros((), jnp.uint32)},
             "w": jnp.zeros((2,))}
    assert stream_truth(jax.jit(step), (state, jnp.ones(()))) == {"state.rngs": True}


def test_arg_names_name_the_stream_paths():
    step = jax.jit(lambda s, x: (s, x))
    truth = stream_truth(step, ({"rngs": _stream(0)}, jnp.ones(())), arg_names=("train_state", "batch"))
    assert truth == {"train_state.rngs": False}


def test_non_deterministic_step_is_rejected():
    calls = []

    def step(state, x):  # not jitted: a Python side effect makes two runs differ
        calls.append(1)
        return state, jnp.asarray(len(calls), jnp.float32)

    with pytest.raises(AssertionError, match="not deterministic"):
        stream_truth(step, ({"rngs": _stream(0)}, jnp.ones(())))


def test_replacement_changes_every_element_of_a_stacked_key():
    key = jax.random.split(jax.random.key(0), (5,))
    new = rng_oracle._replacement(key)
    assert new.shape == key.shape and new.dtype == key.dtype
    assert np.all(np.any(np.asarray(jax.random.key_data(new)) != np.asarray(jax.random.key_data(key)), axis=-1))


# --------------------------------------------------------------------------------------------------------------
# Small NNX models
# --------------------------------------------------------------------------------------------------------------

NNX_SPECS = rng_oracle.nnx_specs()


@functools.cache
def _nnx(spec: ModelSpec) -> OracleCase:
    return nnx_case(spec)


def _expected_nnx(spec: ModelSpec, stream: str) -> bool:
    """What each stream of nnx_models' steps does, by construction of the models."""
    if stream in ("state.rngs.params", "state.rngs.dropout"):
        return False  # the top-level Rngs is never drawn in the step
    if stream.endswith(".dropout.rngs"):
        return bool(spec.dropout_rate)  # nnx.Dropout draws only at rate > 0
    if stream.endswith(".to_nnx__rngs.dropout"):
        return spec.bridge == "draws"  # LinenDraws calls make_rng('dropout')
    if stream.endswith(".to_nnx__rngs.params"):
        return False  # ToNNX pulls a params key on each call; apply never uses it
    raise AssertionError(f"unexpected stream {stream}")


# The three slowest (a linen module bridged into NNX, ~35 of the family's 57 worker-seconds) are `long` (make test's
# 15 minutes); a bridged case that draws and one that does not stay in make test.
LONG_NNX = ("L2_bridge-draws", "L3_scan_bridge-draws", "L2_drop0.5_bridge-nodraw")


@pytest.mark.parametrize("spec", [
    pytest.param(s, id=spec_name(s), marks=[pytest.mark.long] if spec_name(s) in LONG_NNX else []) for s in NNX_SPECS])
def test_nnx_case_streams_match_analyze_and_truths(spec):
    case = _nnx(spec)
    assert case.truth, "every spec here has RNG state"
    assert set(case.truth) == case.stream_params()
    assert case.arg_keys is not None
    assert case.truth == {stream: _expected_nnx(spec, stream) for stream in case.truth}


def test_nnx_dropout_half_draws_and_top_level_rngs_do_not():
    case = _nnx(ModelSpec(layers=2, dropout_rate=0.5))
    assert case.truth == {
        "state.layers_0.dropout.rngs": True,
        "state.layers_1.dropout.rngs": True,
        "state.rngs.dropout": False,
        "state.rngs.params": False,
    }
    # The draw reaches the loss and every earlier layer's gradient.
    assert "out[1]" in case.effects["state.layers_1.dropout.rngs"]
    assert "out[0].layers_0.linear.kernel" in case.effects["state.layers_1.dropout.rngs"]


def test_nnx_scanned_stream_is_one_stacked_stream():
    case = _nnx(ModelSpec(layers=3, scan=True, dropout_rate=0.5))
    assert case.truth == {"state.layers.dropout.rngs": True, "state.rngs.dropout": False, "state.rngs.params": False}
    key = [p for p in rng_oracle.analyze(case.text, "<t>", case.arg_keys).params
           if p.path == "state.layers.dropout.rngs.key"]
    assert [tuple(p.shape.dims) for p in key] == [(3, 2)]


# --------------------------------------------------------------------------------------------------------------
# MaxText's real train step, tiny, executed on the CPU
# --------------------------------------------------------------------------------------------------------------


@functools.cache
def _maxtext(name: str) -> OracleCase:
    return rng_oracle.maxtext_case(name)


def _maxtext_kind(stream: str) -> str:
    """``...layers_0.mlp.wi_0.AqtDotGeneral_0.to_nnx__rngs.params`` -> ``AqtDotGeneral_0.to_nnx__rngs.params``."""
    return ".".join(stream.split(".")[-3:])


# Which kinds of stream each MaxText case holds and which of them the step draws from, as measured. AQT's
# AqtDotGeneral draws its stochastic-rounding key from the 'params' stream (prng_name='params'), so the
# ToNNX fork's 'params' key is used and its 'aqt' and 'dropout' keys are not; MaxText's own Dropout draws at
# rate > 0; the attention's Rngs and the scanned decoder's Rngs are never drawn.
STREAMS = ("params", "aqt", "dropout")
# Each quantized dot's ToNNX fork: AQT's AqtDotGeneral draws from 'params' only.
AQT = {"AqtDotGeneral_0.to_nnx__rngs.params": True, "AqtDotGeneral_0.to_nnx__rngs.aqt": False,
       "AqtDotGeneral_0.to_nnx__rngs.dropout": False}


def never_drawn(owner: str) -> dict[str, bool]:
    """An Rngs (``<owner>.rngs``) whose three streams the step never draws from."""
    return {f"{owner}.rngs.{stream}": False for stream in STREAMS}


MAXTEXT_EXPECTED = {
    "maxtext_int8_unrolled": {**AQT, **never_drawn("self_attention")},
    "maxtext_int8_unrolled_dropout": {**AQT, **never_drawn("attention_op"), **never_drawn("dropout"),
                                      "dropout.rngs.dropout": True},
    "maxtext_none_unrolled": never_drawn("self_attention"),
    "maxtext_int8_scan": {**AQT, **never_drawn("self_attention"), **never_drawn("decoder")},
}


@pytest.mark.maxtext
@pytest.mark.xdist_group("maxtext_oracle")
@pytest.mark.long
@pytest.mark.parametrize("name", list(rng_oracle.MAXTEXT_CASES))
def test_maxtext_case_streams_match_analyze(name):
    case = _maxtext(name)
    assert set(case.truth) == case.stream_params()
    assert case.arg_keys is not None


@pytest.mark.maxtext
@pytest.mark.xdist_group("maxtext_oracle")
@pytest.mark.long
@pytest.mark.parametrize("name", list(rng_oracle.MAXTEXT_CASES))
def test_maxtext_case_truths(name):
    case = _maxtext(name)
    by_kind: dict[str, set[bool]] = {}
    for stream, used in case.truth.items():
        by_kind.setdefault(_maxtext_kind(stream), set()).add(used)
    assert by_kind == {kind: {used} for kind, used in MAXTEXT_EXPECTED[name].items()}


@pytest.mark.maxtext
@pytest.mark.xdist_group("maxtext_oracle")
@pytest.mark.long
def test_maxtext_int8_unrolled_stream_count():
    case = _maxtext("maxtext_int8_unrolled")
    # 2 layers x 7 AQT dots (query key value out wi_0 wi_1 wo) x 3 streams, plus the attention's 3: one Rngs
    # object shared by every layer's attention, so NNX's state holds it once, under its first path (layers_0).
    assert len(case.truth) == 2 * 7 * 3 + 3
    assert [s for s in case.truth if ".self_attention.rngs." in s] == [
        f"state.model.decoder.layers_0.self_attention.rngs.{stream}" for stream in ("aqt", "dropout", "params")
    ]
    assert sum(case.truth.values()) == 2 * 7
    # A drawn AQT key reaches the loss (metrics) and the weights' updates.
    effects = case.effects["state.model.decoder.layers_1.mlp.wo.AqtDotGeneral_0.to_nnx__rngs.params"]
    assert "out[0].model.decoder.layers_1.mlp.wo.kernel" in effects
    assert any(e.startswith("out[1].") for e in effects)


@pytest.mark.maxtext
@pytest.mark.xdist_group("maxtext_oracle")
@pytest.mark.long
def test_maxtext_case_is_the_program_the_tool_lowers():
    """The oracle's executed step has the entry parameters of hlo_audit's own lowering of the same config."""
    from hlo_audit.targets.maxtext import lower_train_step

    name = "maxtext_int8_unrolled"
    case = _maxtext(name)
    scan, quant, layers, extra = rng_oracle.MAXTEXT_CASES[name]
    lowered = lower_train_step(
        rng_oracle.MAXTEXT_MODEL, scan_layers=scan, quantization=quant, num_layers=layers,
        max_target_length=rng_oracle.MAXTEXT_SEQ, overrides={**rng_oracle.MAXTEXT_TINY, **extra},
    )
    from hlo_audit.attribution import arg_keys

    tool = rng_oracle.analyze(lowered.as_text(dialect="hlo"), "<tool>", arg_keys(lowered)).params
    mine = rng_oracle.analyze(case.text, "<oracle>", case.arg_keys).params
    assert [(p.path, p.shape.text, p.role) for p in mine] == [(p.path, p.shape.text, p.role) for p in tool]


def test_nnx_case_text_is_the_text_nnx_models_lowers():
    """The executed step (real state) lowers to the very text the other tests analyze (abstract state)."""
    import nnx_models

    spec = ModelSpec(layers=2, dropout_rate=0.5, bridge="nodraw")
    assert _nnx(spec).text == nnx_models.lower(spec).as_text(dialect="hlo")


# --------------------------------------------------------------------------------------------------------------
# The analysis against the oracle: every stream of every case, drawn <=> the oracle saw an effect
# --------------------------------------------------------------------------------------------------------------


def _disagreements(case: OracleCase) -> dict[str, tuple]:
    """Stream -> what the HLO analysis said, for every stream where it disagrees with the oracle: the verdict
    (drawn <=> some other output changed with the key) or the count increments per step (measured: new - old)."""
    report = rng_oracle.analyze(case.text, case.name, case.arg_keys).rng
    assert report.increments_exact
    streams = {s.path: s for s in report.streams}
    assert set(streams) == set(case.truth) and set(case.increments) <= set(streams)
    wrong = {path: (streams[path].verdict, streams[path].where) for path, used in case.truth.items()
             if streams[path].verdict != ("drawn" if used else "carried")}
    wrong.update({path: ("increments", streams[path].increments, "measured", n)
                  for path, n in case.increments.items() if streams[path].increments != n})
    return wrong


@pytest.mark.parametrize("spec", NNX_SPECS, ids=[spec_name(s) for s in NNX_SPECS])
def test_analysis_agrees_with_the_oracle_on_nnx_models(spec):
    assert _disagreements(_nnx(spec)) == {}


@pytest.mark.maxtext
@pytest.mark.xdist_group("maxtext_oracle")
@pytest.mark.long
@pytest.mark.parametrize("name", list(rng_oracle.MAXTEXT_CASES))
def test_analysis_agrees_with_the_oracle_on_maxtext(name):
    assert _disagreements(_maxtext(name)) == {}


# --------------------------------------------------------------------------------------------------------------
# RNG state through XLA's pass-through constructs (tests/rng_constructs.py)
# --------------------------------------------------------------------------------------------------------------

CONSTRUCT_SPECS = [rng_constructs.StepSpec(c, r) for c in rng_constructs.CONSTRUCTS for r in ("shared", "private+idle")]


@functools.cache
def _construct(spec) -> OracleCase:
    return rng_oracle.construct_case(spec)


@pytest.mark.parametrize("spec", CONSTRUCT_SPECS, ids=[s.name for s in CONSTRUCT_SPECS])
def test_analysis_agrees_with_the_oracle_through_constructs(spec):
    """Every stream drawn or carried as running the step says, through an opt-barrier (remat's and a hand-written
    one), loop state, branch operands and results, and nested jit; the idle stream carried beside drawn ones, each
    counter advanced as measured. One exception, below: a count that remat recomputes."""
    case = _construct(spec)
    assert set(case.truth.values()) == ({True, False} if spec.rngs == "private+idle" else {True})
    wrong = _disagreements(case)
    if spec.construct == "remat" and spec.rngs == "shared":
        assert wrong == {"state.rngs": ("increments", 6, "measured", 4)}
    else:
        assert wrong == {}


def test_remat_recomputes_the_count_a_second_draw_reads():
    """Shared-stream remat: the second dropout of a layer draws from ``count + 1``, which the backward pass
    recomputes from the count it reads back from the opt-barrier: one more counter kernel per layer than the step
    advances the count by. The analysis counts increments executed (each a kernel, as seed 000 measured them):
    4 advances and 2 recomputations; with one stream per dropout nothing is recomputed."""
    shared = rng_oracle.analyze(_construct(rng_constructs.StepSpec("remat", "shared")).text, "remat").module
    backward_increments = [i for i in shared.entry.instructions if i.opcode == "add" and i.shape.dtype == "u32"
                           and any(shared.entry.by_name[o].opcode == "get-tuple-element" and
                                   shared.entry.by_name[shared.entry.by_name[o].operands[0]].opcode == "opt-barrier"
                                   for o in i.operands)]
    assert len(backward_increments) == rng_constructs.LAYERS
    private = _construct(rng_constructs.StepSpec("remat", "private+idle"))
    assert _disagreements(private) == {}
