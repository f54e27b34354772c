#!/usr/bin/env python3
"""Cache benchmark: what verifying a cached cell's module files costs, two ways, side by side in one run.

A cached lowering holds for the files it read only if none of them changed (``hlo_audit.cache``). A file restored
with its mtime (``cp -p``, ``rsync -a``, ``tar -x``, a CI cache-restore step) keeps size and mtime, so those two
cannot tell. The two sound ways, measured here on the modules a real MaxText train-step lowering loads:

* **hash**: read and SHA-256 every file at every lookup;
* **stat**: one ``stat`` per file, keyed on size, mtime, ctime and inode (a write or a restore sets ctime to now,
  and nothing short of changing the clock sets it back), hashing only the files whose stat changed.

Printed (never asserted): the files and bytes, the best of five warm passes of each way, and their ratio, for
every module file the lowering process loaded (jax, flax, MaxText...: the upper bound, a stack installed editable)
and for MaxText's own files (a contributor's checkout on PYTHONPATH: what its manifests hash).

    python scripts/bench_cache_digest.py [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time


def module_files() -> list[str]:
    """The files of every module loaded after importing what MaxText's train-step lowering imports."""
    from hlo_audit import host

    host.setup_own_process()
    from hlo_audit.targets import maxtext
    from hlo_audit.targets.maxtext_config import load_maxtext

    load_maxtext()
    import maxtext.trainers.pre_train.train  # noqa: F401

    files = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    return sorted(f for f in files if f and os.path.isfile(f))


def by_stat(files: list[str]) -> None:
    for path in files:
        info = os.stat(path)
        (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)


def by_hash(files: list[str]) -> None:
    for path in files:
        with open(path, "rb") as handle:
            hashlib.sha256(handle.read()).hexdigest()


def best(fn, files: list[str], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn(files)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    every = module_files()
    sets = {"every module file": every, "MaxText's files": [f for f in every if "/maxtext/" in f]}
    rows = {}
    for name, files in sets.items():
        stat_s, hash_s = best(by_stat, files), best(by_hash, files)
        rows[name] = {"files": len(files), "bytes": sum(os.path.getsize(f) for f in files),
                      "stat_ms": round(stat_s * 1e3, 2), "hash_ms": round(hash_s * 1e3, 2),
                      "hash_over_stat": round(hash_s / stat_s, 1)}
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for name, row in rows.items():
        print(f"{name}: {row['files']} files, {row['bytes'] / 1e6:.1f} MB: stat {row['stat_ms']} ms, "
              f"hash {row['hash_ms']} ms ({row['hash_over_stat']}x)")


if __name__ == "__main__":
    main()
