#!/usr/bin/env python3
"""Matrix benchmark: what hlo-audit's runner costs on top of the lowerings it cannot avoid.

Measured side by side in one run, each in a fresh process, printed as ratios (never asserted):

1. cold ``hlo-audit run`` of the selected cells (empty cache) vs the sum of bare jax lowering times of the
   same cells (MaxText imported once, ``lower_train_step(...).as_text()`` per cell). Target <= 1.15x.
2. the same run again, warm, served from the cache. Target <= 5% of cold.
3. one cell, hlo-audit's way (lower + analyse) vs MaxText's compile-based way (lower + compile + dump HLO with
   ``--xla_dump_to``, what MaxText's hlo_diff_test does on a TPU topology; here for the CPU).

    python scripts/bench_matrix.py [--only model=llama3-8b,quant=none,quant=int8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

# Train steps on the CPU: the cells the bare baseline lowers the same way (it knows no inference step or TPU stage).
DEFAULT_ONLY = "model=llama3-8b,step=train,platform=cpu,quant=none,quant=int8,quant=fp8,quant=nanoo_fp8"
ONE_CELL = "llama3-8b/scan-off/int8/L2"


def run(command: list[str], cwd: Path, env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    elapsed = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        sys.exit(f"benchmark step failed: {' '.join(command)}\n{proc.stderr[-3000:]}")
    return elapsed, proc


BARE = textwrap.dedent("""
    import json, sys, time
    started = time.perf_counter()
    from hlo_audit.targets.maxtext import lower_train_step
    from hlo_audit.targets.maxtext_config import load_maxtext
    load_maxtext()
    imported = time.perf_counter() - started
    cells = json.loads(sys.argv[1])
    total = 0.0
    for c in cells:
        started = time.perf_counter()
        lower_train_step(c["model"], scan_layers=c["scan"] == "on", quantization=c["quant"],
                         num_layers=c["layers"], platform=c["platform"]).as_text(dialect="hlo")
        total += time.perf_counter() - started
    print(imported, total)
""")

COMPILE_AND_DUMP = textwrap.dedent("""
    import sys, time
    from hlo_audit.targets.maxtext import lower_train_step
    from hlo_audit.targets.maxtext_config import load_maxtext
    load_maxtext()
    started = time.perf_counter()
    lowered = lower_train_step("llama3-8b", scan_layers=False, quantization="int8", num_layers=2)
    lowered.compile()
    print(time.perf_counter() - started)
""")

OUR_CELL = textwrap.dedent("""
    import sys, time
    from hlo_audit.targets.maxtext_config import load_maxtext
    from hlo_audit.run import _lower_one
    from hlo_audit.matrix import Cell
    load_maxtext()
    started = time.perf_counter()
    result, _, _ = _lower_one("maxtext", Cell("llama3-8b", False, "int8", 2), "bench")
    assert result.status == "ok", result.message
    print(time.perf_counter() - started)
""")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=DEFAULT_ONLY, help=f"cells to run (default: {DEFAULT_ONLY})")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args()
    hlo_audit = [sys.executable, "-m", "hlo_audit"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "hlo-audit.toml").write_text(f'cache_dir = "{work / "cache"}"\n')
        _, listing = run([*hlo_audit, "list", "--only", args.only, "--format", "json"], work)
        cells = [c for c in json.loads(listing.stdout)["cells"] if not c["quant"].startswith("te_")]
        print(f"{len(cells)} cells ({args.only}), 2 cores; each step in a fresh process", file=sys.stderr)
        _, bare = run([sys.executable, "-c", BARE, json.dumps(cells)], work)
        import_s, bare_sum = map(float, bare.stdout.strip().splitlines()[-1].split())
        cold, _ = run([*hlo_audit, "run", "--only", args.only, "--format", "json"], work)
        warm, warm_proc = run([*hlo_audit, "run", "--only", args.only, "--format", "json"], work)
        cached = sum(c["cached"] for c in json.loads(warm_proc.stdout)["cells"])
        _, ours = run([sys.executable, "-c", OUR_CELL], work)
        dump = work / "dump"
        _, theirs = run([sys.executable, "-c", COMPILE_AND_DUMP], work, {"XLA_FLAGS": f"--xla_dump_to={dump}"})
    ours_s = float(ours.stdout.strip().splitlines()[-1])
    theirs_s = float(theirs.stdout.strip().splitlines()[-1])
    numbers = {
        "cells": len(cells), "bare_lowering_sum_s": round(bare_sum, 2), "cold_run_s": round(cold, 2),
        "cold_over_bare": round(cold / bare_sum, 3), "maxtext_import_s": round(import_s, 2),
        "cold_over_bare_plus_import": round(cold / (bare_sum + import_s), 3), "warm_run_s": round(warm, 2),
        "warm_over_cold": round(warm / cold, 3), "warm_cells_from_cache": cached,
        "one_cell": ONE_CELL, "hlo_audit_cell_s": round(ours_s, 2), "lower_compile_dump_s": round(theirs_s, 2),
        "compile_path_over_hlo_audit": round(theirs_s / ours_s, 2),
    }
    if args.json:
        print(json.dumps(numbers, indent=2))
        return 0
    rows = [
        ("bare jax lowering, sum over cells", bare_sum, 1.0),
        ("  + importing MaxText once (paid by any tool)", bare_sum + import_s, (bare_sum + import_s) / bare_sum),
        ("hlo-audit run, cold (process, import, analysis)", cold, cold / bare_sum),
        ("hlo-audit run, warm (cache)", warm, warm / bare_sum),
    ]
    print(f"{'step':50} {'seconds':>9} {'x bare':>8}")
    for name, seconds, ratio in rows:
        print(f"{name:50} {seconds:9.2f} {ratio:8.3f}")
    print(f"target: cold <= 1.15x bare lowering: {'MET' if cold / bare_sum <= 1.15 else 'NOT MET'} "
          f"({cold / bare_sum:.3f}; {cold / (bare_sum + import_s):.3f} against lowering + the MaxText import)")
    print(f"target: warm <= 5% of cold: {'MET' if warm / cold <= 0.05 else 'NOT MET'} ({warm / cold:.1%}; "
          f"{cached} of {len(cells)} cells from cache)")
    print(f"one cell {ONE_CELL}: hlo-audit lower+analyse {ours_s:.2f} s; MaxText-style lower+compile+dump "
          f"{theirs_s:.2f} s = {theirs_s / ours_s:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
