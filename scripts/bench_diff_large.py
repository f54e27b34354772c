#!/usr/bin/env python3
"""Benchmark `hlo-audit diff` on a module of 100,000 computations with one constant changed: time and peak memory
of the `diff` process, this checkout beside an earlier commit's, side by side in one run.

    python scripts/bench_diff_large.py [--computations N] [--baseline COMMIT|none] [--repeat N] [--json]

The two modules are generated here (nothing large is committed): computations ``c0`` ... ``cN-1``, each adding its
own constant ``i`` to its parameter, called in a chain from the entry (~4 instructions a computation: 400,000 in
all, 16.7 MB of text); the new module's ``c77777`` adds 1 instead. `diff` must say ``changed (constants)`` and name
the constant with both values and its computation (issue 41).

Each side is ``python -m hlo_audit diff OLD NEW`` in a fresh process, its wall time, CPU time and peak RSS read
from ``wait4`` (the child's own ``ru_maxrss``). The baseline is the commit's ``hlo_audit`` package, extracted with
``git archive`` into a temporary folder (default d19406c, the last landing before the one comparison, whose diff
parsed each input once: 929 MB when issue 41 was filed). Nothing here asserts on time or memory.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BASELINE = "d19406c"
CHANGED = 77777
TARGET_BYTES = 1 << 30  # issue 41: diff under 1 GB on this case


def module(computations: int, changed: int | None = None, to: int = 1) -> str:
    """The chain of ``computations`` computations, the constant of ``changed`` set to ``to``."""
    lines = ["HloModule big, entry_computation_layout={(f32[])->f32[]}", ""]
    for i in range(computations):
        lines.append(f"%c{i} (p: f32[]) -> f32[] {{\n  %p = f32[] parameter(0)\n"
                     f"  %k = f32[] constant({to if i == changed else i})\n  ROOT %a = f32[] add(%p, %k)\n}}\n")
    lines.append("ENTRY %main (x: f32[]) -> f32[] {\n  %v0 = f32[] parameter(0)")
    for i in range(computations):
        root = "ROOT " if i == computations - 1 else ""
        lines.append(f"  {root}%v{i + 1} = f32[] call(%v{i}), to_apply=%c{i}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def run_diff(package_root: pathlib.Path, old: pathlib.Path, new: pathlib.Path) -> dict:
    """``python -m hlo_audit diff OLD NEW`` with ``package_root`` first on the path: its output, exit code, wall
    and CPU seconds and peak RSS (bytes) of that process alone."""
    env = {**os.environ, "PYTHONPATH": str(package_root), "JAX_PLATFORMS": "cpu"}
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "hlo_audit", "diff", str(old), str(new)], stdout=out,
                                 stderr=subprocess.STDOUT, env=env, cwd=package_root)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    return {"exit": child.returncode, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_bytes": usage.ru_maxrss * 1024, "verdict": next(iter(text.splitlines()), ""),
            "constant": next((line.strip() for line in text.splitlines() if str(CHANGED) in line), ""),
            "output": text[-2000:]}


def extract(commit: str, into: pathlib.Path) -> pathlib.Path:
    """The ``hlo_audit`` package of ``commit`` under ``into`` (``git archive``)."""
    archive = into / "baseline.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), commit, "hlo_audit"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "baseline", filter="data")
    return into / "baseline"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--computations", type=int, default=100_000)
    parser.add_argument("--baseline", default=BASELINE, help="commit to measure beside this checkout ('none': skip)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each side, interleaved; the best is kept")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.computations <= CHANGED:
        print(f"error: --computations must exceed {CHANGED} (the constant changed is c{CHANGED}'s)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench_diff_large_") as tmp:
        folder = pathlib.Path(tmp)
        old, new = folder / "old.hlo", folder / "new.hlo"
        old.write_text(module(args.computations))
        new.write_text(module(args.computations, CHANGED))
        sides = {"now": ROOT}
        if args.baseline != "none":
            sides[f"baseline {args.baseline}"] = extract(args.baseline, folder)
        best: dict[str, dict] = {}
        for _ in range(args.repeat):
            for label, root in sides.items():
                ran = run_diff(root, old, new)
                if label not in best or ran["wall_s"] < best[label]["wall_s"]:
                    best[label] = {**ran, "peak_bytes": max(ran["peak_bytes"], best.get(label, ran)["peak_bytes"])}
        result = {"computations": args.computations, "bytes": old.stat().st_size, "repeat": args.repeat,
                  "python": sys.version.split()[0], "sides": best, "target_bytes": TARGET_BYTES}
    print(json.dumps(result, indent=2) if args.json else _table(result))
    return 0


def _table(result: dict) -> str:
    lines = [f"hlo-audit diff of two modules of {result['computations']:,} computations ({result['bytes']:,} bytes "
             f"each), one constant changed; best of {result['repeat']} (peak: the highest of the runs)",
             f"  {'side':<20}{'wall s':>8}{'cpu s':>8}{'peak MB':>9}  exit  verdict; the constant"]
    for label, r in result["sides"].items():
        lines.append(f"  {label:<20}{r['wall_s']:>8.1f}{r['cpu_s']:>8.1f}{r['peak_bytes'] / 1e6:>9.0f}  {r['exit']:>4}"
                     f"  {r['verdict']}; {r['constant'] or '(not named)'}")
    now = result["sides"]["now"]
    met = now["peak_bytes"] < result["target_bytes"] and "constants" in now["verdict"] and "-> 1" in now["constant"]
    verdict = "MET" if met else "NOT MET"
    lines.append(f"target (issue 41): peak under 1 GiB, the constant named with both values: {verdict}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
