#!/usr/bin/env python3
"""TPU benchmark: hlo-audit's TPU cells against the compile they cannot avoid and against MaxText's own path.

Measured side by side in one run, each in a fresh process (imports included, as a CI job pays them), printed as
ratios (never asserted). The cell is llama3-8b, 4 layers, scanned, for TPU v6e-4 on this CPU host:

1. bare: MaxText's train step lowered with hlo-audit's own helper and ``lowered.compile()``, nothing else;
2. hlo-audit, stage compiled: ``hlo-audit run --no-cache`` of the compiled cell (compile, text, memory and cost,
   parse, attribution, normalization, RNG analysis). Target <= 1.1x of bare;
3. MaxText: ``python -m maxtext.trainers.pre_train.train_compile`` with the arguments and dump flags of its
   hlo_diff_test (its own AOT path: a full compile, of which that test reads the after-optimizations dump);
4. hlo-audit, stage optimized: ``hlo-audit run --no-cache`` of the shipped TPU series' cell: the same
   after-optimizations module, XLA stopped before TPU codegen (hlo_audit/optimized.py). Target: faster than 3;
5. two workers: ``hlo-audit run --jobs 2 --no-cache`` of two shipped TPU cells (llama3-8b and qwen3-1.7b): the
   peak memory one worker process holds, which ``--jobs`` sizes workers by (HostPlatform.worker_bytes).

Peak memory is each process's own (``wait4``'s ``ru_maxrss``; for a run with workers, its largest worker: this
script never imports jax, so nothing larger is inherited).

    python scripts/bench_tpu.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout

from hlo_audit import platforms
from hlo_audit.matrix import Cell

CELL = "llama3-8b/scan-on/none/L4/tpu-v6e-4/compiled"
OPTIMIZED_CELL = "llama3-8b/scan-on/none/L4/tpu-v6e-4/optimized"
# The compiled cell's own config (the acceptance config); the optimized cells are the default matrix's
# TPU series (a config that sets no axis keeps every default series).
COMPILED_CONFIG = ('models = ["llama3-8b"]\nscan = ["on"]\nquant = ["none"]\nlayers = [4]\nplatform = "tpu"\n'
                   'topology = "v6e-4"\nstage = "compiled"\n')
TWO_CELLS = "platform=tpu,scan=on,model=llama3-8b,model=qwen3-1.7b"
BARE = textwrap.dedent("""
    from hlo_audit.matrix import Cell
    from hlo_audit.targets.maxtext import lower_cell
    lower_cell(Cell("llama3-8b", True, "none", 4, platform="tpu", device="v6e-4", stage="compiled"))[0].compile()
""")
# What MaxText's hlo_diff_test passes to train_compile (src/maxtext/configs/base.yml + model_name...).
MAXTEXT_ARGS = ["model_name=llama3-8b", "dataset_type=synthetic", "override_model_config=true",
                "compile_topology_num_slices=1", "compile_topology=v6e-4", "base_num_decoder_layers=4",
                "per_device_batch_size=1", "max_target_length=128",
                # No persistent compile cache (base.yml: ~/jax_cache, on unless dump_hlo): a repeated run must
                # compile again, as hlo-audit's --no-cache and the bare compile do.
                "jax_cache_dir="]
# Compile-only libtpu and no idle TPU runtime, for every process alike (hlo-audit's own processes set these
# themselves: host.setup_own_process).
ENV = {"JAX_PLATFORMS": "cpu", "TPU_SKIP_MDS_QUERY": "1", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
       "TF_CPP_MIN_LOG_LEVEL": "1"}


def measure(command: list[str], cwd: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one fresh process."""
    # stderr to a file, not a pipe: train_compile logs more than a pipe holds, and wait4 would never return.
    with tempfile.TemporaryFile() as log:
        started = time.perf_counter()
        proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **ENV})
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status) != 0:
            log.seek(0)
            sys.exit(f"benchmark step failed: {' '.join(command)}\n{log.read().decode(errors='replace')[-3000:]}")
    return elapsed, usage.ru_maxrss * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, best kept (the machine is shared)")
    args = parser.parse_args(argv)
    python = sys.executable
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        (work / "hlo-audit.toml").write_text(f'cache_dir = "{work / "cache"}"\n')
        (work / "compiled.toml").write_text(f'cache_dir = "{work / "cache"}"\n' + COMPILED_CONFIG)
        base_yml = Path(subprocess.run([python, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
                                       capture_output=True, text=True, check=True).stdout.strip()) / "configs/base.yml"
        steps = {
            "bare lower().compile()": ([python, "-c", BARE], work),
            "hlo-audit run, compiled cell": ([python, "-m", "hlo_audit", "run", "--no-cache", "--config",
                                              "compiled.toml"], work),
            "MaxText train_compile + dump": ([python, "-m", "maxtext.trainers.pre_train.train_compile", str(base_yml),
                                             *MAXTEXT_ARGS, f"compile_xla_flags=--xla_dump_to={work / 'dump'} "
                                             "--xla_dump_hlo_as_text=True --xla_dump_hlo_module_re=jit_train_step"],
                                            work),
            "hlo-audit run, optimized cell": ([python, "-m", "hlo_audit", "run", "--no-cache", "--only",
                                               f"id={OPTIMIZED_CELL}"], work),
            "hlo-audit run --jobs 2 (two cells)": ([python, "-m", "hlo_audit", "run", "--no-cache", "--jobs", "2",
                                                    "--only", TWO_CELLS], work),
        }
        best: dict[str, tuple[float, int]] = {}
        for _ in range(args.repeat):
            for name, (command, cwd) in steps.items():
                seconds, rss = measure(command, cwd)
                print(f"  {name}: {seconds:.1f} s, {rss / 2**30:.2f} GiB", flush=True)
                kept = best.get(name)
                best[name] = (min(seconds, kept[0]) if kept else seconds, max(rss, kept[1]) if kept else rss)
    print(f"TPU cells {CELL} and .../optimized, best of {args.repeat}, each a fresh process")
    print(f"{'step':<36} {'wall s':>8} {'peak RSS':>10}")
    for name, (seconds, rss) in best.items():
        print(f"{name:<36} {seconds:>8.1f} {rss / 2**30:>8.2f} GiB")
    bare = best["bare lower().compile()"][0]
    audit = best["hlo-audit run, compiled cell"][0]
    maxtext = best["MaxText train_compile + dump"][0]
    optimized = best["hlo-audit run, optimized cell"][0]
    print(f"hlo-audit compiled cell / bare lower().compile(): {audit / bare:.2f}x (target <= 1.1x)")
    print(f"hlo-audit compiled cell / MaxText train_compile + dump: {audit / maxtext:.2f}x (both generate TPU code)")
    print(f"hlo-audit optimized cell / MaxText train_compile + dump: {optimized / maxtext:.2f}x (target < 1x: the "
          "after-optimizations module MaxText's gate reads)")
    worker = best["hlo-audit run --jobs 2 (two cells)"][1]
    budget_cell = Cell("llama3-8b", True, "none", 4, platform="tpu", device="v6e-4", stage="compiled")
    budget = platforms.of(budget_cell).worker_bytes(budget_cell)
    print(f"peak RSS of one worker (or its XLA child) on a shipped TPU cell: {worker / 2**30:.2f} GiB; compiled "
          f"cell: {best['hlo-audit run, compiled cell'][1] / 2**30:.2f} GiB (--jobs budgets {budget / 2**30:.1f} GiB a "
          "worker)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
