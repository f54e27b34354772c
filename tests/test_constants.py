"""State a step captures as constants, on small real jax programs: what the module shows (constants, large ones,
literal RNG keys), what the trace shows (captured arrays and their paths), and how the gate and diff see it
when that state moves into the step's arguments. MaxEngine's own steps: test_maxengine.py."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from typer.testing import CliRunner

from decoder_steps import WIDTH, traced_step
from hlo_audit.capture import captured_arrays, hlo_dtype
from hlo_audit.cli import app
from hlo_audit.comparison import Structural
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.constants import LARGE_CONSTANT_BYTES, frozen_rng, golden_summary
from hlo_audit.hlo.diff import captured_delta, diff_modules
from hlo_audit.stages.lowered import hlo_text
from in_process import hlo_audit_here


@pytest.fixture(scope="module")
def closed_over():
    traced, rest = traced_step()
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
    assert frozen["used"] == 1  # the dropout mask reaches the output: the same mask on every call
    assert "threefry" in frozen["sites"][0]
    assert report["captured"]["bytes_by_dtype"] == {"bf16": 2 * WIDTH, "s8": WIDTH * WIDTH, "u32": 12}


def test_real_weights_print_elided_and_xla_reads_them_back():
    traced, _ = traced_step(real_weights=True)
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


def test_a_scan_reads_captured_state_in_its_body_and_fills_its_own_accumulator():
    table = jnp.zeros((WIDTH, WIDTH), jnp.int8)  # a placeholder weight, closed over: a splat

    def step(xs):
        def body(acc, x):  # acc: a zero-filled f32 buffer of 4 MiB the loop writes, carried
            return acc + table.astype(jnp.float32) * x, None
        return jax.lax.scan(body, jnp.zeros((WIDTH, WIDTH)), xs)[0]

    module = analyze(hlo_text(jax.jit(step).trace(jax.ShapeDtypeStruct((3,), jnp.float32)).lower()))
    assert [(c.form, c.shape.dtype) for c in module.constants.large] == [("broadcast", "s8")]


def test_a_scanned_key_stack_is_found_inside_the_loop():
    keys = jax.random.split(jax.random.key(3), 5)  # one key per layer, closed over

    def step(x):
        return jax.lax.scan(lambda h, k: (h + jax.random.normal(k, h.shape), None), x, keys)[0]

    module = analyze(hlo_text(jax.jit(step).trace(jnp.ones((4,))).lower()))
    (key,) = module.constants.literal_keys
    assert key["dims"] == [5, 2] and key["used"] and frozen_rng(module.constants.to_record())["literal_keys"] == 5


def test_moving_the_rest_into_the_arguments_trades_constants_for_entry_parameters(tmp_path, closed_over):
    traced, rest = traced_step(rest_as_argument=True)
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
    compared = Structural.of_analyses(analyze(captured.text), analyze(passed.text))
    d = compared.diff
    assert (compared.params.golden, compared.params.now) == (2, 6) and d.constants["basis"] == "large constants"
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
    assert fresh.captured.arrays == 1 and fresh.captured.by_dtype == {"f32": 1}
    assert fresh.captured.arrays_list[0].path is None  # no tree names it: the function's own global
    (cached,) = run_cells([cell], cache)
    assert cached.cached and cached.constants == fresh.constants
    for result in (tmp_path / "cache").rglob("*.result.json"):  # analysis code changed: re-read the lowering
        result.unlink()
    (again,) = run_cells([cell], cache)
    assert again.cached and again.constants == fresh.constants


def test_the_gate_ratchets_captured_state_both_ways(tmp_path):
    """Golden with the rest closed over; moved into the arguments: more entry parameters (a regression, with
    their paths) and fewer captured arrays. Golden with it passed in; baked in again: captured growth fails."""
    (tmp_path / "hlo-audit.toml").write_text('target = "decoder_steps:lower"\nmodels = ["decoder"]\nscan = ["off"]\n'
                                             'quant = ["none"]\nlayers = [1]\n')

    def hlo_audit(*args, inject=False):
        return hlo_audit_here(tmp_path, *args, env={"COLUMNS": "200", "HLO_AUDIT_INJECT": "rest-as-args" if inject
                                                     else None})

    assert hlo_audit("golden", "update").returncode == 0
    record = json.loads((tmp_path / "golden/decoder/scan-off/none/L1.json").read_text())
    assert record["constants"]["captured"]["by_dtype"] == {"u32": 2, "bf16": 1, "s8": 1}
    assert record["constants"]["literal_keys"] == 1
    moved = hlo_audit("check", "--no-cache", inject=True)
    out = " ".join(moved.stdout.split())
    assert moved.returncode == 1, out
    assert ("entry parameters golden 2 -> now 6: bf16 +1, s8 +1, u32 +2 (input +2, rng_count +1, rng_key +1); grown: +2 "
            "rest.dropout.rngs.* (rng_count +1, rng_key +1), +1 rest.qvalue (input +1), +1 rest.scale (input +1)") in out
    assert "captured arrays 4 -> 0 (1,050,636 -> 0 bytes): bf16 -1, s8 -1, u32 -2; literal RNG keys 1 -> 0" in out
    assert hlo_audit("golden", "update", "--no-cache", inject=True).returncode == 0
    baked = hlo_audit("check", "--no-cache")
    out = " ".join(baked.stdout.split())
    assert baked.returncode == 1, out
    assert ("entry parameters golden 6 -> now 2: bf16 -1, s8 -1, u32 -2 (input -2, rng_count -1, rng_key -1); shrunk: -2 "
            "rest.dropout.rngs.* (rng_count -1, rng_key -1), -1 rest.qvalue (input -1), -1 rest.scale (input -1); "
            "captured arrays 0 -> 4 (0 -> 1,050,636 bytes): bf16 +1, s8 +1, u32 +2; literal RNG keys 0 -> 1") in out


def _hadamard(signs: int):
    """A step that multiplies by a 16x16 matrix baked in (TE's RHT Hadamard signs), one row's signs flipped."""
    import numpy as np

    matrix = np.where(np.add.outer(np.arange(16), np.arange(16)) % 2, 1.0, -1.0).astype(np.float32)
    matrix[0] *= signs
    return jax.jit(lambda x: x @ jnp.asarray(matrix)).lower(jax.ShapeDtypeStruct((4, 16), jnp.float32))


def test_a_value_only_change_of_an_elided_constant_changes_the_canonical_text():
    from hlo_audit.stages import lowered as lowered_stage

    same, flipped = (lowered_stage.run(_hadamard(s), None) for s in (1, -1))
    assert same.text == flipped.text and "constant({...})" in same.text  # jax's text alone cannot tell them apart
    a, b = (analyze(x.text, literal_digests=x.literal_digests) for x in (same, flipped))
    assert a.normalized != b.normalized
    assert 'frontend_attributes={literal_sha256="sha256:' in a.normalized
    assert diff_modules(a, b).verdict == "changed"
    # The canonical text reads back as itself, digest and all; the same values give the same digest.
    assert analyze(a.normalized).normalized == a.normalized
    again = lowered_stage.run(_hadamard(1), None)
    assert analyze(again.text, literal_digests=again.literal_digests).normalized == a.normalized
