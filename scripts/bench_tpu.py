#!/usr/bin/env python3
"""TPU compiled-stage benchmark: one compiled TPU cell against the compile it cannot avoid and against MaxText.

Measured side by side in one run, each in a fresh process (imports included, as a CI job pays them), printed as
ratios (never asserted). The cell is llama3-8b, 4 layers, scanned, compiled for TPU v6e-4 on this CPU host:

1. bare: MaxText's train step lowered with hlo-audit's own helper and ``lowered.compile()``, nothing else;
2. hlo-audit: ``hlo-audit run --no-cache`` of that cell (compile, text, memory and cost, parse, attribution,
   normalization, RNG analysis). Target <= 1.1x of bare;
3. MaxText: ``python -m maxtext.trainers.pre_train.train_compile`` with the arguments and dump flags of its
   hlo_diff_test (its own AOT path). Target: hlo-audit faster;
4. two workers: ``hlo-audit run --jobs 2 --no-cache`` of two TPU cells (llama3-8b and qwen3-1.7b): the peak
   memory one worker process holds, which ``--jobs`` sizes workers by (platforms.memory_per_worker).

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

from hlo_audit.matrix import Cell  # noqa: E402 (no jax: this process stays small, see the module doc)
from hlo_audit.platforms import memory_per_worker  # noqa: E402

CELL = "llama3-8b/scan-on/none/L4/tpu-v6e-4/compiled"
# Cells of the default matrix's TPU series (a config that sets no axis keeps every default series).
ONE_CELL = f"id={CELL}"
TWO_CELLS = "platform=tpu,scan=on,model=llama3-8b,model=qwen3-1.7b"
BARE = textwrap.dedent("""
    from hlo_audit.matrix import Cell
    from hlo_audit.targets.maxtext import lower_cell
    lower_cell(Cell("llama3-8b", True, "none", 4, platform="tpu", topology="v6e-4", stage="compiled"))[0].compile()
""")
# What MaxText's hlo_diff_test passes to train_compile (src/maxtext/configs/base.yml + model_name...).
MAXTEXT_ARGS = ["model_name=llama3-8b", "dataset_type=synthetic", "override_model_config=true",
                "compile_topology_num_slices=1", "compile_topology=v6e-4", "base_num_decoder_layers=4",
                "per_device_batch_size=1", "max_target_length=128",
                # No persistent compile cache (base.yml: ~/jax_cache, on unless dump_hlo): a repeated run must
                # compile again, as hlo-audit's --no-cache and the bare compile do.
                "jax_cache_dir="]
# Compile-only libtpu and no idle TPU runtime, for every process alike (hlo-audit's own processes set these
# themselves: platforms.setup_own_process).
ENV = {"JAX_PLATFORMS": "cpu", "TPU_SKIP_MDS_QUERY": "1", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}


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
        base_yml = Path(subprocess.run([python, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
                                       capture_output=True, text=True, check=True).stdout.strip()) / "configs/base.yml"
        steps = {
            "bare lower().compile()": ([python, "-c", BARE], work),
            "hlo-audit run (one cell)": ([python, "-m", "hlo_audit", "run", "--no-cache", "--only", ONE_CELL], work),
            "MaxText train_compile + dump": ([python, "-m", "maxtext.trainers.pre_train.train_compile", str(base_yml),
                                             *MAXTEXT_ARGS, f"compile_xla_flags=--xla_dump_to={work / 'dump'} "
                                             "--xla_dump_hlo_as_text=True --xla_dump_hlo_module_re=jit_train_step"],
                                            work),
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
    print(f"compiled TPU cell {CELL}, best of {args.repeat}, each a fresh process")
    print(f"{'step':<36} {'wall s':>8} {'peak RSS':>10}")
    for name, (seconds, rss) in best.items():
        print(f"{name:<36} {seconds:>8.1f} {rss / 2**30:>8.2f} GiB")
    bare = best["bare lower().compile()"][0]
    audit = best["hlo-audit run (one cell)"][0]
    maxtext = best["MaxText train_compile + dump"][0]
    print(f"hlo-audit / bare lower().compile(): {audit / bare:.2f}x (target <= 1.1x)")
    print(f"hlo-audit / MaxText train_compile + dump: {audit / maxtext:.2f}x (target < 1x)")
    worker = best["hlo-audit run --jobs 2 (two cells)"][1]
    budget = memory_per_worker(Cell("llama3-8b", True, "none", 4, platform="tpu", topology="v6e-4", stage="compiled"))
    print(f"peak RSS of one worker compiling a TPU cell: {worker / 2**30:.2f} GiB "
          f"(--jobs budgets {budget / 2**30:.1f} GiB a worker)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
