"""Stage ``optimized``: XLA's optimization pipeline and buffer assignment for compile-only devices, without codegen.

Why this stage exists: MaxText's own HLO gate (its ``tests/integration/hlo_diff_test.py``) compares the
``*.after_optimizations.txt`` file that a full ``train_compile`` dumps. For a TPU topology, getting there is a
small part of the compile. llama3-8b at 4 layers for v6e-4 on the 2-core CI machine: ~1-2 s of HLO passes and
buffer assignment, then ~21 s of TPU code generation, whose output neither that gate nor this tool reads. Stage
``compiled`` pays for codegen because what it reports needs it: the codegen-annotated text,
``generated_code_bytes`` and the backend's cost model. Stage ``optimized`` gives the module MaxText's gate diffs,
in a tenth of the compile time. For a named GPU the saving is smaller (XLA's GPU passes up to buffer assignment
are 55-70% of its compile, most of it the deviceless autotuner's config assignment: docs/gpu.md), and what only
codegen writes, the thunk sequence, is not there: launches per step are counted from the scheduled module instead
(``hlo.launch_model.module_launches``).

How, since jax has no call that stops after the HLO passes and an XLA compile cannot be cancelled:

1. ``compile_request``: the compile jax would run is captured instead of run. ``lowered.compile()`` is called
   with jax's backend compile call replaced, for that call only, by one that records the module, the
   ``CompileOptions`` and the device order, then stops. The options are therefore jax's own (SPMD partitioning,
   device assignment, jax's debug options, a user's ``compiler_options``), not a copy of how jax builds them.
2. A child process (``python -m hlo_audit.stages.optimized DIR``) builds the same devices' compile-only client (the
   cell's platform's ``compile_devices``) and compiles that request in a thread, with XLA's dump on. XLA writes
   the module after optimizations and its buffer assignment, then a file the platform names
   (``HostPlatform.dump_files``: libtpu's ``*.after_optimizations_after_buffer_assignment.txt``, the GPU
   compiler's ``*-memory-usage-report.txt``). Once that file exists and the first two have kept their size for a
   moment and the module parses, they are complete (the GPU compiler writes a module's dump files concurrently: the
   done file alone does not say so). The child reads them, writes its result and exits, abandoning codegen. If the
   compile ends first
   (an XLA error, such as the program not fitting in memory), it reports how it ended. An error that only codegen
   would raise is never seen here; stage compiled sees it. A module that partitions ops through jax
   ``custom_partitioning`` callbacks (Transformer Engine on more than one GPU) is refused: the callbacks live in
   the lowering process, which XLA in the child cannot call back into.
3. ``memory``: argument, output and alias bytes are the buffer assignment's parameter and maybe-live-out
   allocations, which is what the compiled executable's ``memory_analysis()`` reports (tests compare them).
   ``temp_bytes`` is the preallocated temp buffer of the default memory space. Codegen adds scratch to it, so
   stage compiled's is a little larger (16 KiB for llama3-8b L4 on v6e-4). ``generated_code_bytes`` is absent,
   since no code is generated.
4. ``cost``: XLA's device-independent ``HloCostAnalysis`` of the optimized module. Its flops and
   transcendentals equal the TPU compile's; its bytes accessed follow the generic model, not the TPU's
   (32,408,725,504 vs 32,431,265,792 B for llama3-8b L4). A GPU compile has no other (stage compiled reports the
   same generic analysis).

Argument paths come from jax's ``args_info``, as for the other stages. They are used only once the optimized
entry parameters (XLA's program shape, read in the child) are checked, in order, to be the arguments jax kept
(dtype and per-device dims).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hlo_audit import host, platforms
from hlo_audit.attribution import arg_keys
from hlo_audit.lowering import Lowering, one_line
from hlo_audit.stages.program import (
    checked_arg_keys,
    dump_options,
    generic_cost,
    keep_dump,
    keys_before_xla,
    lowered_argument_signatures,
    parameter_shapes,
)

if TYPE_CHECKING:
    from hlo_audit.matrix import Cell

_POLL_SECONDS = 0.02
# How long a dump file must keep its size to be taken as written (module doc of _compile_until_buffer_assignment).
_STABLE_SECONDS = 0.2
# What jax's custom_partitioning lowers to: a callback into the lowering process, during XLA's SPMD partitioning.
_CUSTOM_PARTITIONING = b"CustomSPMDPartitioning"
# `allocation 3: size 525336576, page 0, parameter 47, shape |f32[...]| at ShapeIndex {}, maybe-live-out:`
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+), (.*):$", re.M)


class OptimizeError(RuntimeError):
    """XLA's optimization pipeline failed for the cell, or the child running it did; XLA's message, on one line."""


class _Captured(Exception):
    """Raised in place of jax's backend compile once its arguments are recorded."""


def run(lowered, cell: Cell) -> Lowering:
    """The module after XLA's optimizations for the cell's devices, its memory and cost (module doc)."""
    files = platforms.of(cell).dump_files(cell)
    if files is None:
        raise OptimizeError(f"{cell.platform_label} names no compile-only devices to optimize for")
    module, options, device_ids = compile_request(lowered)
    if _CUSTOM_PARTITIONING in module:
        raise OptimizeError("the module partitions ops through jax custom_partitioning callbacks (Transformer "
                            "Engine on more than one GPU), which only the lowering process holds: stage optimized "
                            "runs XLA in a child; use stage compiled")
    with tempfile.TemporaryDirectory(prefix="hlo-audit-optimize-") as work:
        work = Path(work)
        (work / "module.mlirbc").write_bytes(module)
        (work / "options.pb").write_bytes(options)
        (work / "request.json").write_text(json.dumps({
            "platform": cell.platform, "device": cell.device, "device_ids": device_ids, "module": files.module,
            "buffer_assignment": files.buffer_assignment, "done": files.buffer_assignment_done}))
        child = subprocess.run([sys.executable, "-m", __name__, str(work)], env=_child_environment(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
        result_path = work / "result.json"
        if not result_path.exists():
            last = [line for line in child.stderr.splitlines() if line.strip()][-1:] or [f"exit {child.returncode}"]
            raise OptimizeError(f"the child running XLA's optimization pipeline failed: {last[0].strip()}")
        result = json.loads(result_path.read_text())
        if "error" in result:
            raise OptimizeError(result["error"])
        text = Path(result["module"]).read_text()
        keep_dump(work / "dump", cell)
    parameters = [(dtype, tuple(dims), None) for dtype, dims in result["parameters"]]  # JSON gave lists
    keys = checked_arg_keys(arg_keys(lowered), lowered_argument_signatures(lowered), parameters)
    # A platform whose codegen writes files stage compiled keeps (a GPU's thunk sequence): none exist yet, so the
    # cell's launches are counted from the scheduled module (an empty dump says which kind of program it is).
    # XLA's text inlines and fuses jax.random's calls: the keys are read from the module it was handed.
    return Lowering(text=text, arg_keys=keys, memory=result["memory"], cost=result["cost"],
                    dump={} if files.kept else None, key_hazards=keys_before_xla(lowered))


def _child_environment() -> dict[str, str]:
    """The child imports this hlo_audit, wherever the parent found it, and starts jax's CPU backend only: it
    compiles for compile-only devices (and a CUDA plugin started without a GPU check: platforms/cuda.py)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    # os.environ.copy(), not {**os.environ}: the cache records a copy of the whole environment as no dependency
    # (cache.recording_environment); unpacking reads every variable one by one, and PWD, OLDPWD or `_` then key
    # the cell (a TPU cell never hit the cache).
    environment = os.environ.copy()
    environment.update(PYTHONPATH=path, JAX_PLATFORMS="cpu")
    return environment


def compile_request(lowered) -> tuple[bytes, bytes, list[int]]:
    """What ``lowered.compile()`` would hand XLA: the module (MLIR bytecode), the serialized ``CompileOptions``
    and the ids of the executable's devices in order. Nothing is compiled."""
    from jax._src import compiler  # noqa: PLC0415 (jax's compile call; no public hook before XLA)
    from jax._src.interpreters import mlir  # noqa: PLC0415

    request: dict = {}

    def record(backend, module, executable_devices, options, host_callbacks):
        request.update(module=mlir.module_to_bytecode(module), options=options.SerializeAsString(),
                       device_ids=[device.id for device in executable_devices])
        raise _Captured

    real = compiler.backend_compile_and_load
    compiler.backend_compile_and_load = record
    try:
        lowered.compile()
    except _Captured:
        pass
    finally:
        compiler.backend_compile_and_load = real
    if not request:  # jax answered from a cache of its own without compiling
        raise OptimizeError("jax compiled nothing to optimize (an in-memory or persistent compile cache answered)")
    return request["module"], request["options"], request["device_ids"]


def memory_from_buffer_assignment(text: str) -> dict[str, int]:
    """Bytes by kind from XLA's buffer assignment dump (the ``memory`` record of stage compiled, less codegen's)."""
    record = {"argument_bytes": 0, "output_bytes": 0, "alias_bytes": 0, "temp_bytes": 0}
    for size, flags in _ALLOCATION.findall(text):
        size = int(size)
        parameter = re.search(r"(?:^|, )parameter \d+", flags) is not None
        live_out = "maybe-live-out" in flags
        if parameter:
            record["argument_bytes"] += size
        if live_out:
            record["output_bytes"] += size
        if parameter and live_out:
            record["alias_bytes"] += size
        if "preallocated-temp" in flags and "color " not in flags:  # the default memory space (HBM)
            record["temp_bytes"] += size
    return record


# --------------------------------------------------------------------------------------------------------------
# The child: `python -m hlo_audit.stages.optimized DIR`
# --------------------------------------------------------------------------------------------------------------

def _child(work: Path) -> None:
    """Run the request in ``work`` up to buffer assignment; write ``result.json``; exit without waiting for codegen."""
    host.setup_own_process()
    request = json.loads((work / "request.json").read_text())
    try:
        result = _optimize(work, request)
    except Exception as error:  # noqa: BLE001 (XLA's message is the cell's, reported by the parent)
        result = {"error": one_line(error)}
    (work / "result.json.partial").write_text(json.dumps(result))
    os.replace(work / "result.json.partial", work / "result.json")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the compile thread is still generating code nobody reads: do not wait for it


def _optimize(work: Path, request: dict) -> dict:
    """The request compiled until XLA's dump holds the optimized module and its buffer assignment; what they say."""
    dump = work / "dump"
    module_path, buffers_path, module = _compile_until_buffer_assignment(work, request, dump)
    return {"module": str(module_path),
            "parameters": parameter_shapes(module),
            "memory": memory_from_buffer_assignment(buffers_path.read_text()),
            "cost": generic_cost(module)}


def _compile_until_buffer_assignment(work: Path, request: dict, dump: Path):
    """Start XLA's compile of the request in a thread, with its dump in ``dump``; return the optimized module's and
    the buffer assignment's files, and XLA's parse of the module, once both are complete (the thread goes on into
    codegen, which the child's exit abandons); or raise XLA's error.

    Complete: the platform's done file exists, and then both files have kept their size for ``_STABLE_SECONDS`` and
    the module parses (XLA's own parser: the entry parameters are checked against it, its cost analysed). The done
    file alone is not enough: XLA's GPU compiler writes a module's dump files concurrently (measured for llama3-8b
    L2: the buffer assignment, the memory-usage report, then the 1.3 MB module text 0.11 s later)."""
    from jax._src.interpreters import mlir  # noqa: PLC0415
    from jax._src.lib import hlo, xla_client  # noqa: PLC0415
    from jax._src.lib.mlir import ir  # noqa: PLC0415

    compile_devices = platforms.get(request["platform"]).compile_devices(request["device"])
    devices = {device.id: device for device in compile_devices}
    executable_devices = xla_client.DeviceList(tuple(devices[i] for i in request["device_ids"]))
    client = executable_devices[0].client
    options = xla_client.CompileOptions.ParseFromString((work / "options.pb").read_bytes())
    options.env_option_overrides = [*options.env_option_overrides, *dump_options(dump).items()]
    module = ir.Module.parse((work / "module.mlirbc").read_bytes(), context=mlir.make_ir_context())
    ended: list[BaseException | None] = []

    def compile_in_thread() -> None:
        try:
            client.compile(module, executable_devices=executable_devices, compile_options=options)
            ended.append(None)
        except BaseException as error:  # noqa: BLE001 (handed to the polling thread)
            ended.append(error)

    threading.Thread(target=compile_in_thread, daemon=True).start()
    sizes: tuple = ()
    changed = time.perf_counter()
    while True:
        if ended and ended[0] is not None:
            raise ended[0]
        finished = bool(ended)  # the whole compile ended: every file it wrote is complete
        found = _one(dump, request["module"]), _one(dump, request["buffer_assignment"])
        if all(found) and (finished or _one(dump, request["done"])):
            now = tuple(path.stat().st_size for path in found)
            if now != sizes:
                sizes, changed = now, time.perf_counter()
            if finished or time.perf_counter() - changed >= _STABLE_SECONDS:
                try:
                    return (*found, hlo.hlo_module_from_text(found[0].read_text()))
                except Exception:
                    if finished:
                        raise
                    changed = time.perf_counter()
        elif finished:
            held = ", ".join(sorted(p.name for p in dump.iterdir())) if dump.is_dir() else "nothing"
            raise OptimizeError(f"XLA's compile ended without one optimized module and one buffer assignment in its "
                                f"dump (it holds: {held})")
        time.sleep(_POLL_SECONDS)


def _one(dump: Path, suffix: str) -> Path | None:
    """The one file of the dump ending with ``suffix``; None while there is none (an error if there are more)."""
    files = sorted(dump.glob("*" + suffix)) if dump.is_dir() else []
    if len(files) > 1:
        raise OptimizeError(f"XLA's dump in {dump} has {len(files)} files *{suffix}, expected one module's")
    return files[0] if files else None


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
