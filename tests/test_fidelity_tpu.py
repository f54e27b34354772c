"""What a TPU compile looks like against what the tools read of it (issue 33 item 3), on real TPU v5e texts compiled
deviceless here (tests/data/tpu_fidelity/, written by its make_texts.py; a live compile where libtpu is installed).

Measured on a real v5e chip (2026-12-05): the chip's own client and the compile-only client give the same program,
but the chip prints each ``backend_config``'s JSON keys sorted and the compile-only client in proto field order, so
`diff` called every pair "changed (attributes)"; the TPU compiler passes a scan's counter start through a ``copy``,
so `rng` counted a 16-layer scan's increments once ("at least"); and `count` listed XLA's own bf16 broadcasts of 0
and 1 as state the step captured (97 of them, 1.68 GB, at 16 layers unrolled).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax._src.lib import hlo  # XLA's own parser: the oracle for what HLO text is

import nnx_models
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.constants import LARGE_CONSTANT_BYTES
from hlo_audit.hlo.loops import trip_count
from hlo_audit.hlo.normalize import normalize
from hlo_audit.hlo.text import parse_module
from hlo_audit.platforms.tpu import topology_devices
from in_process import cli
from nnx_models import ModelSpec, lower

DATA = Path(__file__).parent / "data" / "tpu_fidelity"
SCANNED = DATA / "scanned.compiled.hlo.txt"
LAYERS, STREAMS_ADVANCED = 6, 2  # make_texts.SCANNED: each layer's ToNNX bridge pulls a key from its two streams


def increments(rng) -> float:
    """Counter increments per step of all streams (what `rng` prints)."""
    return sum(s.increments for s in rng.streams)


def xla_module(text: str):
    return hlo.hlo_module_from_text(text)


def chip_ordered(text: str) -> tuple[str, int]:
    """The text as the chip's own client prints it: every backend_config's JSON keys sorted (how canon.py of the
    chip probe made the pair identical), and how many lines that changed. Python's JSON, not hlo-audit's reader."""
    decoder, lines, changed = json.JSONDecoder(), [], 0
    for line in text.splitlines(keepends=True):
        at = line.find("backend_config={")
        if at >= 0:
            start = at + len("backend_config=")
            config, end = decoder.raw_decode(line, start)
            ordered = json.dumps(config, sort_keys=True, separators=(",", ":"))
            changed += ordered != line[start:end]
            line = line[:start] + ordered + line[end:]
        lines.append(line)
    return "".join(lines), changed


def test_the_chips_key_order_is_no_difference(tmp_path):
    deviceless = SCANNED.read_text()
    chip, reordered = chip_ordered(deviceless)
    assert reordered == 86  # of the deviceless text's 333 instructions, as many backend_configs as the v5e reorders
    xla_module(chip)  # still HLO to XLA
    (tmp_path / "chip.hlo.txt").write_text(chip)
    result = cli("diff", SCANNED, tmp_path / "chip.hlo.txt")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("verdict: identical-after-normalization")
    assert normalize(parse_module(chip)) == normalize(parse_module(deviceless))


def test_a_changed_value_in_a_backend_config_is_still_a_change(tmp_path):
    chip, _ = chip_ordered(SCANNED.read_text())
    assert chip.count('"estimated_cycles":"1825"') == 2
    (tmp_path / "changed.hlo.txt").write_text(chip.replace('"estimated_cycles":"1825"', '"estimated_cycles":"1826"', 1))
    result = cli("diff", SCANNED, tmp_path / "changed.hlo.txt")
    assert result.exit_code == 1, result.output
    assert result.output.startswith("verdict: changed (attributes)")
    assert "instructions: 1 copy (backend_config)" in result.output


def test_a_quoted_backend_config_reads_as_the_bare_one():
    """Older XLA printed a config as a quoted string (XLA's parser reads both, and prints the bare form): one config."""
    module = jax.jit(lambda x: jax.lax.fori_loop(0, 7, lambda i, c: c * 2.0 + i, x)).lower(jnp.ones(4)).compile()
    bare = module.as_text()
    (config,) = re.findall(r'backend_config=(\{[^\n]*"known_trip_count"[^\n]*\})$', bare, re.M)
    quoted = bare.replace(config, '"' + config.replace('"', '\\"') + '"')
    assert quoted != bare and xla_module(quoted).to_string() == xla_module(bare).to_string()
    assert normalize(parse_module(quoted)) == normalize(parse_module(bare))
    for text in (bare, quoted):
        module = parse_module(text)
        (loop,) = [i for i in module.instructions() if i.opcode == "while"]
        comp = next(c for c in module.computations.values() if loop in c.instructions)
        assert trip_count(module, comp, loop) == 7


def test_a_scanned_tpu_module_counts_every_layers_increments():
    text = SCANNED.read_text()
    module = parse_module(text)
    # What the TPU compiler did: the scan's counter starts at a copy of a constant, not at the constant.
    forward = module.entry.by_name["while.4"]
    start = module.entry.by_name[module.entry.by_name[forward.operands[0]].operands[0]]
    assert start.opcode == "copy" and module.entry.by_name[start.operands[0]].literal == "0"
    compiled = analyze(text).rng
    # The truth, twice over: the module before XLA (its loop starts at a bare constant), and the model's construction.
    before = analyze((DATA / "scanned.lowered.hlo.txt").read_text()).rng
    assert increments(before) == increments(compiled) == LAYERS * STREAMS_ADVANCED == 12
    assert compiled.increments_exact and before.increments_exact
    result = cli("rng", SCANNED)
    assert "12 counter increments per step" in result.output and "at least" not in result.output


@pytest.mark.tpu
def test_a_live_v5e_compile_of_a_scan_counts_every_layer():
    """The same on a compile made now for the project's v5e-1 topology (MaxText's name for v5e:1x1), at 3 layers."""
    rng = analyze(_compiled_for(topology_devices("v5e-1")[0], 3)).rng
    assert rng.increments_exact and increments(rng) == 3 * STREAMS_ADVANCED


def _compiled_for(device, layers: int) -> str:
    spec = ModelSpec(layers=layers, scan=True, bridge="nodraw")
    sharding = jax.sharding.SingleDeviceSharding(device)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: nnx_models.build(spec)))
    shaped = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), state)
    x = jax.ShapeDtypeStruct((nnx_models.BATCH, spec.width), jnp.float32, sharding=sharding)
    step = jax.jit(nnx_models.make_step(graphdef), in_shardings=sharding, out_shardings=sharding)
    return step.lower(shaped, x).compile().as_text()


def test_a_loop_counting_by_three_from_one():
    """``i = 1; while i < 10: i += 3`` runs 3 times (1, 4, 7): start, bound and step all read, before and after XLA."""
    def step(x):
        return jax.lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 3, c[1] * 2.0), (1, x))[1]

    lowered = jax.jit(step).lower(jnp.ones(4))
    for text in (lowered.as_text(dialect="hlo"), lowered.compile().as_text()):
        module = parse_module(text)
        (loop,) = [i for i in module.instructions() if i.opcode == "while"]
        comp = next(c for c in module.computations.values() if loop in c.instructions)
        assert trip_count(module, comp, loop) == 3


def test_xlas_own_broadcasts_are_not_captured_state():
    """The step closes over a 2 MiB f32 table of random values (XLA folds it to bf16, 1 MiB); its compile also holds
    XLA's broadcasts of scalars inside its fusions, a 2 MiB bf16 one of 1 among them: only the table is state."""
    module = parse_module((DATA / "captured.compiled.hlo.txt").read_text())
    fused = {c for i in module.instructions() if i.opcode == "fusion" for c in i.called_computations()}
    xlas = [(i.shape.text.split("{")[0], c.by_name[i.operands[0]].literal) for c in module.computations.values()
            if c.name in fused for i in c.instructions if i.opcode == "broadcast"
            and i.shape.bytes >= LARGE_CONSTANT_BYTES and c.by_name[i.operands[0]].opcode == "constant"]
    # Five broadcasts of a scalar of 1 MiB or more, in kernels: four feed arithmetic there, one (bf16 1s) a convert.
    assert len(xlas) == 5 and ("bf16[8,256,512]", "1") in xlas
    large = analyze((DATA / "captured.compiled.hlo.txt").read_text()).constants.large
    assert [(c.form, c.shape.text.split("{")[0], c.shape.bytes) for c in large] == [
        ("literal", "bf16[512,1024,1]", LARGE_CONSTANT_BYTES)]


def test_a_literal_of_one_value_is_a_splat_not_state():
    """A 1 MiB literal printed in full is state when its values differ, a splat when they are one value."""
    weights = np.arange(1 << 20, dtype=np.int64).reshape(1024, 1024).astype(np.int8)
    text = jax.jit(lambda x: x @ weights.astype(np.float32)).lower(jnp.ones((4, 1024))).as_text(dialect="hlo")
    (literal,) = re.findall(r"constant\((\{ \{.*?\} \})\)", text, re.S)
    splat = text.replace(literal, "{ " + ", ".join(["{ " + ", ".join(["3"] * 1024) + " }"] * 1024) + " }")
    xla_module(splat)
    assert [c.form for c in analyze(text).constants.large] == ["literal"]
    assert analyze(splat).constants.large == []


def test_a_compiled_scan_reads_its_count_without_xlas():
    """XLA's CPU compiler wraps a loop's compare and add in fusions (``wrapped_compare``, ``wrapped_add``) and says the
    count in ``known_trip_count``; with that config dropped (XLA reads the text still), the loop itself says it."""
    text = lower(ModelSpec(layers=5, scan=True, bridge="nodraw")).compile().as_text()
    assert "wrapped_compare" in text and "wrapped_add" in text
    stripped = re.sub(r'(while\([^\n]*), backend_config=\{[^\n]*"known_trip_count"[^\n]*\}$', r"\1", text, flags=re.M)
    assert stripped.count("known_trip_count") == 0 < text.count("known_trip_count")
    xla_module(stripped)
    for source in (text, stripped):
        module = parse_module(source)
        loops = [(c, i) for c in module.computations.values() for i in c.instructions if i.opcode == "while"]
        assert len(loops) == 2 and [trip_count(module, c, i) for c, i in loops] == [5, 5]
