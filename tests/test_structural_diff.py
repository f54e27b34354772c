"""The structural diff on real lowerings: every change a pull request makes is named with its kind and its place,
and `diff`'s output follows the size of the change, not the size of the module.

The model is a team's own (tests/team_model.py: an NNX model with remat, a small loop, an optimizer and a donated
``jax.jit`` train step), lowered with jax's source locations as a dump has them; each change of the issue's table is
one variant of it. Expected numbers come from the model and jax, not from the diff: the donated parameters from the
module's header, the FLOPs from the model's dims, the lines from the model's source.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pallas_kernel
import team_model as tm
from cuda_probe import needs_cuda
from hlo_audit.cli import app
from hlo_audit.comparison import Structural
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.changes import REMAT, UNROLLED, Action, ChangeKind
from hlo_audit.hlo.diff import diff_modules
from hlo_audit.hlo.effects import has_side_effect
from hlo_audit.hlo.header import output_aliases
from hlo_audit.hlo.rng import strip_rng_state
from hlo_audit.report.change_words import change_line
from xla_oracle import our_counts, xla_counts

BASE = tm.Variant()
SOURCE = Path(tm.__file__).read_text().splitlines()
# What `diff` may print for one change of the table: the change named, the match in a line, the deltas.
FEW_DOZEN_LINES = 40


def line_of(code: str) -> str:
    """``team_model.py:N`` of the only line holding ``code``."""
    (number,) = [n for n, line in enumerate(SOURCE, 1) if code in line]
    return f"team_model.py:{number}"


def analysis(variant: tm.Variant, name: str | None = None, debug_info: bool = True):
    return analyze(tm.lower(variant, debug_info), name or str(variant))


def diff(old: tm.Variant, new: tm.Variant):
    return diff_modules(analysis(old, "old"), analysis(new, "new"), max_text_lines=0)


def kinds(d, kind: ChangeKind) -> list:
    return [c for c in d.named if c.kind is kind]


def cli_diff(tmp_path: Path, old_text: str, new_text: str, *args: str):
    old, new = tmp_path / "old.hlo.txt", tmp_path / "new.hlo.txt"
    old.write_text(old_text)
    new.write_text(new_text)
    return CliRunner().invoke(app, ["diff", str(old), str(new), *args])


# --------------------------------------------------------------------------------------------------------------
# The table, one change at a time
# --------------------------------------------------------------------------------------------------------------


def test_donation_removed_names_the_parameters_and_their_bytes():
    base = analysis(BASE)
    donated = {n for _, n in output_aliases(base.module.header_attrs)}
    assert donated, "the base step donates its state"
    expected_bytes = sum(p.bytes for p in base.params if p.index in donated)
    d = diff(BASE, tm.VARIANTS["donation_removed"])
    assert d.verdict == "changed"
    (lost,) = kinds(d, ChangeKind.DONATION)
    assert (lost.action, lost.subject, lost.count, lost.bytes) == (Action.REMOVED, "input_output_alias",
                                                                  len(donated), expected_bytes)
    assert dict(lost.groups)["state.0.blocks.*.up.kernel"] == BASE.layers
    assert not kinds(d, ChangeKind.HEADER)  # the alias attribute is the donation, not a header change besides
    (back,) = kinds(diff(tm.VARIANTS["donation_removed"], BASE), ChangeKind.DONATION)
    assert (back.action, back.count, back.bytes) == (Action.ADDED, len(donated), expected_bytes)


def test_debug_print_is_a_host_callback_at_its_line():
    d = diff(BASE, tm.VARIANTS["debug_print"])
    assert d.verdict == "changed"
    (callback,) = kinds(d, ChangeKind.HOST_TRANSFER)
    assert callback.action is Action.ADDED and callback.subject == "custom-call xla_ffi_python_cpu_callback"
    assert callback.place.source == line_of("jax.debug.print(")
    assert callback.place.op_name.endswith("debug_print") and (callback.count, callback.per_step) == (1, 1)
    assert d.match.inserted == 1 and d.match.changed == d.match.deleted == 0


def test_a_host_callback_is_never_stripped_as_rng_state():
    """jax.debug.print's callback has no users: stripping RNG state removed it as dead, and diff called the module
    'changed (attributes)'. With RNG state in both modules the callback is the change, never RNG state."""
    printing = analysis(tm.Variant(fork_rngs=True, debug_print=True))
    stripped, _ = strip_rng_state(printing.module, printing.params)
    assert [i.custom_call_target for i in stripped.instructions() if has_side_effect(i) and
            i.opcode == "custom-call"] == ["xla_ffi_python_cpu_callback"]
    for old in (tm.Variant(fork_rngs=True), BASE):
        d = diff_modules(analysis(old), printing, max_text_lines=0)
        assert d.verdict == "changed" and "ops" in d.changes, (old, d.verdict, d.changes)
        assert [c.subject for c in kinds(d, ChangeKind.HOST_TRANSFER)] == ["custom-call xla_ffi_python_cpu_callback"]


STRIPPED_CALLBACK = '''HloModule m, entry_computation_layout={(f32[4]{0}, u32[]{:S(1)}, u32[2]{0})->(f32[4]{0}, u32[], u32[2]{0})}

ENTRY %main (w: f32[4], state__rngs____count___value.1: u32[], state__rngs____key___value.1: u32[2]) -> (f32[4], u32[], u32[2]) {
  %w = f32[4]{0} parameter(0)
  %state__rngs____count___value.1 = u32[] parameter(1)
  %state__rngs____key___value.1 = u32[2]{0} parameter(2)
  %one = u32[] constant(1)
  %inc = u32[] add(%state__rngs____count___value.1, %one)
  %print = () custom-call(%inc), custom_call_target="xla_ffi_python_cpu_callback", custom_call_has_side_effect=true
  %tok = token[] after-all()
  %out = token[] outfeed(%w, %tok), outfeed_shape=f32[4]{0}
  ROOT %t = (f32[4]{0}, u32[], u32[2]{0}) tuple(%w, %inc, %state__rngs____key___value.1)
}
'''


def test_side_effects_that_read_rng_state_stay():
    """A callback printing the RNG count, and an outfeed nothing reads: both stay, the count read as RNG_VALUE."""
    assert our_counts(STRIPPED_CALLBACK) == xla_counts(STRIPPED_CALLBACK)
    module = analyze(STRIPPED_CALLBACK)
    stripped, kept = strip_rng_state(module.module, module.params)
    assert [p.path for p in kept] == ["w"]
    opcodes = {i.opcode for i in stripped.instructions()}
    assert {"custom-call", "outfeed", "after-all"} <= opcodes and "add" not in opcodes


def test_one_projection_in_f32_is_a_precision_change_with_its_flops():
    new = tm.VARIANTS["f32_up"]
    d = diff(BASE, new)
    assert d.verdict == "changed"
    (precision,) = kinds(d, ChangeKind.PRECISION)
    # Per layer: the forward dot, its recomputation under remat, and the two of the backward pass.
    assert (precision.subject, precision.count, precision.layers) == ("dot", 4 * BASE.layers, BASE.layers)
    assert precision.before == "bf16 x bf16 -> bf16" and precision.after == "f32 x f32 -> f32"
    assert precision.flops == precision.count * 2 * tm.BATCH * tm.WIDTH * tm.HIDDEN  # each contracts one of them
    assert precision.place.source == line_of("getattr(self, self.variant.up_name)(self.norm(x))")
    assert precision.place.paths == ("state.0.blocks.*.up.kernel",)
    assert precision.instructions < 0  # the bf16 converts of the weight and input went
    # Nothing else: the ops downstream that now run at f32 follow the dot; no wall of changed instructions.
    assert {c.kind for c in d.named} == {ChangeKind.PRECISION}


def test_remat_removed_is_a_remat_change():
    d = diff(BASE, tm.VARIANTS["remat_removed"])
    (remat,) = kinds(d, ChangeKind.REMAT)
    assert remat.subject == REMAT and remat.action is Action.REMOVED
    assert remat.count == BASE.layers and remat.layers == BASE.layers  # one opt-barrier per rematerialized block
    assert remat.instructions == d.match.instructions[1] - d.match.instructions[0] < 0
    assert remat.place.source == line_of("nnx.remat(")
    assert not kinds(d, ChangeKind.PROGRAM_SIZE) and len(d.named) <= 4
    assert "remat: rematerialization removed at 2 checkpoints (1 per layer, 2 layers)" in change_line(remat)


def test_a_loop_unrolled_8x_is_a_loops_change():
    d = diff(BASE, tm.VARIANTS["unrolled_8x"])
    (loop,) = kinds(d, ChangeKind.LOOPS)
    loops = 3 * BASE.layers  # the forward loop, its recomputation under remat, and the backward one, per layer
    assert (loop.subject, loop.count, loop.per_step, loop.action) == (UNROLLED, loops, 8, Action.REMOVED)
    assert loop.instructions == d.match.instructions[1] - d.match.instructions[0] > 0
    assert loop.place.source == line_of("jax.lax.fori_loop(")
    assert d.named == [loop]
    assert change_line(loop).startswith(f"loops: {loops} loops of 8 iterations, body ")
    assert "unrolled (8 copies of the body inline)" in change_line(loop)


def test_a_weight_attribute_renamed_is_renamed_only(tmp_path):
    d = diff(BASE, tm.VARIANTS["up_renamed"])
    assert (d.verdict, d.changes, d.differs) == ("renamed-only", [], False)
    (rename,) = d.named
    # The weight and the optimizer's two moments of it, per layer.
    assert (rename.kind, rename.before, rename.after, rename.count) == (ChangeKind.RENAME, "up", "up_proj",
                                                                         3 * BASE.layers)
    result = cli_diff(tmp_path, tm.lower(BASE), tm.lower(tm.VARIANTS["up_renamed"]))
    assert result.exit_code == 0 and result.stdout.startswith("verdict: renamed-only")
    assert "rename: up -> up_proj, 6 parameters" in result.stdout


def test_every_parameter_renamed_is_renamed_only():
    """Every entry parameter of a real module renamed (no metadata: the names are the paths): the same program."""
    text = tm.lower(BASE, debug_info=False)
    base = analyze(text, "base")
    renamed = text
    for p in base.params:
        renamed = re.sub(rf"(?<![\w.]){re.escape(p.name)}(?![\w.])", f"renamed_{p.index}_{p.name}", renamed)
    new = analyze(renamed, "renamed")
    assert {p.path for p in new.params}.isdisjoint(p.path for p in base.params)
    d = diff_modules(base, new, max_text_lines=0)
    assert (d.verdict, d.differs) == ("renamed-only", False)
    assert sum(c.count for c in kinds(d, ChangeKind.RENAME)) == len(base.params)
    assert d.match.unchanged == d.match.instructions[0]


def test_a_bias_added_names_the_parameters():
    d = diff(BASE, tm.VARIANTS["bias"])
    added = {c.subject: c for c in kinds(d, ChangeKind.PARAMETERS) if c.action is Action.ADDED}
    assert set(added) == {"blocks.*.up.bias", "blocks.*.down.bias"}
    up = added["blocks.*.up.bias"]  # the weight and adam's two moments of it, per layer
    assert (up.count, up.layers, up.bytes, up.after) == (3 * BASE.layers, BASE.layers, 3 * BASE.layers * tm.HIDDEN * 4,
                                                         "f32")
    assert dict(up.groups) == {"state.0.blocks.*.up.bias": BASE.layers,
                               "state.1.opt_state.0.mu.blocks.*.up.bias": BASE.layers,
                               "state.1.opt_state.0.nu.blocks.*.up.bias": BASE.layers}


@pytest.mark.parametrize("name", ["donation_removed", "debug_print", "f32_up", "remat_removed", "unrolled_8x",
                                  "up_renamed", "bias"])
def test_diff_output_follows_the_change_not_the_module(name, tmp_path):
    """Every change of the table prints in at most a few dozen lines, each naming its kind, while the normalized
    text diff of the same pair is much longer (for the large ones) and comes only with --text."""
    old_text, new_text = tm.lower(BASE), tm.lower(tm.VARIANTS[name])
    result = cli_diff(tmp_path, old_text, new_text)
    lines = result.stdout.splitlines()
    assert len(lines) <= FEW_DOZEN_LINES, result.stdout
    assert "normalized text diff" not in result.stdout
    changes = lines[lines.index("changes:") + 1:]
    assert changes[0].startswith("  ") and ":" in changes[0]
    assert any(line.startswith("matched: ") for line in lines)
    text = cli_diff(tmp_path, old_text, new_text, "--text", "--max-lines", "100000").stdout.splitlines()
    assert "normalized text diff:" in text
    if name in ("f32_up", "remat_removed", "unrolled_8x", "up_renamed", "bias"):
        assert len(text) > 10 * len(lines)


def test_one_dots_precision_changed_prints_a_few_lines(tmp_path):
    """One dot of a real module given operand_precision={highest,highest}: one precision change, the rest of the
    module one line."""
    text = tm.lower(BASE)
    dot = next(line for line in text.splitlines() if " dot(" in line)
    changed = text.replace(dot, dot.replace("rhs_contracting_dims={0}",
                                            "rhs_contracting_dims={0}, operand_precision={highest,highest}"), 1)
    assert changed != text and our_counts(changed) == xla_counts(changed)
    d = diff_modules(analyze(text, "old"), analyze(changed, "new"), max_text_lines=0)
    (precision,) = d.named
    assert precision.kind is ChangeKind.PRECISION and precision.count == 1
    assert precision.after == f"{precision.before} (operand_precision={{highest,highest}})"
    assert (d.match.changed, d.match.inserted, d.match.deleted) == (1, 0, 0)
    result = cli_diff(tmp_path, text, changed)
    assert result.exit_code == 1 and len(result.stdout.splitlines()) <= 12, result.stdout


# --------------------------------------------------------------------------------------------------------------
# RNG state forked per layer: rng-state-only whichever target lowered it
# --------------------------------------------------------------------------------------------------------------


def test_forked_rngs_in_a_donated_jax_jit_step_is_rng_state_only():
    compared = Structural.of_analyses(analysis(BASE, "old"), analysis(tm.VARIANTS["forked_rngs"], "new"))
    d = compared.diff
    assert d.verdict == "rng-state-only", (d.changes, [c.subject for c in d.named])
    assert compared.params.by_role == {"rng_count": BASE.layers, "rng_key": BASE.layers}
    assert diff(tm.VARIANTS["forked_rngs"], BASE).verdict == "rng-state-only"


TINY = """
target = "nnx"
models = ["tiny"]
scan = ["{scan}"]
layers = [2]

[nnx]
model = "tinylm.model:TinyLM"
config = "tinylm.model:ModelConfig.tiny"
layers = "num_layers"
scan = "scan_layers"
inputs = {{ tokens = "int32[batch,seq]" }}
labels = "tokens"
"""


@pytest.mark.parametrize("scan", ["off", pytest.param("on", marks=pytest.mark.long)])
def test_forked_rngs_through_the_nnx_target_is_rng_state_only(scan, tmp_path):
    """The stock NNX target (its own donated train step): a library whose blocks keep a fork of the Rngs."""
    from nnx_library import add_layer_fork, write_library
    from test_nnx_target import hlo_audit

    texts = {}
    for name, edit in (("base", None), ("forked", add_layer_fork)):
        root = write_library(tmp_path / name)
        if edit is not None:
            edit(root)
        (root / "hlo-audit.toml").write_text(TINY.format(scan=scan))
        out = tmp_path / f"{name}.hlo.txt"
        result = hlo_audit(root, "lower", f"tiny/scan-{scan}/none/L2", "--output", str(out), "--no-cache",
                           pythonpath=(root,))
        assert result.returncode == 0, result.stderr[-3000:]
        texts[name] = out.read_text()
    compared = Structural.of_analyses(analyze(texts["base"], "base"), analyze(texts["forked"], "forked"))
    d = compared.diff
    assert d.verdict == "rng-state-only", (d.changes, [c.subject for c in d.named])
    assert compared.params.by_dtype == {"u32": 4 if scan == "off" else 2}


# --------------------------------------------------------------------------------------------------------------
# Kernel bodies: a Pallas kernel compared by what it computes
# --------------------------------------------------------------------------------------------------------------


def _kernel_module_at(folder: Path, name: str):
    """tests/pallas_kernel.py copied into ``folder`` and imported from there: the same kernel, its source (and so
    its source locations) at another path, as from another checkout or virtual environment."""
    folder.mkdir(parents=True)
    path = folder / "pallas_kernel.py"
    shutil.copy(pallas_kernel.__file__, path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KERNELS = [
    pytest.param("mosaic", True, marks=pytest.mark.tpu, id="mosaic-locations-beside"),
    pytest.param("mosaic", False, marks=pytest.mark.tpu, id="mosaic-locations-in-body"),
    pytest.param("triton", True, marks=needs_cuda, id="triton"),
]


@pytest.mark.parametrize("backend,debug_locations", KERNELS)
def test_a_pallas_kernel_is_compared_by_content(backend, debug_locations, tmp_path):
    here = _kernel_module_at(tmp_path / "checkout", "kernel_here")
    elsewhere = _kernel_module_at(tmp_path / "another" / "venv" / "site-packages" / "project", "kernel_elsewhere")
    base = here.lower(128, debug_locations, backend)
    moved = elsewhere.lower(128, debug_locations, backend)
    assert str(tmp_path / "checkout") in base and str(tmp_path / "another") in moved  # jax's FileNames table
    target = {"mosaic": "tpu_custom_call", "triton": "__gpu$xla.gpu.triton"}[backend]
    assert base.count(target) == moved.count(target) == 1
    assert diff_modules(analyze(base, "here"), analyze(moved, "elsewhere")).verdict in (
        "identical", "identical-after-normalization")
    bigger = here.lower(256, debug_locations, backend)
    d = diff_modules(analyze(base, "128"), analyze(bigger, "256"), max_text_lines=0)
    assert d.verdict == "changed" and "kernels" in d.changes and d.differs
    (kernel,) = kinds(d, ChangeKind.KERNEL)
    assert kernel.action is Action.CHANGED and target in kernel.subject
    assert kernel.place.source == "pallas_kernel.py:" + str(
        next(n for n, line in enumerate(Path(pallas_kernel.__file__).read_text().splitlines(), 1)
             if "pl.pallas_call(" in line))


def test_the_text_diff_summarizes_the_module_header(tmp_path):
    """--text: a changed header attribute is one short line per side (its entries and a digest), not the whole
    HloModule line (issue 26: ~2,500 characters a side for a real step's input_output_alias)."""
    old_text, new_text = tm.lower(BASE), tm.lower(tm.VARIANTS["bias"])
    header = old_text.splitlines()[0]
    assert len(header) > 1000
    result = cli_diff(tmp_path, old_text, new_text, "--text", "--max-lines", "100000")
    lines = result.stdout.splitlines()
    aliases = [line for line in lines if "input_output_alias=" in line]
    assert [line[:1] for line in aliases] == ["-", "+"]
    assert re.fullmatch(r"-  input_output_alias=<20 entries, [\d,]+ characters, digest [0-9a-f]{8}>", aliases[0])
    assert re.fullmatch(r"\+  input_output_alias=<32 entries, [\d,]+ characters, digest [0-9a-f]{8}>", aliases[1])
    assert header not in result.stdout and len(aliases[1]) < 100


def test_instructions_per_step_see_through_loops():
    """The unrolled loop runs what the loop ran: per step, the same tanh (8 iterations of the forward loop and of its
    recomputation, per layer); only the loops' own bookkeeping (their conditions, counters and tuples) goes."""
    from hlo_audit.hlo.change_places import instructions_per_step

    base = instructions_per_step(analysis(BASE).module)
    unrolled = instructions_per_step(analysis(tm.VARIANTS["unrolled_8x"]).module)
    assert base["tanh"] == unrolled["tanh"] >= 8 * 2 * BASE.layers  # the forward loop and its recomputation
    assert base["while"] == 3 * BASE.layers and unrolled["while"] == 0
    assert base["compare"] > unrolled["compare"]  # the conditions, 9 times a loop


def test_a_four_parameter_change_is_said_in_under_3000_characters(tmp_path):
    """Issue 26: RNG analysis that adds a header attribute once made `diff` print both ~2,500-character HloModule
    lines, 12,464 characters for 4 new parameters. The per-layer fork at L2 adds 4 (a key and a counter a layer);
    `diff` at --max-lines 0 (every line of its view) says so in under 3,000 characters."""
    old_text, new_text = tm.lower(BASE), tm.lower(tm.VARIANTS["forked_rngs"])
    result = cli_diff(tmp_path, old_text, new_text, "--max-lines", "0")
    assert result.exit_code == 1, result.output
    before, after = map(int, re.search(r"entry parameters: (\d+) -> (\d+)", result.stdout).groups())
    assert "rng-state-only" in result.stdout and after - before == 4, result.stdout
    assert len(result.stdout) < 3000, len(result.stdout)
    # And the text on request: the module header's attributes summarized, not printed (~2,500 characters a side).
    text = cli_diff(tmp_path, old_text, new_text, "--text", "--max-lines", "100000").stdout
    header = [line for line in text.splitlines() if "HloModule" in line or "_alias=" in line]
    assert header and max(map(len, header)) < 200 and old_text.splitlines()[0] not in text, header
