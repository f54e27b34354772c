#!/usr/bin/env python3
"""On a real GPU: the same cells compiled on the device and deviceless with that device's own target config, what
one step launches and the memory per GPU compared, differences explained.

hlo-audit's GPU cells are compiled by XLA's GPU compiler for compile-only devices on a CPU host (docs/gpu.md). This
script is the check of that against the GPU itself, prepared for a machine that has one (run it there, in a
checkout with `make setup` done, or any environment with hlo-audit's dependencies and jax's CUDA plugin):

    python scripts/gpu_device_check.py [--out DIR] [--cells small,none,te_fp8]

For each cell (``small``: a two-layer NNX train step from tests/nnx_models.py that carries seed 000's per-layer
RNG counters; ``none``, ``te_fp8``: MaxText llama3-8b scan off L2, unquantized and te_fp8_currentscaling, as the
profile's H100 cells lower them):

1. **On the device.** The step is lowered for the GPU (``jax.devices("gpu")[0]``) and compiled with XLA's dump on.
   The dump holds the device's ``*.gpu_target_config.pbtxt``: what the driver reported (SMs, memory, clocks,
   cuDNN and CUDA versions), the facts a deviceless compile needs. Autotuning is pinned by writing the
   device's autotuning results out (``--xla_gpu_dump_autotune_results_to``).
2. **Deviceless.** In a fresh process with ``JAX_PLATFORMS=cpu`` (as on CI: the GPU is not used), the same step is
   lowered for compile-only devices of that very target config (``gpu_target = ".../device.txtpb"``,
   hlo_audit/platforms/cuda.py) and compiled by the same stage hlo-audit's cells use, with the device's autotuning
   results loaded (``--xla_gpu_load_autotune_results_from``), so both compiles pick the same gemm configs. A
   second deviceless compile without them shows what autotuning alone changes (the cost model's default configs).
3. **Compared.** Launches per step (total, by kind, scalar, collectives; the thunk sequence's kernel names and
   launch dimensions in order), memory per GPU (argument, output, alias, temp), entry parameters and the
   canonical text of the module after optimizations. Every difference is printed with its kind; the expected
   ones are named (docs/gpu.md "What deviceless compilation proves").

Writes ``DIR/device_check.json`` (default ``$OUT`` when set, else ``./gpu-device-check``) and a summary on stdout;
exits 1 when a compared number differs with autotuning pinned. It needs a GPU: without one it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

CELLS = ("small", "none", "te_fp8")
QUANT = {"none": "none", "te_fp8": "te_fp8_currentscaling"}

# Runs in a fresh process for each side: lowers one cell's step and compiles it through hlo-audit's compiled stage
# (its dump, its thunk files), then prints what the comparison reads. argv: cell name, side, work folder.
SIDE = textwrap.dedent(r'''
    import json, os, sys
    from pathlib import Path
    cell_name, side, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    from hlo_audit import host
    host.setup_own_process()
    import jax
    from hlo_audit.hlo.analysis import analyze
    from hlo_audit.hlo.launch_model import step_launches
    from hlo_audit.matrix import Cell
    from hlo_audit.stages import compiled as compiled_stage
    from hlo_audit.stages.program import KEEP_DUMP_ENV
    from hlo_audit.platforms.cuda import device_name

    if side == "device":
        devices = jax.devices("gpu")[:1]
        cell = Cell(cell_name, False, "none", 2, target="scripts:gpu_device_check", platform="cuda",
                    device="h100", stage="compiled")  # names the dump files only: the devices are the GPU's
    else:
        target = str(work / "device.txtpb")
        cell = Cell(cell_name, False, "none", 2, target="scripts:gpu_device_check", platform="cuda",
                    device=device_name(target), stage="compiled")
        from hlo_audit import platforms
        devices = platforms.devices(cell)
    os.environ[KEEP_DUMP_ENV] = str(work / f"dump-{side}")
    if cell_name == "small":
        import jax.numpy as jnp
        from flax import nnx
        import nnx_models
        from hlo_audit.examples.nnx_mlp import make_step
        spec = nnx_models.ModelSpec(layers=2, bridge="nodraw")
        graphdef, state = nnx.split(nnx.eval_shape(lambda: nnx_models.build(spec)))
        sharding = jax.sharding.SingleDeviceSharding(devices[0])
        state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), state)
        x = jax.ShapeDtypeStruct((nnx_models.BATCH, spec.width), jnp.float32, sharding=sharding)
        lowered, mesh, context = jax.jit(make_step(graphdef), donate_argnums=0).lower(state, x), None, None
    else:
        from hlo_audit.targets import te
        from hlo_audit.targets.maxtext import _lower_train_step, te_recipe
        from hlo_audit.targets.maxtext_config import train_settings
        quant = {"none": "none", "te_fp8": "te_fp8_currentscaling"}[cell_name]
        mt = Cell("llama3-8b", False, quant, 2, platform="cuda", device=cell.device, stage="compiled")
        context = te.cross_lowering(mt, te_recipe)
        context.__enter__()
        settings = train_settings("llama3-8b", scan_layers=False, quantization=quant, num_layers=2,
                                  overrides={"attention": "dot_product"})
        lowered, _, mesh, _ = _lower_train_step(settings, "cuda", devices)
    with jax.set_mesh(mesh) if mesh is not None else __import__("contextlib").nullcontext():
        lowering = compiled_stage.run(lowered, cell)
    if context is not None:
        context.__exit__(None, None, None)
    analysis = analyze(lowering.text, cell_name, lowering.arg_keys)
    launches = step_launches(analysis.module, analysis.params, lowering.dump)
    from hlo_audit.hlo.thunks import parse_thunk_sequence
    sequence = [(t.kind, t.kernel, t.grid, t.threads) for t in parse_thunk_sequence(lowering.dump["thunk_sequence"])]
    record = {"side": side, "device_kind": devices[0].device_kind, "entry_params": len(analysis.params),
              "by_dtype": analysis.summary.by_dtype, "memory": lowering.memory,
              "launches": {k: v for k, v in launches.to_record().items() if k != "groups"},
              "sequence": sequence, "normalized": analysis.normalized}
    (work / f"{side}.json").write_text(json.dumps(record))
''')


def run_side(cell: str, side: str, work: Path, xla_flags: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts")]),
           "XLA_FLAGS": xla_flags}
    if side != "device":
        env["JAX_PLATFORMS"] = "cpu"  # as on a CPU host: the GPU is not touched
    else:
        env.pop("JAX_PLATFORMS", None)
    done = subprocess.run([sys.executable, "-c", SIDE, cell, side, str(work)], env=env, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode
        raise RuntimeError(f"{cell} {side}: {why}")
    return json.loads((work / f"{side}.json").read_text())


def compare(device: dict, deviceless: dict) -> list[str]:
    """The differences between the two compiles, one line each."""
    found = []
    for key in ("entry_params", "by_dtype"):
        if device[key] != deviceless[key]:
            found.append(f"entry parameters: {key} {device[key]} on the device, {deviceless[key]} deviceless")
    for kind, value in device["memory"].items():
        other = deviceless["memory"].get(kind)
        if value != other and kind != "generated_code_bytes":
            found.append(f"memory: {kind} {value:,} on the device, {other:,} deviceless")
    for key in ("total", "by_kind", "scalar", "collectives"):
        if device["launches"][key] != deviceless["launches"][key]:
            found.append(f"launches: {key} {device['launches'][key]} on the device, {deviceless['launches'][key]} "
                         "deviceless")
    a, b = device["sequence"], deviceless["sequence"]
    if a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        found.append(f"thunk sequence: {len(a)} thunks on the device, {len(b)} deviceless; first difference at "
                     f"{first}: {a[first] if first < len(a) else '-'} vs {b[first] if first < len(b) else '-'}")
    if device["normalized"] != deviceless["normalized"]:
        import difflib

        lines = sum(1 for line in difflib.unified_diff(device["normalized"].splitlines(),
                                                       deviceless["normalized"].splitlines(), n=0, lineterm="")
                    if line[:1] in "+-" and line[:3] not in ("+++", "---"))
        found.append(f"module after optimizations: canonical text differs in {lines} lines")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-device-check")))
    parser.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, of: {', '.join(CELLS)}")
    args = parser.parse_args(argv)
    probe = subprocess.run([sys.executable, "-c", "import jax; print(len(jax.devices('gpu')))"], capture_output=True,
                           text=True, env={k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"})
    if probe.returncode != 0 or not probe.stdout.strip().isdigit() or int(probe.stdout) == 0:
        print("gpu_device_check: no GPU here (jax.devices('gpu') is empty): run it on a machine with one",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report, pinned_differs = {}, False
    for cell in [c for c in args.cells.split(",") if c]:
        with tempfile.TemporaryDirectory() as work:
            work = Path(work)
            results = work / "autotune_results.textproto"
            device = run_side(cell, "device", work, f"--xla_gpu_dump_autotune_results_to={results}")
            [config] = (work / "dump-device").rglob("*.gpu_target_config.pbtxt")
            (work / "device.txtpb").write_text(config.read_text())
            pinned = run_side(cell, "deviceless", work, f"--xla_gpu_load_autotune_results_from={results}")
            default = run_side(cell, "deviceless", work, "")
        report[cell] = {"device_kind": device["device_kind"], "target_config": config.read_text(),
                        "device": {k: v for k, v in device.items() if k not in ("sequence", "normalized")},
                        "pinned_differences": compare(device, pinned),
                        "unpinned_differences": compare(device, default)}
        pinned_differs |= bool(report[cell]["pinned_differences"])
        print(f"{cell} on {device['device_kind']}: {device['launches']['total']} launches per step "
              f"({device['launches']['by_kind']}), memory {device['memory']}")
        for label in ("pinned", "unpinned"):
            lines = report[cell][f"{label}_differences"]
            print(f"  deviceless, autotuning {label}: " + ("the same" if not lines else f"{len(lines)} differences"))
            for line in lines:
                print(f"    {line}")
    (args.out / "device_check.json").write_text(json.dumps(report, indent=1))
    return 1 if pinned_differs else 0


if __name__ == "__main__":
    sys.exit(main())
