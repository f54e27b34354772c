"""State a step captures as constants, on small real jax programs: what the module shows (constants, large ones,
literal RNG keys), what the trace shows (captured arrays and their paths), and how the gate and diff see it
when that state moves into the step's arguments. MaxEngine's own steps: test_maxengine.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from typer.testing import CliRunner

from hlo_audit.capture import captured_arrays, hlo_dtype
from hlo_audit.cli import app
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.constants import LARGE_CONSTANT_BYTES, frozen_rng, golden_summary
from hlo_audit.hlo.diff import captured_delta, diff_modules
from hlo_audit.targets.base import hlo_text

WIDTH = 1024  # an int8 [1024, 1024] weight is exactly LARGE_CONSTANT_BYTES


class Frozen(nnx.Variable):
    """Kept outside nnx.Param, as AQT's serve mode keeps its pre-quantized weights (qrhs.frozen)."""


class Decoder(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, real_weights: bool):
        values = np.random.default_rng(0).integers(-127, 128, (WIDTH, WIDTH)) if real_weights else 0
        self.embed = nnx.Param(jnp.ones((8, WIDTH)))
        self.qvalue = Frozen(jnp.zeros((WIDTH, WIDTH), jnp.int8) + jnp.asarray(values, jnp.int8))
        self.scale = Frozen(jnp.full((1, WIDTH), 0.5, jnp.bfloat16))
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        h = x @ self.embed
        h = (h.astype(jnp.int8) @ self.qvalue[...]).astype(jnp.bfloat16) * self.scale[...]
        return self.dropout(h.astype(jnp.float32))


def lowered_step(real_weights: bool = False, rest_as_argument: bool = False):
    """A decode step as MaxEngine writes it: params in, the rest of the model state closed over (or passed in);
    merged with copy=True, as MaxEngine merges, since the closed-over Variables outlive the trace."""
    model = Decoder(nnx.Rngs(0, dropout=1), real_weights)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
    x = jax.ShapeDtypeStruct((2, 8), jnp.float32)
    if rest_as_argument:
        traced = jax.jit(lambda params, rest, x: nnx.merge(graphdef, params, rest, copy=True)(x)).trace(abstract, rest, x)
    else:
        traced = jax.jit(lambda params, x: nnx.merge(graphdef, params, rest, copy=True)(x)).trace(abstract, x)
    return traced, rest


@pytest.fixture(scope="module")
def closed_over():
    traced, rest = lowered_step()
    return traced, rest, analyze(hlo_text(traced.lower()), "closed-over", captured=captured_arrays(traced, {"model": rest}))


def test_captured_arrays_are_named_by_the_state_tree_they_come_from(closed_over):
    _, _, analysis = closed_over
    captured = {a.path: a for a in analysis.captured}
    assert sorted(captured) == ["model.dropout.rngs.count", "model.dropout.rngs.key", "model.qvalue", "model.scale"]
    assert (captured["model.qvalue"].dtype, captured["model.qvalue"].dims) == ("s8", (WIDTH, WIDTH))
    assert captured["model.dropout.rngs.key"].dims == (2,)  # a typed key, as the u32 data the HLO holds
    assert {a.path: a.role for a in analysis.captured} == {
        "model.qvalue": "weight", "model.scale": "weight", "model.dropout.rngs.key": "rng_key",
        "model.dropout.rngs.count": "rng_count"}
    # The step takes only what it was given: one Param and x.
    assert analysis.summary.entry_params == 2


def test_placeholder_weights_are_a_scalar_broadcast_and_the_dropout_key_a_literal(closed_over):
    _, _, analysis = closed_over
    report = analysis.constants.to_record()
    (large,) = report["large"]
    assert (large["form"], large["dtype"], large["dims"], large["value"]) == ("broadcast", "s8", [WIDTH, WIDTH], "0")
    assert large["bytes"] == LARGE_CONSTANT_BYTES and large["paths"] == ["model.qvalue"]
    frozen = frozen_rng(report)
    assert frozen["literal_keys"] == 1 and frozen["captured_streams"] == {"model.dropout.rngs.*": 1}
    assert "threefry" in frozen["sites"][0]
    assert report["captured"]["bytes_by_dtype"] == {"bf16": 2 * WIDTH, "s8": WIDTH * WIDTH, "u32": 12}


def test_real_weights_print_elided_and_xla_reads_them_back():
    traced, _ = lowered_step(real_weights=True)
    lowered = traced.lower()
    full, elided = lowered.as_text(dialect="hlo"), hlo_text(lowered)
    assert len(full) > 3 * WIDTH * WIDTH > 100 * len(elided)  # every weight printed, then none of them
    assert f"s8[{WIDTH},{WIDTH}]{{1,0}} constant({{...}})" in elided
    from jax._src.lib import hlo  # XLA's own parser: the oracle for what HLO text is

    assert "constant({...})" in hlo.hlo_module_from_text(elided).to_string()
    (large,) = analyze(elided).constants.large
    assert (large.form, large.shape.bytes) == ("literal", WIDTH * WIDTH)


def test_dead_and_empty_arrays_are_not_captured():
    unused, empty = jnp.ones((4,)), jnp.zeros((0,), jnp.int32)
    traced = jax.jit(lambda x: x + 1 + empty.sum()).trace(jnp.ones((4,)))
    assert captured_arrays(traced, {"unused": unused}) == ()
    assert hlo_dtype(jnp.bfloat16) == "bf16" and hlo_dtype(jnp.float8_e4m3fn) == "f8e4m3fn"


def test_step_arithmetic_on_state_sized_arrays_is_not_state():
    """Adam's hyperparameters broadcast to a weight's shape, a zero-filled buffer written into: computation."""
    weight = jax.ShapeDtypeStruct((WIDTH, WIDTH // 2), jnp.float32)

    def update(w, g, i):
        return w * 0.9 + g * 0.1 + 1e-8, jnp.zeros_like(w).at[i].set(1.0)

    text = hlo_text(jax.jit(update).trace(weight, weight, jax.ShapeDtypeStruct((), jnp.int32)).lower())
    assert analyze(text).constants.large == []


def test_a_scanned_key_stack_is_found_inside_the_loop():
    keys = jax.random.split(jax.random.key(3), 5)  # one key per layer, closed over

    def step(x):
        return jax.lax.scan(lambda h, k: (h + jax.random.normal(k, h.shape), None), x, keys)[0]

    module = analyze(hlo_text(jax.jit(step).trace(jnp.ones((4,))).lower()))
    (key,) = module.constants.literal_keys
    assert key["dims"] == [5, 2] and frozen_rng(module.constants.to_record())["literal_keys"] == 5


def test_moving_the_rest_into_the_arguments_trades_constants_for_entry_parameters(tmp_path, closed_over):
    traced, rest = lowered_step(rest_as_argument=True)
    passed = analyze(hlo_text(traced.lower()), "passed", captured=captured_arrays(traced, {"model": rest}))
    _, _, captured = closed_over
    assert passed.captured == () and passed.constants.literal_keys == []
    assert sorted(p.path for p in passed.params if p.path.startswith("rest")) == [
        "rest.dropout.rngs.count", "rest.dropout.rngs.key", "rest.qvalue", "rest.scale"]
    # What the gate compares: captured arrays per dtype, in count and bytes.
    delta = captured_delta(golden_summary(captured.constants.to_record()), golden_summary(passed.constants.to_record()))
    assert delta["arrays"] == [4, 0] and delta["by_dtype"] == {"bf16": -1, "s8": -1, "u32": -2}
    assert delta["literal_keys"] == [1, 0] and delta["groups"]["model.qvalue"] == -1
    # What `diff` sees from the two texts alone: the large constant and the literal key gone, parameters added.
    old, new = tmp_path / "closed.hlo.txt", tmp_path / "passed.hlo.txt"
    old.write_text(captured.text)
    new.write_text(passed.text)
    d = diff_modules(analyze(captured.text), analyze(passed.text))
    assert d.entry_params == (2, 6) and d.constants["basis"] == "large constants"
    assert d.constants["by_dtype"] == {"s8": -1} and d.constants["literal_keys"] == [1, 0]
    result = CliRunner().invoke(app, ["diff", str(old), str(new), "--max-lines", "0"], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "baked-in state: large constants 1 -> 0 (1,048,576 -> 0 bytes): s8 -1; literal RNG keys 1 -> 0" in result.output
    assert "rest.qvalue" in result.output


def test_count_shows_constants_large_ones_and_literal_keys(tmp_path, closed_over):
    _, _, analysis = closed_over
    path = tmp_path / "step.hlo.txt"
    path.write_text(analysis.text)
    out = CliRunner().invoke(app, ["count", str(path)], env={"COLUMNS": "200"}).output
    assert "large: 1 (1,048,576 bytes: s8 1); literal RNG keys: 1 (never advance)" in out
    assert "broadcast" in out and "s8[1024,1024]" in out
    doc = CliRunner().invoke(app, ["count", str(path), "--format", "json"]).output
    import json

    constants = json.loads(doc)["modules"][0]["constants"]
    assert constants["captured"] is None  # a file: only what the module shows
    assert constants["large"][0]["paths"] == [] and len(constants["literal_keys"]) == 1


CLOSING_TARGET = '''
import jax, jax.numpy as jnp
TABLE = jnp.arange(4096.0).reshape(64, 64)  # module state the step reads without taking it

def lower(cell):
    return jax.jit(lambda x: x @ TABLE).trace(jax.ShapeDtypeStruct((2, 64), jnp.float32))

lower.full_depth = {"table": 1}
'''


def test_captured_state_survives_the_cache_and_a_reanalysis(tmp_path, monkeypatch):
    from hlo_audit.cache import Cache
    from hlo_audit.matrix import Cell
    from hlo_audit.run import run_cells

    (tmp_path / "closing_target.py").write_text(CLOSING_TARGET)
    monkeypatch.syspath_prepend(str(tmp_path))
    cell = Cell(model="table", scan=False, quant="none", layers=1, target="closing_target:lower")
    cache = Cache(tmp_path / "cache")
    (fresh,) = run_cells([cell], cache)
    assert fresh.captured["arrays"] == 1 and fresh.captured["by_dtype"] == {"f32": 1}
    assert fresh.captured["arrays_list"][0]["path"] is None  # no tree names it: the function's own global
    (cached,) = run_cells([cell], cache)
    assert cached.cached and cached.constants == fresh.constants
    for result in (tmp_path / "cache").rglob("*.result.json"):  # analysis code changed: re-read the lowering
        result.unlink()
    (again,) = run_cells([cell], cache)
    assert again.cached and again.constants == fresh.constants
