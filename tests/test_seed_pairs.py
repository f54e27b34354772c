"""`diff` on real regression pairs: MaxText's train step before and after seed 000's fix, and with seed 001's.

Seed 000 removed never-drawn RNG state in three places (the quantization bridge's forks for fp8 and
nanoo_fp8, ``Dropout`` forking at rate 0, ``AttentionOp`` holding rngs); ``injected_maxtext.reverted`` undoes
them in MaxText 0.2.5. Each pair is the same configuration lowered with the fix reverted and as released:
the review statement "the only difference is the dropped u32 RNG arrays and the renumbering that follows"
must come out ``rng-state-only``, with the u32 delta equal to the RNG parameters the fix dropped, for every
quantization, scanned and unrolled, at two depths (the second, 4 layers, in make test-long). Real changes that are not RNG state must come out
``changed``, with the kinds that changed.

Seed 001 (one RNG stream shared by the bridged NVFP4 quantizers) is not in MaxText 0.2.5: ``injected_maxtext.seed_001``
applies it forward, and its pairs are Transformer Engine cells (cuda, sm_90), lowered as the default matrix lowers
them. Every side is a matrix cell lowered through the session's cache (tests/conftest.py): the fixed sides are the
maxtext target's cells, the ones the matrix run, the committed goldens and the gate tests read, so none is lowered
twice; the reverted and patched sides are ``injected_maxtext:lower`` cells with $HLO_AUDIT_INJECT naming the change.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Marked maxtext, and importing it: without MaxText (make compat) the module is skipped, not an error.
pytest.importorskip("maxtext", reason="MaxText is not installed")
from typer.testing import CliRunner

import injected_maxtext
from hlo_audit.cli import app
from hlo_audit.comparison import Structural
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.diff import diff_modules
from hlo_audit.matrix import Cell

pytestmark = [pytest.mark.maxtext, pytest.mark.xdist_group("maxtext")]

QUANTS = ("none", "fp8", "nanoo_fp8", "int8")
PAIRS = [(q, scan, layers) for q in QUANTS for scan in (False, True) for layers in (2, 4)]


def _pair_id(quant: str, scan: bool, layers: int) -> str:
    return f"{quant}/scan-{'on' if scan else 'off'}/L{layers}"


INJECTED = "injected_maxtext:lower"


def _side(session_lowerings, folder: Path, cell: Cell, changes: tuple[str, ...] = ()) -> Path:
    """The HLO text of ``cell`` as released (the maxtext target), or with ``changes`` injected, written once into
    ``folder`` for the CLI to read."""
    name = [cell.id.replace("/", "_"), *(f"{k}={v}" for k, v in cell.overrides), *changes]
    path = folder / f"{'_'.join(name)}.hlo.txt"
    if not path.exists():
        if changes:
            cell = dataclasses.replace(cell, target=INJECTED)
        _, lowering = session_lowerings.lower(cell, ",".join(changes))
        path.write_text(lowering.text)
    return path


@pytest.fixture(scope="session")
def lowered(session_lowerings, tmp_path_factory):
    """``lowered(quant, scan, layers, reverts=(), overrides=None)`` -> path of the HLO text: the matrix cell, or the
    cell with seed 000's fixes named in ``reverts`` undone."""
    folder = tmp_path_factory.mktemp("seed-pairs")

    def lower(quant: str, scan: bool, layers: int, reverts: tuple[str, ...] = (), overrides: dict | None = None):
        cell = Cell("llama3-8b", scan, quant, layers, overrides=tuple(sorted((overrides or {}).items())))
        return _side(session_lowerings, folder, cell, reverts)

    return lower


def _rng_params(path: Path) -> int:
    return sum(p.is_rng for p in analyze(path.read_text(), str(path)).params)


# make test holds two 2-layer pairs, fp8 unrolled (the seed's own cell) and none scanned (the cheapest scanned one); every other pair, the
# 4-layer ones among them, is a `long` test (make test-long, run by .ci/run): make test's 15 minutes.
IN_MAKE_TEST = {("fp8", False, 2), ("none", True, 2)}


@pytest.mark.parametrize("quant,scan,layers", [
    pytest.param(*p, id=_pair_id(*p), marks=[] if tuple(p) in IN_MAKE_TEST else [pytest.mark.long]) for p in PAIRS])
def test_fix_reverted_is_rng_state_only(lowered, quant, scan, layers):
    """`hlo-audit diff BEFORE AFTER` on MaxText without and with seed 000's fix: rng-state-only, exit 1."""
    before, after = lowered(quant, scan, layers, ("prefix",)), lowered(quant, scan, layers)
    dropped = _rng_params(before) - _rng_params(after)
    assert dropped > 0  # every configuration carried never-drawn state before the fix
    result = CliRunner().invoke(app, ["diff", str(before), str(after), "--format", "json", "--max-lines", "0"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["verdict"] == "rng-state-only"
    assert report["by_dtype_delta"] == {"u32": -dropped}
    assert report["by_role_delta"] == {"rng_count": -dropped // 2, "rng_key": -dropped // 2}


@pytest.mark.long
@pytest.mark.parametrize("part", injected_maxtext.SEED_000)
@pytest.mark.parametrize("quant", ["fp8", "nanoo_fp8"])
def test_each_part_of_the_fix_is_rng_state_only(lowered, quant, part):
    """Each part reverted alone (fp8 and nanoo_fp8 unrolled at two layers, where all three show)."""
    before, after = lowered(quant, False, 2, (part,)), lowered(quant, False, 2)
    compared = Structural.of_analyses(analyze(before.read_text(), "before"), analyze(after.read_text(), "after"))
    d = compared.diff
    assert d.verdict == "rng-state-only"
    assert compared.params.by_dtype.get("u32", 0) == _rng_params(after) - _rng_params(before)
    assert all(g.role.startswith("rng_") for g in d.params_added + d.params_removed)


@pytest.mark.long
def test_another_mlp_width_changes_parameters_and_shapes(lowered):
    """Half the MLP width on the fp8 unrolled step: the same parameters and ops, other shapes."""
    before, after = lowered("fp8", False, 2), lowered("fp8", False, 2, overrides={"base_mlp_dim": "7168"})
    compared = Structural.of_analyses(analyze(before.read_text(), "before"), analyze(after.read_text(), "after"))
    d = compared.diff
    assert (d.verdict, d.changes) == ("changed", ["parameters", "shapes"])
    assert compared.params.golden == compared.params.now and compared.params.by_dtype == {}
    # wi_0, wi_1 and wo of both layers change shape, their Adam mu and nu with them: removed + added.
    assert sum(g.count for g in d.params_added) == -sum(g.count for g in d.params_removed) == 2 * 3 * 3


@pytest.mark.long
def test_another_activation_dtype_changes_ops_and_shapes(lowered):
    """float32 activations instead of bfloat16: converts go, shapes change dtype; the parameters stay."""
    before, after = lowered("fp8", False, 2), lowered("fp8", False, 2, overrides={"dtype": "float32"})
    d = diff_modules(analyze(before.read_text(), "before"), analyze(after.read_text(), "after"))
    assert d.verdict == "changed" and d.changes[:2] == ["ops", "shapes"] and "parameters" not in d.changes
    assert d.opcode_dtype_delta.get("convert:bf16", 0) < 0


# On 4 host devices (a process of its own: jax's device count is fixed at start), through the session's cache.
SHARDED = """
import sys
from pathlib import Path
from hlo_audit.cache import Cache
from hlo_audit.matrix import Cell
from hlo_audit.run import run_cells
cache = Cache(Path(sys.argv[1]))
cells = [Cell("llama3-8b", False, "fp8", 2, overrides=tuple(sorted({"ici_fsdp_parallelism": "1", split: "4"}.items())))
         for split in ("ici_fsdp_parallelism", "ici_tensor_parallelism")]
for result, path in zip(run_cells(cells, cache), sys.argv[2:]):
    assert result.status == "ok", result.message
    Path(path).write_text(cache.get_lowering(result.key, result.cell.id)[0])
"""


@pytest.mark.long
def test_another_mesh_split_is_a_change_of_shardings(session_lowerings, tmp_path):
    """On 4 (host) devices, the fp8 step with its weights split fsdp-wise and tensor-wise: shardings only."""
    fsdp, tensor = tmp_path / "fp8_unrolled_L2_fsdp4.hlo.txt", tmp_path / "fp8_unrolled_L2_tensor4.hlo.txt"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    subprocess.run([sys.executable, "-c", SHARDED, str(session_lowerings.folder), str(fsdp), str(tensor)], env=env,
                   check=True, capture_output=True, timeout=900)
    compared = Structural.of_analyses(analyze(fsdp.read_text(), "fsdp"), analyze(tensor.read_text(), "tensor"))
    assert compared.diff.verdict == "changed"
    assert compared.diff.changes == ["shardings"]
    assert compared.params.golden == compared.params.now


GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "llama3-8b" / "scan-off"


@pytest.mark.parametrize("quant", ["fp8", pytest.param("int8", marks=pytest.mark.long)])
def test_goldens_are_read_like_any_module(lowered, quant):
    """`diff golden/<cell>.hlo.txt <lowering>` says what `check` says for that cell: the released step is its
    golden (identical after normalization); with the fix reverted, RNG state only, by check's deltas; `rng` and
    `count` read the golden as they read the lowering."""
    golden_text, summary = GOLDEN / quant / "L2.hlo.txt", json.loads((GOLDEN / quant / "L2.json").read_text())
    runner = CliRunner()
    same = runner.invoke(app, ["diff", str(golden_text), str(lowered(quant, False, 2)), "--format", "json"])
    assert (same.exit_code, json.loads(same.stdout)["verdict"]) == (0, "identical-after-normalization")
    reverted = lowered(quant, False, 2, ("prefix",))
    leak = json.loads(runner.invoke(app, ["diff", str(golden_text), str(reverted), "--format", "json"]).stdout)
    now = analyze(reverted.read_text(), "now").summary
    assert leak["verdict"] == "rng-state-only"
    assert leak["by_dtype_delta"] == {k: v for k, v in ((d, now.by_dtype.get(d, 0) - summary["by_dtype"].get(d, 0))
                                                        for d in sorted({*now.by_dtype, *summary["by_dtype"]})) if v}
    (counted,) = json.loads(runner.invoke(app, ["count", str(golden_text), "--format", "json"]).stdout)["modules"]
    assert (counted["entry_params"], counted["by_dtype"], counted["by_role"]) == (
        summary["entry_params"], summary["by_dtype"], summary["by_role"])
    rng = [json.loads(runner.invoke(app, ["rng", str(path), "--format", "json"]).stdout)
           for path in (golden_text, lowered(quant, False, 2))]
    keys = ("streams", "drawn", "carried", "unknown", "dead_params", "dead_increments")
    assert [{k: r[k] for k in keys} for r in rng][0] == [{k: r[k] for k in keys} for r in rng][1]


# --------------------------------------------------------------------------------------------------------------
# Seed 001: one shared RNG stream for the bridged NVFP4 quantizers, forward-ported onto MaxText 0.2.5
# --------------------------------------------------------------------------------------------------------------

# llama3-8b te_nvfp4_no_rht unrolled, as the default matrix's TE cells lower it.
TE_OVERRIDES = (("attention", "dot_product"),)


@pytest.fixture(scope="session")
def te_lowered(session_lowerings, tmp_path_factory):
    """``te_lowered(quant, layers, *patches)`` -> path of the HLO text of the TE cell (cuda, sm_90) as the default
    matrix lowers it, with ``patches`` ("seed-001", seed-000 reverts) applied."""
    folder = tmp_path_factory.mktemp("seed-pairs-te")

    def lower(quant: str, layers: int, *patches: str) -> Path:
        cell = Cell("llama3-8b", False, quant, layers, platform="cuda", device="sm_90", overrides=TE_OVERRIDES)
        return _side(session_lowerings, folder, cell, patches)

    return lower


# The seed's table (entry parameters, of which u32), unrolled: MaxText 0.2.5 as released, then with seed 001.
SEED_001_TABLE = {2: ((161, 91), (77, 7)), 32: ((2231, 1351), (887, 7))}


@pytest.mark.te
@pytest.mark.long
@pytest.mark.parametrize("layers", [2, 32])
def test_seed_001_shares_one_stream_and_diff_says_rng_state_only(te_lowered, layers):
    """Seed 001's fix, applied as a forward patch: the seed's entry parameters, and `hlo-audit diff` says the only
    change is RNG state (exit 1), though every rematerialized layer hands its streams through an opt-barrier.
    L32 lowers each side in ~2.5 min (cached after)."""
    before, after = te_lowered("te_nvfp4_no_rht", layers), te_lowered("te_nvfp4_no_rht", layers, "seed-001")
    sides = [analyze(path.read_text(), str(path)) for path in (before, after)]
    assert [(len(a.params), a.summary.by_dtype.get("u32", 0)) for a in sides] == list(SEED_001_TABLE[layers])
    assert {p.role for p in sides[0].params} == {p.role for p in sides[1].params}
    result = CliRunner().invoke(app, ["diff", str(before), str(after), "--format", "json", "--max-lines", "0"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    dropped = SEED_001_TABLE[layers][0][1] - SEED_001_TABLE[layers][1][1]  # 84 at L2, 1344 at L32
    assert (report["verdict"], report["changes"]) == ("rng-state-only", [])
    assert report["by_dtype_delta"] == {"u32": -dropped}
    assert report["by_role_delta"] == {"rng_count": -dropped // 2, "rng_key": -dropped // 2}
    # What the patch does: one Rngs (the layers' own, which the attention holds too) instead of a fork per
    # quantized dot; its params stream is what TE's quantizer draws its stochastic rounding from.
    (drawn,) = sides[1].rng.by_verdict("drawn")
    assert drawn.path == "state.model.decoder.layers_0.mlp.wi_0.TEWrapper_dot_general_0.to_nnx__rngs.params"
    assert len(sides[0].rng.by_verdict("drawn")) == 7 * layers  # each quantized dot's own params stream


@pytest.mark.long
@pytest.mark.te
def test_te_fp8_forced_onto_a_shared_stream_adds_dead_increments_only(te_lowered):
    """te_fp8_currentscaling never draws; forcing it onto seed 001's shared stream (seed 000's TE revert makes the
    bridge keep RNGs, seed 001 shares them) adds no entry parameter, and diff says RNG state only: the change is in
    the RNG analysis's record, 3 streams x 7 dots x 2 layers = 42 dead counter increments per step (672 at 32
    layers, seed 000's kernels), on the shared Rngs, which NNX now keeps under its first holder's path."""
    plain, forced = te_lowered("te_fp8_currentscaling", 2), te_lowered("te_fp8_currentscaling", 2, "seed-001",
                                                                       "te-keeps-rngs")
    before, after = (analyze(path.read_text(), str(path)) for path in (plain, forced))
    assert before.summary.by_dtype == after.summary.by_dtype == {"f32": 63, "s32": 7, "u32": 7}
    assert diff_modules(before, after).verdict == "rng-state-only"
    old, new = before.rng.to_record(), after.rng.to_record()
    fields = ("streams", "carried", "dead_params", "dead_increments", "drawn_increments")
    assert [{k: r[k] for k in fields} for r in (old, new)] == [
        {"streams": 3, "carried": 3, "dead_params": 6, "dead_increments": 0, "drawn_increments": 0},
        {"streams": 3, "carried": 3, "dead_params": 6, "dead_increments": 42, "drawn_increments": 0}]
    shared = "model.decoder.layers_*.mlp.wi_0.TEWrapper_dot_general_0.to_nnx__rngs"
    assert {p["pattern"]: (p["dead_increments"], p["paths"]["carried"]) for p in new["patterns"]} == {
        f"{shared}.{s}": (14, [f"state.{shared.replace('*', '0')}.{s}"]) for s in ("aqt", "dropout", "params")}
    assert {p["pattern"]: p["dead_increments"] for p in old["patterns"]} == {
        f"model.decoder.layers_*.self_attention.rngs.{s}": 0 for s in ("aqt", "dropout", "params")}


@pytest.mark.te
def test_seed_001_patch_says_which_backends_share_and_is_undone_on_exit():
    """The patch's ApplyRngs, as seed 001 describes it: NVFP4 (stochastic rounding on) SHARED, the other TE recipes
    NONE, fp8 NONE, AQT PRIVATE; and MaxText is as released once the block is left."""
    import types

    from maxtext.layers import linears, moe, nnx_wrappers, quantizations

    from hlo_audit.targets import te

    te.load()
    released = (linears.DenseGeneral.__init__, moe.GateLogit.__init__)

    def te_backend(recipe):
        config = types.SimpleNamespace(quantization=recipe, te_comm_gemm_overlap=None)
        return quantizations.TransformerEngineQuantization(config)

    with injected_maxtext.seed_001():
        shared = {recipe: te_backend(recipe).apply_rngs.name
                  for recipe in ("te_nvfp4", "te_nvfp4_no_rht", "te_fp8_currentscaling", "te_mxfp8")}
        assert shared == {"te_nvfp4": "SHARED", "te_nvfp4_no_rht": "SHARED", "te_fp8_currentscaling": "NONE",
                          "te_mxfp8": "NONE"}
        assert quantizations.Fp8Quantization().apply_rngs.name == "NONE"
        assert quantizations.AqtQuantization.apply_rngs.fget(quantizations.AqtQuantization).name == "PRIVATE"
    assert (linears.DenseGeneral.__init__, moe.GateLogit.__init__) == released
    assert not hasattr(nnx_wrappers.ToNNX, "share_rngs") and not hasattr(quantizations, "ApplyRngs")
    assert not hasattr(te_backend("te_nvfp4"), "apply_rngs")
