#!/usr/bin/env python3
"""Recorder benchmark: a cell's lowering with and without the recorder, side by side in one run (issue 45, item 6).

A cell's process (``hlo_audit.worker``) is forked from the process that imported the target, then lowers under the
recorder (``cache.recording_environment``: audit hooks, wrapped imports and stats, ``sys.monitoring``'s first run of
each code object) and keys what it read (``reads_after``: files hashed, code objects compiled and digested). Here the
same: each measurement forks a fresh process from one that imported the target, which lowers the cell bare or
recorded (and keyed), alternating, and the best of each is compared. Printed as a ratio, never asserted. Target: the
recorded lowering within 10% of a bare one.

    python scripts/bench_recorder.py [--maxtext] [--runs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _child(target, cell, recorded: bool, write_end: int) -> None:
    from hlo_audit.cache import reads_after, recording_environment

    started = time.perf_counter()
    if recorded:
        with recording_environment() as window:
            target.lower(cell)
        reads_after(window, frozenset(getattr(target, "code_under_test", ())))
    else:
        target.lower(cell)
    os.write(write_end, f"{time.perf_counter() - started}\n".encode())
    os._exit(0)


def measure(target, cell, recorded: bool) -> float:
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _child(target, cell, recorded, write_end)
    os.close(write_end)
    with os.fdopen(read_end) as handle:
        seconds = float(handle.read() or "nan")
    os.waitpid(pid, 0)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maxtext", action="store_true", help="MaxText's llama3-8b train step at 2 layers too")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from hlo_audit import host

    host.setup_own_process()
    from hlo_audit.cache import importing_target, warm
    from hlo_audit.matrix import Cell
    from hlo_audit.targets import get_target

    cases = [("example MLP (nnx, L4)", "hlo_audit.examples.nnx_mlp:lower", Cell("mlp", False, "none", 4,
                                                                              target="hlo_audit.examples.nnx_mlp:lower"))]
    if args.maxtext:
        cases.append(("MaxText llama3-8b L2", "maxtext", Cell("llama3-8b", False, "none", 2)))
    rows = []
    for name, spec, cell in cases:
        with importing_target():
            target = get_target(spec)
            if hasattr(target, "preload"):
                target.preload()
        warm(frozenset(getattr(target, "code_under_test", ())))  # as the target process does before its cells fork
        bare, recorded = [], []
        for _ in range(args.runs):
            bare.append(measure(target, cell, False))
            recorded.append(measure(target, cell, True))
        rows.append({"case": name, "bare_s": min(bare), "recorded_s": min(recorded),
                     "ratio": min(recorded) / min(bare)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(f"{row['case']}: bare {row['bare_s']:.3f} s, recorded and keyed {row['recorded_s']:.3f} s: "
              f"{row['ratio']:.2f}x (best of {args.runs} each, each in a process forked for it)")


if __name__ == "__main__":
    main()
