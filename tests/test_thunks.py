"""Launches per step from XLA's GPU thunk sequence, on real deviceless compiles for an H100 (hlo/thunks.py,
launches.py, launch_model.py, launch_groups.py).

Every sequence here is made in the test: small jax functions and the NNX train steps of nnx_models.py, lowered
over compile-only H100s (hlo_audit/platforms/cuda.py) and compiled by XLA's GPU compiler on this CPU host through
stage compiled (hlo_audit/stages/compiled.py). The numbers asserted are what XLA 0.12.0.1's GPU pipeline emits
for them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import nnx_models
from cuda_probe import needs_cuda
from hlo_audit.examples.nnx_mlp import make_step
from hlo_audit.hlo.launch_groups import common_pattern, group_counts, group_delta, launch_delta
from hlo_audit.hlo.launch_model import module_launches, step_launches
from hlo_audit.hlo.launches import launch_report
from hlo_audit.hlo.params import entry_params
from hlo_audit.hlo.text import HloParseError, parse_module
from hlo_audit.hlo.thunks import ThunkParseError, category, parse_thunk_metadata, parse_thunk_sequence, thunk_dumps
from hlo_audit.lowering import CellConfigError
from hlo_audit.matrix import Cell
from hlo_audit.platforms.cuda import GPU_CONFIG_DIR, GpuTargetError, cuda_devices, device_name, target_config
from hlo_audit.stages import compiled as compiled_stage
from hlo_audit.stages.program import KEEP_DUMP_ENV

# One xdist group: the module's compiles are made once, not once per worker.
pytestmark = [needs_cuda, pytest.mark.xdist_group("thunks")]


def h100s(topology: str = "1x1x1"):
    return cuda_devices(target_config("h100"), topology)


def gpu_cell(name: str, topology: str = "1x1x1", gpu: str = "h100") -> Cell:
    """A compiled cell of a small program (its target is never asked: the test lowers it itself)."""
    return Cell(name, False, "none", 1, target="tests:unused", platform="cuda", device=device_name(gpu, topology),
                stage="compiled")


def compile_for_cuda(lowered, keep_dump: Path | None = None, cell: Cell | None = None):
    """Stage compiled of ``lowered`` for an H100 cell; with ``keep_dump``, XLA's dump is copied there."""
    cell = cell or gpu_cell("program")
    saved = os.environ.get(KEEP_DUMP_ENV)
    if keep_dump is not None:
        os.environ[KEEP_DUMP_ENV] = str(keep_dump)
    try:
        lowering = compiled_stage.run(lowered, cell)
    finally:
        if saved is None:
            os.environ.pop(KEEP_DUMP_ENV, None)
        else:
            os.environ[KEEP_DUMP_ENV] = saved
    if keep_dump is not None:  # the stage keeps it under the cell's id: move it up, as --xla_dump_to would be
        [kept] = list(keep_dump.iterdir())
        for path in kept.iterdir():
            path.rename(keep_dump / path.name)
        kept.rmdir()
    return lowering


def replicated(devices):
    return NamedSharding(Mesh(np.array(devices), ("x",)), P())


def lower_nnx(spec: nnx_models.ModelSpec, devices=None):
    """nnx_models' train step, lowered over compile-only H100s (the state replicated, donated)."""
    sharding = replicated(devices or h100s())
    graphdef, state = nnx.split(nnx.eval_shape(lambda: nnx_models.build(spec)))
    state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), state)
    x = jax.ShapeDtypeStruct((nnx_models.BATCH, spec.width), jnp.float32, sharding=sharding)
    return jax.jit(make_step(graphdef), donate_argnums=0).lower(state, x)


def report(compilation):
    module = parse_module(compilation.text)
    params = entry_params(module, compilation.arg_keys)
    return launch_report(compilation.dump["thunk_sequence"], compilation.dump["thunk_metadata"], module,
                         params), module, params


@pytest.fixture(scope="module")
def bridge_steps(tmp_path_factory):
    """ToNNX-bridged layers that never draw (seed 000's pattern): each layer keeps a fork of both streams and
    advances both counts every call. 2 and 4 layers, unrolled, and scanned at 4."""
    out = {}
    for name, spec in {"L2": nnx_models.ModelSpec(layers=2, bridge="nodraw"),
                       "L4": nnx_models.ModelSpec(layers=4, bridge="nodraw"),
                       "scan_L4": nnx_models.ModelSpec(layers=4, bridge="nodraw", scan=True)}.items():
        dump = tmp_path_factory.mktemp(name)
        out[name] = (compile_for_cuda(lower_nnx(spec), keep_dump=dump), dump)
    return out


def control_flow(x, w, c, key):
    """A scan (while with a known trip count), a cond, a fori_loop with a traced bound, a draw."""
    def body(carry, wi):
        h = jnp.tanh(carry @ wi)
        return h, h.sum()
    h, s = jax.lax.scan(body, x, w)
    h = jax.lax.cond(c > 0, lambda h: h * 2, lambda h: jnp.sort(h, axis=-1), h)
    i = jax.lax.fori_loop(0, c, lambda i, v: v + 1, jnp.uint32(0))
    return h, s, c + 1, i, jax.random.normal(key, (4,))


@pytest.fixture(scope="module")
def control_flow_compile(tmp_path_factory):
    sharding = replicated(h100s())
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in
            (((64, 256), jnp.float32), ((3, 256, 256), jnp.float32), ((), jnp.int32), ((2,), jnp.uint32))]
    dump = tmp_path_factory.mktemp("control_flow")
    return compile_for_cuda(jax.jit(control_flow).lower(*args), keep_dump=dump), dump


# --------------------------------------------------------------------------------------------------------------
# Attribution: the per-layer RNG counters
# --------------------------------------------------------------------------------------------------------------

def test_each_bridge_counter_is_one_scalar_kernel_reading_it(bridge_steps):
    compilation, _ = bridge_steps["L2"]
    launches, _, params = report(compilation)
    counts = {p.index: p.path for p in params if p.role == "rng_count" and ".bridge." in p.path}
    assert len(counts) == 4  # 2 layers x 2 streams (params, dropout)
    readers = {}
    for launch in launches.launches:
        for index in launch.reads:
            if index in counts:
                readers.setdefault(counts[index], []).append(launch)
    # Every counter is read by exactly one launch: a scalar loop_add_fusion (grid 1x1x1, one thread).
    assert sorted(readers) == sorted(counts.values())
    for path, readers_of in readers.items():
        assert [(r.name, r.category, r.grid, r.threads, r.is_scalar) for r in readers_of] == [
            ("loop_add_fusion", "kernel", (1, 1, 1), (1, 1, 1), True)], path
    assert launches.attributed and launches.exact


def test_two_more_layers_add_their_counter_kernels(bridge_steps):
    (l2, _), (l4, _) = bridge_steps["L2"], bridge_steps["L4"]
    before, after = report(l2)[0], report(l4)[0]
    scalar = launch_delta(before, after, scalar_only=True)
    assert [g.describe(signed=True) for g in scalar] == [
        "+4 scalar kernels loop_add_fusion, each reading state.layers_*.bridge.to_nnx__rngs.*.count"]
    assert after.scalar - before.scalar == 4
    # Per layer: the same launches again, nothing else.
    assert (after.total - before.total) % 2 == 0
    per_layer = (after.total - before.total) // 2
    assert per_layer == sum(g.count for g in launch_delta(before, after)) // 2


def test_records_give_the_reports_attribution(bridge_steps):
    """What a result and a golden keep (``group_counts``) differ as the reports do (``launch_delta``), and a stage's
    kept dump gives the report (``step_launches``): thunks when compiled, the module when there are none."""
    (l2, _), (l4, _) = bridge_steps["L2"], bridge_steps["L4"]
    before, after = report(l2)[0], report(l4)[0]
    assert [g.describe(signed=True) for g in group_delta(group_counts(before), group_counts(after))] == [
        g.describe(signed=True) for g in launch_delta(before, after)]
    assert sum(group_counts(after).values()) == after.total
    assert "kernel scalar loop_add_fusion [rng_count] state.layers_*.bridge.to_nnx__rngs.params.count" in group_counts(
        after)
    only_rng = group_delta(group_counts(before), group_counts(after), reading=("rng_key", "rng_count"))
    assert [g.describe(signed=True) for g in only_rng] == [
        "+4 scalar kernels loop_add_fusion, each reading state.layers_*.bridge.to_nnx__rngs.*.count"]
    module = parse_module(l4.text)
    params = entry_params(module, l4.arg_keys)
    assert step_launches(module, params, l4.dump).to_record() == after.to_record()
    from_module = step_launches(module, params, {})
    assert from_module.from_module and (from_module.total, from_module.by_kind) == (after.total, after.by_kind)
    assert step_launches(module, params, None) is None  # not a GPU program's


def test_a_scanned_body_counts_once_per_layer(bridge_steps):
    (scan, _), (unrolled, _) = bridge_steps["scan_L4"], bridge_steps["L4"]
    launches = report(scan)[0]
    assert launches.exact and not launches.unknown_trip_counts
    in_body = [launch for launch in launches.launches if launch.scope and launch.scope[-1].endswith(":body")]
    assert in_body and {launch.times for launch in in_body} == {4}
    # The scanned step runs its layer's launches 4 times: more launches per step than thunks in the program.
    assert launches.total > launches.static
    assert launches.total == sum(launch.times for launch in launches.launches)
    assert report(unrolled)[0].static > launches.static


def test_the_dump_folder_gives_the_same_report(bridge_steps):
    compilation, dump = bridge_steps["L2"]
    [found] = [d for d in thunk_dumps(dump) if "train_step" in d.prefix]
    assert found.metadata is not None and re.search(r"sm_9\.0a_gpu_after_optimizations\.txt$",
                                                    found.after_optimizations.name)
    sequence, metadata, text = found.read()
    assert (sequence, metadata) == (compilation.dump["thunk_sequence"], compilation.dump["thunk_metadata"])
    module = parse_module(text)
    assert text == compilation.text  # the stage's module is the dump's: the one the thunk metadata names
    from_dump = launch_report(sequence, metadata, module, entry_params(module))  # paths from the module's names
    from_stage = report(compilation)[0]
    assert from_dump.to_record() == from_stage.to_record()


# --------------------------------------------------------------------------------------------------------------
# Counting: nesting, loops, branches, command buffers, collectives
# --------------------------------------------------------------------------------------------------------------

def test_control_flow_is_counted_per_step(control_flow_compile):
    compilation, _ = control_flow_compile
    launches, _, _ = report(compilation)
    scopes = {launch.scope for launch in launches.launches}
    loops = sorted({scope[0].split(":")[0] for scope in scopes if scope and scope[0].startswith("while")})
    assert len(loops) == 2
    scan_loop = next(s[0].split(":")[0] for s in scopes if s and any(
        launch.name == "gemm_fusion_dot" and launch.scope == s for launch in launches.launches))
    # The scan's body runs 3 times, its condition 4; the fori_loop's bound is traced, so its trip is unknown.
    by_scope = {}
    for launch in launches.launches:
        by_scope.setdefault(launch.scope, set()).add(launch.times)
    assert by_scope[(f"{scan_loop}:body",)] == {3} and by_scope[(f"{scan_loop}:condition",)] == {4}
    other = next(loop for loop in loops if loop != scan_loop)
    assert launches.unknown_trip_counts == (other,) and not launches.exact
    # The cond: its branches are both listed, only the largest counts (sort: a copy and a kernel; else 1).
    branch = [launch for launch in launches.launches if launch.scope and launch.scope[0].endswith("_branch")]
    assert sorted((launch.scope[0].split(":")[1], launch.counted) for launch in branch) == [
        ("false_branch", False), ("true_branch", True), ("true_branch", True)]
    assert launches.conditionals == 1
    assert launches.total == sum(launch.per_step for launch in launches.launches)
    # Through the loop state: the body's matmul reads the carry, whose initial value is x (XLA copies x into the
    # loop's buffer first: the copy is followed too).
    paths = launches.param_by_number()
    [gemm] = [launch for launch in launches.launches if launch.name == "gemm_fusion_dot"]
    assert [paths[i].path for i in gemm.reads] == ["x"]
    # The dynamic-slice fusion's embedded copy has no metadata of its own: it takes its fusion's, and reads w.
    copies = [launch for launch in launches.launches if launch.name == "loop_dynamic_slice_fusion"]
    assert [launch.kind for launch in copies] == ["kCopy"]
    assert [paths[i].path for i in copies[0].reads] == ["w"]


def test_command_buffers_hold_the_same_launches(control_flow_compile):
    compilation, dump = control_flow_compile
    after_passes = next(dump.glob("*jit_control_flow.thunk_sequence_after_thunk_passes.txt")).read_text()
    assert "kCommandBuffer" in after_passes
    module = parse_module(compilation.text)
    plain = launch_report(compilation.dump["thunk_sequence"], compilation.dump["thunk_metadata"], module)
    wrapped = launch_report(after_passes, compilation.dump["thunk_metadata"], module)
    assert wrapped.thunks > plain.thunks  # the command buffers themselves
    assert [launch.to_record() for launch in wrapped.launches] == [launch.to_record() for launch in plain.launches]


def test_collectives_on_eight_gpus():
    devices = h100s("1x1x8")
    mesh = Mesh(np.array(devices), ("x",))
    x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(mesh, P(None, "x")))
    compilation = compile_for_cuda(jax.jit(lambda a, b: (jnp.tanh(a @ b).sum(), a + 1)).lower(x, w),
                                   cell=gpu_cell("collectives", "1x1x8"))
    launches, module, params = report(compilation)
    assert launches.collectives == 2
    assert launches.by_kind == {"kCustomKernel": 6, "kAllGather": 1, "kCollectiveKernel": 1}
    assert compilation.memory["argument_bytes"] == 2 * 128 * 1024 * 4  # one GPU's shards
    assert module_launches(module, params).by_kind == launches.by_kind


def test_the_scheduled_module_predicts_the_sequence(bridge_steps, control_flow_compile):
    for compilation, _ in [*bridge_steps.values(), control_flow_compile]:
        launches, module, params = report(compilation)
        predicted = module_launches(module, params)
        if compilation is control_flow_compile[0]:
            # Codegen's one addition: the sort fusion copies its operand into its output buffer first.
            assert predicted.total == launches.total - 1 and predicted.by_kind["kCopy"] == launches.by_kind["kCopy"] - 1
            continue
        assert (predicted.total, predicted.by_kind, predicted.scalar) == (launches.total, launches.by_kind,
                                                                         launches.scalar)
        assert sorted((x.instruction, x.reads) for x in predicted.launches) == sorted(
            (x.instruction, x.reads) for x in launches.launches)


# --------------------------------------------------------------------------------------------------------------
# Reading the files
# --------------------------------------------------------------------------------------------------------------

def test_nesting_and_launch_dimensions_are_read(control_flow_compile):
    compilation, _ = control_flow_compile
    sequence = compilation.dump["thunk_sequence"]
    thunks = parse_thunk_sequence(sequence)
    assert len(thunks) == len(sequence.strip().splitlines()) - sum(
        1 for line in sequence.splitlines() if line.strip().endswith(":"))
    loops = [t for t in thunks if t.kind == "kWhile"]
    assert {thunks[t.parent].kind for t in thunks if t.parent is not None} >= {"kWhile", "kConditional"}
    assert {t.region for t in thunks if t.parent == loops[0].position} == {"condition", "body"}
    gemm = next(t for t in thunks if t.kernel.startswith("gemm_fusion"))
    assert gemm.grid[0] > 1 and gemm.threads[0] > 1 and gemm.shared_memory >= 0 and not gemm.is_scalar
    annotations = parse_thunk_metadata(compilation.dump["thunk_metadata"])
    assert annotations[loops[0].id].startswith("while")


def test_bad_files_are_one_line_errors(control_flow_compile):
    compilation, _ = control_flow_compile
    lines = compilation.dump["thunk_sequence"].splitlines()
    broken = "\n".join([*lines[:3], "this is not a thunk", *lines[3:]])
    with pytest.raises(ThunkParseError, match=r"^seq\.txt:4: not a thunk line") as error:
        parse_thunk_sequence(broken, "seq.txt")
    assert isinstance(error.value, HloParseError) and "\n" not in str(error.value)
    with pytest.raises(ThunkParseError, match="no thunk_metadata entries"):
        parse_thunk_metadata("garbage {", "meta.txt")


def test_without_metadata_counts_stand_but_nothing_is_attributed(bridge_steps):
    compilation, _ = bridge_steps["L2"]
    bare = launch_report(compilation.dump["thunk_sequence"])
    full = report(compilation)[0]
    assert (bare.total, bare.by_kind, bare.scalar) == (full.total, full.by_kind, full.scalar)
    assert not bare.attributed and all(not launch.reads for launch in bare.launches)


def test_categories():
    assert [category(k) for k in ("kCustomKernel", "kKernel", "kGemm", "kCustomCall", "kCuDnn", "kCopy",
                                  "kMemzero", "kAllReduceStart", "kAllReduceDone", "kAllGather",
                                  "kCollectiveKernel", "kWhile", "kAsyncDone", "kHostSend", "kSomethingNew")] == [
        "kernel", "kernel", "library", "library", "library", "copy", "memset", "collective", "", "collective",
        "collective", "", "", "host", "other"]


def test_common_pattern():
    assert common_pattern([
        "state.model.decoder.layers_0.mlp.wi_0.to_nnx__rngs.aqt.count",
        "state.model.decoder.layers_1.self_attention.query.to_nnx__rngs.params.count"]) == (
        "state.model.decoder.layers_*.*.to_nnx__rngs.*.count")
    assert common_pattern(["state.a.b.count", "state.a.x.y.count"]) == "state.a.*.count"
    assert common_pattern(["state.layers_3.w"]) == "state.layers_*.w"
    assert common_pattern([]) == ""


# --------------------------------------------------------------------------------------------------------------
# The shipped GPU target configs
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(GPU_CONFIG_DIR.glob("*.txtpb")), ids=lambda p: p.stem)
def test_every_shipped_config_parses_with_its_comments_and_compiles(path: Path):
    text = path.read_text()
    assert re.search(r"^\s*#", text, re.M)  # the comments citing sources are there, and XLA accepts them
    name = re.search(r'^device_description_str: "([^"]+)"', text, re.M).group(1)
    major = int(re.search(r"cuda_compute_capability \{\s*major: (\d+)", text).group(1))
    [device] = cuda_devices(text)
    assert device.device_kind == name
    sharding = replicated([device])
    x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16, sharding=sharding)
    compilation = compile_for_cuda(jax.jit(lambda a: jnp.tanh(a @ a.T).sum()).lower(x), cell=gpu_cell("config", gpu=path.stem))
    header = compilation.text.splitlines()[0]
    assert header.startswith("HloModule jit__lambda")
    assert report(compilation)[0].total >= 2
    assert major in (8, 9, 10)


def test_an_unknown_field_is_rejected_not_ignored():
    text = target_config("h100").replace("core_count:", "core_kount:")
    with pytest.raises(GpuTargetError, match="Failed to parse GpuTargetConfigProto") as error:
        cuda_devices(text)
    assert isinstance(error.value, CellConfigError) and "\n" not in str(error.value)  # the cell's one-line error


def test_a_dumped_config_is_a_target_config(control_flow_compile):
    _, dump = control_flow_compile
    dumped = next(dump.glob("*.gpu_target_config.pbtxt")).read_text()
    assert cuda_devices(dumped)[0].device_kind == "NVIDIA H100 80GB HBM3"
