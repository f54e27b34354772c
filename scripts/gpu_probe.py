"""What the GPU runs, measured deviceless: MaxText's train step lowered as hlo-audit's TE cells lower it, over
compile-only GPUs, then compiled by XLA's GPU compiler on this CPU host (hlo_audit/stages/cuda.py).

    PYTHONPATH=$PWD .venv/bin/python scripts/gpu_probe.py                 # every cell, one process each
    PYTHONPATH=$PWD .venv/bin/python scripts/gpu_probe.py --cells h100-te_fp8,h100-te_fp8-revert --optimized

Per cell: lower and compile seconds (and, with --optimized, the optimized stage's: capture, child, wait), peak
RSS, thunks, launches per step by kind, scalar kernels, memory per GPU, entry parameters, and the module-based
launch count against the thunk sequence's. After the cells, seed 000's revert as a launch delta.

How the cells lower (as hlo_audit/targets/maxtext.py + te.py do, for the TE cells of the default matrix):
MaxText 0.2.5, scan off, 2 layers, batch 1, seq 128, attention pinned to dot_product, TE recipes inside
``te.cross_lowering`` for the GPU's architecture; the mesh is over the compile-only GPUs instead of the host's
CPU. The revert is tests/injected_maxtext.py's ``te-keeps-rngs``. Eight GPUs: MaxText sizes the global batch
by ``compile_topology=a3`` (eight GPUs per host), and TE's ``custom_partitioning`` callbacks, which run inside
XLA's compile, need MaxText's TE mesh resource (``max_utils.transformer_engine_context``) around the lowering
and the compile. Each cell runs in a process of its own, so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax starts: the CUDA plugin then registers without a GPU

ROOT = Path(__file__).resolve().parent.parent

# name -> (GPU, topology, quantization, revert, cuda_arch)
CELLS = {
    "h100-te_fp8": ("h100", "1x1x1", "te_fp8_currentscaling", "", "sm_90"),
    "h100-te_fp8-revert": ("h100", "1x1x1", "te_fp8_currentscaling", "te-keeps-rngs", "sm_90"),
    "h100-none": ("h100", "1x1x1", "", "", "sm_90"),
    "b200-te_nvfp4_no_rht": ("b200", "1x1x1", "te_nvfp4_no_rht", "", "sm_100"),
    "8xh100-none-fsdp8": ("h100", "1x1x8", "", "", "sm_90"),
    "8xh100-te_fp8-fsdp8": ("h100", "1x1x8", "te_fp8_currentscaling", "", "sm_90"),
    "8xh100-te_fp8-fsdp8-revert": ("h100", "1x1x8", "te_fp8_currentscaling", "te-keeps-rngs", "sm_90"),
}
MODEL, LAYERS = "llama3-8b", 2


def run_cell(name: str, out: Path, optimized: bool, dump: Path | None, topology: str | None) -> None:
    gpu, default_topology, quant, revert, arch = CELLS[name]
    topology = topology or default_topology
    sys.path.insert(0, str(ROOT / "tests"))
    import jax

    from hlo_audit.hlo.analysis import analyze
    from hlo_audit.matrix import Cell
    from hlo_audit.stages.cuda import compile_for_cuda, cuda_devices, gpu_target_config, optimize_for_cuda
    from hlo_audit.targets import maxtext, te

    config = gpu_target_config(gpu)
    devices = list(cuda_devices(config, topology))
    overrides = {"attention": "dot_product"}
    if len(devices) > 1:
        overrides.update(compile_topology="a3", compile_topology_num_slices=str(len(devices) // 8 or 1))
    cell = Cell(model=MODEL, scan=False, quant=quant or "none", layers=LAYERS, platform="cuda", cuda_arch=arch,
                overrides=tuple(overrides.items()))
    reverted = contextlib.nullcontext()
    if revert:
        import injected_maxtext

        reverted = injected_maxtext.reverted(revert)

    def te_mesh():
        """The TE mesh resource MaxText sets around its step (``max_utils.transformer_engine_context``: its axis
        names), which TE's partitioning callbacks assert on more than one GPU. Set here through TE itself:
        MaxText's wrapper catches every exception and yields again, which hides the compile's own errors
        ("generator didn't stop after throw()")."""
        if len(devices) > 1 and quant.startswith("te_"):
            from transformer_engine.jax.sharding import MeshResource, global_shard_guard

            return global_shard_guard(MeshResource(dp_resource="data", tp_resource="tensor",
                                                   tpsp_resource="tensor_sequence", fsdp_resource="fsdp",
                                                   pp_resource=None, cp_resource="context", ep_resource="expert"))
        return contextlib.nullcontext()

    record: dict = {"cell": name, "gpu": gpu, "topology": topology, "devices": len(devices), "quant": quant or "none",
                    "revert": revert, "cuda_arch": arch}
    start = time.perf_counter()
    with reverted, te.cross_lowering(cell, maxtext.te_recipe) as notes, te_mesh():
        settings = maxtext._settings(MODEL, scan_layers=False, quantization=quant, num_layers=LAYERS,  # noqa: SLF001
                                     overrides=overrides)
        lowered, _ = maxtext._lower_train_step(settings, "cuda", devices)  # noqa: SLF001
    record["lower_s"] = round(time.perf_counter() - start, 2)
    record["note"] = "; ".join(notes)
    record["rss_after_lower_bytes"] = _peak_rss()
    compile_context = contextlib.ExitStack()
    if len(devices) > 1 and quant.startswith("te_"):
        # TE's partitioning callbacks run inside XLA's compile and read the mesh from jax's context, as MaxText's
        # train_compile compiles inside its mesh: the lowering's mesh, rebuilt from the same config.
        config_ = maxtext._config(settings)  # noqa: SLF001
        mesh = maxtext.load_maxtext().maxtext_utils.get_mesh_from_config(config_, devices)
        compile_context.enter_context(jax.set_mesh(mesh))
        compile_context.enter_context(te_mesh())
    with te.cross_lowering(cell, maxtext.te_recipe):
        compiled = compile_for_cuda(lowered, context=compile_context, keep_dump=dump)
    record["compile_s"] = round(compiled.seconds, 2)
    record["compile_cpu_s"] = round(compiled.cpu_seconds, 2)
    record["peak_rss_bytes"] = _peak_rss()
    analysis = analyze(compiled.module, name, arg_keys=compiled.arg_keys)
    summary = analysis.summary
    record["entry_params"], record["entry_params_by_dtype"] = summary.entry_params, summary.by_dtype
    record["arg_keys_checked"] = compiled.arg_keys is not None
    record["memory"], record["cost"] = compiled.memory, compiled.cost
    launches = compiled.launches()
    record["launches"] = launches.to_record()
    from hlo_audit.hlo.thunks import module_launches

    from_module = module_launches(analysis.module, analysis.params)
    record["module_launches"] = {k: from_module.to_record()[k] for k in ("total", "by_kind", "scalar")}
    record["module_launches_equal"] = all(record["module_launches"][k] == record["launches"][k]
                                          for k in ("total", "by_kind", "scalar"))
    if optimized:
        try:
            with te.cross_lowering(cell, maxtext.te_recipe):
                stage = optimize_for_cuda(lowered, config, topology)
            record["optimized"] = {"seconds": round(stage.seconds, 2), "ratio": round(stage.seconds / compiled.seconds, 3),
                                   "cpu_seconds": round(stage.cpu_seconds, 2),
                                   "cpu_ratio": round(stage.cpu_seconds / compiled.cpu_seconds, 3),
                                   "child_peak_rss_bytes": stage.child_peak_rss_bytes, "phases": stage.phases,
                                   "memory": stage.memory,
                                   "cost": stage.cost, "same_module": stage.module == compiled.module,
                                   "arg_keys_checked": stage.arg_keys is not None,
                                   "launches": {k: stage.launches().to_record()[k] for k in ("total", "by_kind", "scalar")}}
        except Exception as error:  # noqa: BLE001 (reported in the cell's row)
            record["optimized"] = {"error": " ".join(str(error).split())[:400]}
    out.write_text(json.dumps(record, indent=1))


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, of: {', '.join(CELLS)}")
    parser.add_argument("--optimized", action="store_true", help="also run the optimized stage and compare")
    parser.add_argument("--json", type=Path, help="write every cell's record here")
    parser.add_argument("--dumps", type=Path, help="keep each cell's XLA dump under DIR/<cell>")
    parser.add_argument("--topology", help="override the cells' topology (e.g. 1x8x1 for the 8-GPU cells)")
    parser.add_argument("--run-cell", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_cell:
        run_cell(args.run_cell, args.out, args.optimized, args.dumps, args.topology)
        return
    names = [n for n in args.cells.split(",") if n]
    unknown = [n for n in names if n not in CELLS]
    if unknown:
        parser.error(f"unknown cells {unknown} (known: {', '.join(CELLS)})")
    records = []
    with tempfile.TemporaryDirectory() as work:
        for name in names:
            out = Path(work) / f"{name}.json"
            command = [sys.executable, __file__, "--run-cell", name, "--out", str(out)]
            command += ["--optimized"] if args.optimized else []
            command += ["--dumps", str(args.dumps / name)] if args.dumps else []
            command += ["--topology", args.topology] if args.topology else []
            child = subprocess.run(command, stderr=subprocess.PIPE, text=True, errors="replace", check=False)
            if not out.exists():
                tail = [line for line in child.stderr.splitlines() if line.strip()][-3:]
                records.append({"cell": name, "error": " | ".join(tail)})
            else:
                records.append(json.loads(out.read_text()))
            _print(records[-1])
    for name in names:  # each cell and its revert, when both ran: seed 000's regression as a launch delta
        if args.dumps and f"{name}-revert" in names:
            _print_delta(name, args.dumps / name, args.dumps / f"{name}-revert")
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))


def _print(r: dict) -> None:
    if "error" in r:
        print(f"{r['cell']}: ERROR {r['error']}", flush=True)
        return
    k, m = r["launches"], r["memory"]
    print(f"{r['cell']}: {r['devices']}x {r['gpu']} ({r['topology']}), lower {r['lower_s']} s, compile {r['compile_s']} s"
          f" ({r['compile_cpu_s']} CPU s),"
          f" peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB", flush=True)
    print(f"  entry params {r['entry_params']} {r['entry_params_by_dtype']}, argument keys checked: {r['arg_keys_checked']}")
    print(f"  thunks {k['thunks']}, launches per step {k['total']} {k['by_kind']}, scalar {k['scalar']}, "
          f"collectives {k['collectives']}")
    print(f"  per GPU: argument {m['argument_bytes']:,} B, output {m['output_bytes']:,} B, alias {m['alias_bytes']:,} B,"
          f" temp {m['temp_bytes']:,} B; cost {r['cost']}")
    print(f"  from the scheduled module: {r['module_launches']} (equal: {r['module_launches_equal']})")
    for group in k["scalar_groups"][:4]:
        print(f"    scalar: {group['count']} {group['name']}" + (f", reading {group['reads']}" if group["reads"] else ""))
    if "optimized" in r:
        print(f"  optimized stage: {r['optimized']}")
    if r.get("note"):
        print(f"  note: {r['note']}")


def _print_delta(name: str, before: Path, after: Path) -> None:
    from hlo_audit.hlo.params import entry_params
    from hlo_audit.hlo.text import parse_module
    from hlo_audit.hlo.thunks import launch_delta, launch_report, thunk_dumps

    def report(folder: Path):
        dump = max(thunk_dumps(folder), key=lambda d: d.sequence.stat().st_size)
        sequence, metadata, text = dump.read()
        module = parse_module(text, str(dump.after_optimizations))
        return launch_report(sequence, metadata, module, entry_params(module), str(dump.sequence))

    old, new = report(before), report(after)
    print(f"{name}, seed 000's TE bridge fix reverted: {new.total - old.total:+d} launches per step "
          f"({new.scalar - old.scalar:+d} scalar), from the dump folders:")
    for group in launch_delta(old, new):
        print("  " + group.describe(signed=True))


if __name__ == "__main__":
    main()
