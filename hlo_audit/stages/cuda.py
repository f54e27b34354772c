"""Stages compiled and optimized for CUDA: XLA's GPU compiler on any host, for a named GPU.

XLA's GPU compiler needs no GPU. jax's CUDA plugin gives compile-only devices for a ``GpuTargetConfig`` (the
device facts: compute capability, SMs, memory, bandwidth, caches, clocks, cuDNN and runtime versions; the project
ships one per named GPU in ``hlo_audit/platforms/gpus/``) and a topology (``"1x1x1"``; ``"1x1x8"`` one host of
eight GPUs; ``"1x8x1"`` eight hosts of one: ``<partitions>x<hosts per partition>x<devices per host>``). A jax
``Lowered`` made for a mesh of them compiles through the whole pipeline: HLO passes, Triton gemm fusions,
scheduling, buffer assignment, thunk emission, LLVM and ptxas (the pinned ``nvidia-cuda-nvcc`` wheel's).

* ``cuda_devices(target_config, topology)``: those devices, cached per process. The plugin registers only if jax
  starts it without a GPU check: on a host without a GPU, ``JAX_PLATFORMS=cpu`` before jax starts (otherwise
  its version check calls ``cuInit``, which fails with error 303, and the platform is missing: "topology not
  implemented for cuda"). hlo-audit's own processes set it on hosts without accelerators.
* ``compile_for_cuda(lowered)``: the full compile with XLA's dump in a temporary folder, set through the
  compile's own options (so whatever ``XLA_FLAGS`` says, the dump is this compile's, in XLA's long form with
  metadata, as the TPU optimized stage keeps it). It returns the module after optimizations, the memory per GPU
  (``memory_analysis()``: argument, output, alias, temp, generated code), the cost (XLA's generic
  ``HloCostAnalysis`` of the compiled module: a GPU executable has no ``cost_analysis()``),
  XLA's entry parameter shapes and jax's argument keys where they agree with them in order, and the thunk
  sequence and metadata: what one step launches (``hlo/thunks.py``).
* ``optimize_for_cuda(lowered, target_config, topology)``: stopped once the optimized module and its buffer
  assignment exist, as the TPU ``optimized`` stage does: the compile request jax would make is captured and run
  in a child process that exits as soon as XLA has dumped both, abandoning codegen (an XLA compile cannot be
  cancelled in-process). Measured on the 2-core CPU machine (scripts/gpu_probe.py, MaxText llama3-8b L2): it
  costs 0.59-0.69 of the full compile's CPU seconds on H100 (0.90 for B200 NVFP4), not the 0.5 hoped for: XLA's
  passes up to buffer assignment are 55-70% of the GPU compile (on the TPU it is a tenth), most of it in the
  deviceless autotuner's config assignment (``xla_gpu_autotune_level=0`` skips it: 15.9 -> 6.5 s for llama3-8b L2
  unquantized, the same thunk sequence, but the optimized module then lacks its fusions' ``backend_config``s), and
  the child's jax import and devices add 1.5-2.5 s. What it cannot know: the thunk sequence (written only after LLVM and ptxas), so launch
  dimensions, and the kernels codegen adds beyond the module's instructions (a sort fusion's copy into its
  output buffer); ``module_launches`` counts the rest from the scheduled module, and measured equal to the thunk
  sequence on the MaxText cells (scripts/gpu_probe.py). It cannot run Transformer Engine on more than one GPU:
  TE partitions its ops through ``custom_partitioning`` callbacks that live in the lowering process, so such a
  module (``CustomSPMDPartitioning`` custom calls) is refused with that reason; stage compiled compiles it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hlo_audit.hlo.params import entry_params
from hlo_audit.hlo.text import parse_module
from hlo_audit.hlo.thunks import LaunchReport, launch_report, module_launches

GPU_CONFIG_DIR = Path(__file__).resolve().parent.parent / "platforms" / "gpus"
_TOPOLOGY = re.compile(r"^\d+x\d+x\d+$")
# The dump's module after optimizations: `module_0001.jit_train_step.sm_9.0a_gpu_after_optimizations.txt`.
_MODULE = re.compile(r"^module_\d+\..+\.(?:[\w.]+_)?gpu_after_optimizations\.txt$")
_BUFFERS_SUFFIX = "gpu_after_optimizations-buffer-assignment.txt"
_SEQUENCE_SUFFIX = ".thunk_sequence.txt"
_METADATA_SUFFIX = ".thunk_metadata.txt"
_POLL_SECONDS = 0.05
_CUSTOM_PARTITIONING = b"CustomSPMDPartitioning"


class CudaCompileError(RuntimeError):
    """A deviceless CUDA compile failed or could not start; the reason, on one line."""


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its waited-for children so far."""
    import resource  # noqa: PLC0415

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


# --------------------------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------------------------

def gpu_target_config(name_or_path: str) -> str:
    """The text of a shipped GPU's target config (``h100``, ``b200``...) or of a ``.txtpb`` file."""
    path = Path(name_or_path)
    if path.suffix != ".txtpb":
        path = GPU_CONFIG_DIR / f"{name_or_path}.txtpb"
    if not path.is_file():
        shipped = sorted(p.stem for p in GPU_CONFIG_DIR.glob("*.txtpb"))
        raise CudaCompileError(f"no GPU target config {name_or_path!r} (shipped: {', '.join(shipped)}; or a "
                               "path to a .txtpb file)")
    return path.read_text()


@functools.cache
def cuda_devices(target_config: str, topology: str = "1x1x1") -> tuple:
    """Compile-only CUDA devices for a ``GpuTargetConfig`` text proto and a topology (module doc)."""
    if not _TOPOLOGY.match(topology):
        raise CudaCompileError(f"CUDA topology {topology!r} is not <partitions>x<hosts>x<devices per host>, "
                               "e.g. 1x1x8")
    from jax.experimental.topologies import get_topology_desc  # noqa: PLC0415

    try:
        return tuple(get_topology_desc(platform="cuda", target_config=target_config, topology=topology).devices)
    except NotImplementedError as error:
        raise CudaCompileError(
            "jax's CUDA plugin is not registered (install jax-cuda12-plugin; on a host without a GPU set "
            f"JAX_PLATFORMS=cpu before jax starts, so the plugin skips its device check): {_one_line(error)}"
        ) from error
    except Exception as error:  # noqa: BLE001 (XLA's parse error of the config, as one line)
        raise CudaCompileError(f"compile-only CUDA devices for topology {topology}: {_one_line(error)}") from error


# --------------------------------------------------------------------------------------------------------------
# What both stages return
# --------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CudaCompilation:
    """One deviceless CUDA compile (stage ``compiled``) or its optimization half (stage ``optimized``)."""

    stage: str  # "compiled" | "optimized"
    module: str  # the module after optimizations, XLA's long form (SPMD-partitioned: one GPU's program)
    memory: dict[str, int] | None  # per GPU: argument, output, alias, temp (+ generated code when compiled)
    cost: dict[str, float] | None  # flops, transcendentals, bytes_accessed
    parameters: tuple[tuple[str, tuple[int, ...]], ...]  # XLA's entry parameter (dtype, per-GPU dims), in order
    arg_keys: tuple[tuple[str, ...], ...] | None  # jax's argument keys, when they are ``parameters`` in order
    thunk_sequence: str | None  # what one step launches (stage compiled only)
    thunk_metadata: str | None
    seconds: float  # the compile (stage optimized: the capture, the child and its wait)
    # CPU seconds (user + system) the same took, this process's and the child's: on a shared machine the fairer
    # measure of what the stage costs, since wall time there is mostly other work's.
    cpu_seconds: float | None = None
    # The child's peak RSS (stage optimized), which the parent's own peak does not include.
    child_peak_rss_bytes: int | None = None
    # Stage optimized: seconds of the capture, of the child's setup (jax, devices, module) and of XLA's work.
    phases: dict[str, float] | None = None

    def launches(self) -> LaunchReport:
        """Launches per step: from the thunk sequence (compiled), else from the scheduled module (optimized)."""
        module = parse_module(self.module, "<optimized module>")
        params = entry_params(module, self.arg_keys)
        if self.thunk_sequence is not None:
            return launch_report(self.thunk_sequence, self.thunk_metadata, module, params)
        return module_launches(module, params)

    def to_record(self) -> dict:
        """The stage's facts for JSON (the module text and thunk files are left to the caller)."""
        return {"stage": self.stage, "memory": self.memory, "cost": self.cost,
                "parameters": [[dtype, list(dims)] for dtype, dims in self.parameters],
                "arg_keys_checked": self.arg_keys is not None, "seconds": round(self.seconds, 3),
                "cpu_seconds": None if self.cpu_seconds is None else round(self.cpu_seconds, 3),
                "child_peak_rss_bytes": self.child_peak_rss_bytes, "phases": self.phases}


def _dump_options(dump: Path) -> dict[str, object]:
    """The dump is this stage's output: its form is fixed here whatever XLA_FLAGS says (text, every module, XLA's
    long form with metadata, large constants as ``{...}``)."""
    return {"xla_dump_to": str(dump), "xla_dump_hlo_as_text": True, "xla_dump_hlo_as_long_text": True,
            "xla_dump_hlo_module_re": ".*", "xla_dump_large_constants": False, "xla_dump_disable_metadata": False}


def _dumped(dump: Path, pattern: re.Pattern | None = None, suffix: str = "") -> Path | None:
    """The one file of the compiled module in the dump matching ``pattern`` or ending with ``suffix``."""
    files = sorted(p for p in dump.iterdir() if (pattern.match(p.name) if pattern else p.name.endswith(suffix)))
    if len(files) > 1:  # one compile dumps one module; more means jax compiled helpers too: the largest is ours
        files.sort(key=lambda p: p.stat().st_size)
    return files[-1] if files else None


# --------------------------------------------------------------------------------------------------------------
# Stage compiled
# --------------------------------------------------------------------------------------------------------------

def compile_for_cuda(lowered, *, context: contextlib.AbstractContextManager | None = None,
                     keep_dump: Path | None = None) -> CudaCompilation:
    """The full deviceless compile of ``lowered`` (lowered for ``cuda_devices``), with what it tells (module doc).

    ``context``: entered around the compile, for code that runs inside XLA's compile (Transformer Engine's
    partitioning callbacks assert the mesh resource MaxText sets around its step). ``keep_dump``: copy XLA's dump
    there instead of deleting it.
    """
    from hlo_audit.stages.compiled import compiled_parameter_signatures, kept_argument_signatures, memory_record  # noqa: PLC0415
    from hlo_audit.stages.program import checked_arg_keys, cost_record  # noqa: PLC0415
    from hlo_audit.attribution import arg_keys  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="hlo-audit-cuda-") as work:
        dump = Path(work)
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        try:
            with context or contextlib.nullcontext():
                compiled = lowered.compile(compiler_options=_dump_options(dump))
        except Exception as error:  # noqa: BLE001 (XLA's message is the cell's)
            raise CudaCompileError(_one_line(error)) from error
        seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
        module_path, sequence, metadata = _dumped(dump, _MODULE), _dumped(dump, suffix=_SEQUENCE_SUFFIX), \
            _dumped(dump, suffix=_METADATA_SUFFIX)
        if module_path is None or sequence is None:
            raise CudaCompileError(f"XLA dumped no optimized module or thunk sequence to {dump} (a compile cache "
                                   "answered, or this XLA names its dump files otherwise)")
        text, sequence_text = module_path.read_text(), sequence.read_text()
        metadata_text = metadata.read_text() if metadata else None
        if keep_dump is not None:
            import shutil  # noqa: PLC0415

            shutil.copytree(dump, keep_dump, dirs_exist_ok=True)
    signatures = compiled_parameter_signatures(compiled) or []
    modules = compiled.runtime_executable().hlo_modules()
    return CudaCompilation(
        stage="compiled", module=text, memory=memory_record(compiled),
        cost=cost_record(compiled) or (_generic_cost(modules[0]) if len(modules) == 1 else None),
        parameters=tuple((dtype, tuple(dims)) for dtype, dims, _sharding in signatures),
        arg_keys=checked_arg_keys(arg_keys(lowered), kept_argument_signatures(compiled), signatures or None),
        thunk_sequence=sequence_text, thunk_metadata=metadata_text,
        seconds=seconds, cpu_seconds=cpu)


def _generic_cost(module) -> dict[str, float]:
    """XLA's device-independent HloCostAnalysis of an ``HloModule``: a GPU executable has no cost analysis of its
    own (``cost_analysis()`` is None, ``GetCostAnalysis is not supported``), and the compile-only CUDA client
    cannot run one, so both CUDA stages report this one, computed by the CPU client as the TPU optimized stage does."""
    import jax  # noqa: PLC0415
    from jax._src.lib import _jax  # noqa: PLC0415

    from hlo_audit.stages.program import COST_FIELDS  # noqa: PLC0415

    cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    return {key: float(cost[name]) for name, key in COST_FIELDS.items() if name in cost}


# --------------------------------------------------------------------------------------------------------------
# Stage optimized
# --------------------------------------------------------------------------------------------------------------

def optimize_for_cuda(lowered, target_config: str, topology: str = "1x1x1") -> CudaCompilation:
    """The module after XLA's GPU optimizations and its buffer assignment, without codegen (module doc).

    ``lowered`` must have been lowered for ``cuda_devices(target_config, topology)``: the child builds the same
    devices and compiles jax's own request (options, device assignment) for them.
    """
    from hlo_audit.attribution import arg_keys  # noqa: PLC0415
    from hlo_audit.stages.optimized import compile_request  # noqa: PLC0415 (jax's captured request)
    from hlo_audit.stages.program import checked_arg_keys, lowered_argument_signatures  # noqa: PLC0415

    start, cpu_start = time.perf_counter(), _cpu_seconds()
    module, options, device_ids = compile_request(lowered)
    captured = time.perf_counter()
    if _CUSTOM_PARTITIONING in module:
        raise CudaCompileError("the module partitions ops through jax custom_partitioning callbacks (Transformer "
                               "Engine on more than one GPU), which only the lowering process holds: stage "
                               "optimized runs XLA in a child; use stage compiled")
    with tempfile.TemporaryDirectory(prefix="hlo-audit-cuda-optimize-") as work:
        work = Path(work)
        (work / "module.mlirbc").write_bytes(module)
        (work / "options.pb").write_bytes(options)
        (work / "target_config.txtpb").write_text(target_config)
        (work / "request.json").write_text(json.dumps({"topology": topology, "device_ids": device_ids}))
        # The child compiles for compile-only devices only: the CUDA plugin must skip its device check. It
        # imports this hlo_audit, wherever the parent found it.
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "JAX_PLATFORMS": "cpu",
               "PYTHONPATH": os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        child = subprocess.run([sys.executable, "-m", "hlo_audit.stages.cuda", str(work)], env=env, check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
        result_path = work / "result.json"
        if not result_path.exists():
            last = [line for line in child.stderr.splitlines() if line.strip()][-1:] or [f"exit {child.returncode}"]
            raise CudaCompileError(f"the child running XLA's GPU optimizations failed: {last[0].strip()}")
        result = json.loads(result_path.read_text())
        if "error" in result:
            raise CudaCompileError(result["error"])
        text = Path(result["module"]).read_text()
    parameters = tuple((dtype, tuple(dims)) for dtype, dims in result["parameters"])
    return CudaCompilation(
        stage="optimized", module=text, memory=result["memory"], cost=result["cost"], parameters=parameters,
        arg_keys=checked_arg_keys(arg_keys(lowered), lowered_argument_signatures(lowered),
                                  [(d, dims, None) for d, dims in parameters]), thunk_sequence=None,
        thunk_metadata=None, seconds=time.perf_counter() - start, cpu_seconds=_cpu_seconds() - cpu_start,
        child_peak_rss_bytes=result.get("peak_rss_bytes"),
        phases={"capture": round(captured - start, 3), **result.get("child_seconds", {})})


def _child(work: Path) -> None:
    """``python -m hlo_audit.stages.cuda DIR``: run the request to buffer assignment, write ``result.json``, exit
    without waiting for codegen."""
    try:
        result = _optimize(work)
        result["child_seconds"] = {"setup": round(_SETUP_DONE - _CHILD_START, 3),
                                   "xla": round(time.perf_counter() - _SETUP_DONE, 3)}
    except Exception as error:  # noqa: BLE001 (XLA's message is the cell's, reported by the parent)
        result = {"error": _one_line(error)}
    import resource  # noqa: PLC0415

    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    (work / "result.json.partial").write_text(json.dumps(result))
    os.replace(work / "result.json.partial", work / "result.json")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the compile thread is still generating code nobody reads: do not wait for it


def _optimize(work: Path) -> dict:
    from jax._src.interpreters import mlir  # noqa: PLC0415
    from jax._src.lib import hlo, xla_client  # noqa: PLC0415
    from jax._src.lib.mlir import ir  # noqa: PLC0415

    from hlo_audit.stages.program import parameter_shapes  # noqa: PLC0415
    from hlo_audit.stages.optimized import memory_from_buffer_assignment  # noqa: PLC0415

    request = json.loads((work / "request.json").read_text())
    devices = {d.id: d for d in cuda_devices((work / "target_config.txtpb").read_text(), request["topology"])}
    executable_devices = xla_client.DeviceList(tuple(devices[i] for i in request["device_ids"]))
    client = executable_devices[0].client
    dump = work / "dump"
    options = xla_client.CompileOptions.ParseFromString((work / "options.pb").read_bytes())
    options.env_option_overrides = [*options.env_option_overrides, *_dump_options(dump).items()]
    module = ir.Module.parse((work / "module.mlirbc").read_bytes(), context=mlir.make_ir_context())
    global _SETUP_DONE
    _SETUP_DONE = time.perf_counter()

    ended: list[BaseException | None] = []

    def compile_in_thread() -> None:
        try:
            client.compile(module, executable_devices=executable_devices, compile_options=options)
            ended.append(None)
        except BaseException as error:  # noqa: BLE001 (handed to the polling thread)
            ended.append(error)

    threading.Thread(target=compile_in_thread, daemon=True).start()
    # XLA writes the buffer assignment, then the module after optimizations, then starts emitting code. A file
    # can exist before it is complete, so both must also keep their size for one poll and the module parse.
    sizes: tuple = ()
    while True:
        if ended and ended[0] is not None:
            raise ended[0]
        found = (_dumped(dump, _MODULE), _dumped(dump, suffix=_BUFFERS_SUFFIX)) if dump.is_dir() else (None, None)
        if all(found):
            now = tuple(p.stat().st_size for p in found)
            if now == sizes:
                text = found[0].read_text()
                try:
                    parsed = hlo.hlo_module_from_text(text)
                    break
                except Exception:  # noqa: BLE001 (still being written)
                    if ended:
                        raise
            sizes = now
        elif ended:
            raise CudaCompileError(f"XLA's compile ended without dumping an optimized module and buffer "
                                   f"assignment to {dump}")
        time.sleep(_POLL_SECONDS)
    return {"module": str(found[0]), "parameters": parameter_shapes(parsed),
            "memory": memory_from_buffer_assignment(found[1].read_text()), "cost": _generic_cost(parsed)}


_CHILD_START = _SETUP_DONE = time.perf_counter()  # the child's own clock: jax's import and devices vs XLA's work

if __name__ == "__main__":
    _child(Path(sys.argv[1]))
