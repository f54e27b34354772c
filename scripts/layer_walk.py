"""Follow `hlo-audit check` from the CLI to the report as it runs, and count how often the flow climbs back up the
layers (issue 28's acceptance: at most 5).

    PYTHONPATH=<checkout> python scripts/layer_walk.py PROJECT [--with-targets] [COMMAND ARGS...]

COMMAND is an hlo-audit command line (default: ``check``; ``golden update`` walks a cell from config to its golden).

PROJECT is a folder with an hlo-audit.toml and its goldens; run `hlo-audit check` there once first, so the walk is of
a warm cache (the check's own flow, not MaxText's or jax's lowering). Every call into one of hlo-audit's modules is
recorded in order (sys.setprofile), except the HLO core, the layers that hold data rather than steps (words,
platforms, cells, records: a cell's id, a registry lookup, a result's property), the user's target code (examples),
the cache's hooks on os.environ (they run inside whatever reads the environment while a target is built) and, unless
--with-targets, the lowering side below the pipeline (stages, targets: what a cell lowers, which a warm check only
asks for a fingerprint and a model's depth). Consecutive calls in one module are one visit. A climb is a visit to a
module of a higher layer (hlo_audit.layers) than the visit before it: the flow went down, came back up and went on
from there. A loop that climbs the same way for every cell is one climb: climbs are counted once per (from, to) pair
of modules; the raw count of climbing visits and the modules entered are printed too. Runs against any checkout of
hlo-audit (it reads that checkout's own layer table).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from pathlib import Path

DATA_LAYERS = {"words", "platforms", "cells", "records"}
LOWERING_SIDE = {"stages", "targets"}
USER_CODE = ("examples",)
ENVIRON_HOOKS = {"_getitem", "_setitem", "_delitem", "_copy", "_note"}  # cache's os.environ recorder


def walk(project: str, *args: str, with_targets: bool = False) -> list[str]:
    from typer.testing import CliRunner

    from hlo_audit import layers
    from hlo_audit.cli import app

    root = str(Path(layers.__file__).parent)
    visits: list[str] = []

    def profile(frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(root):
            return
        module = layers.module_name(os.path.relpath(frame.f_code.co_filename, root))
        layer = layers.layer_of(module)
        skipped = DATA_LAYERS if with_targets else DATA_LAYERS | LOWERING_SIDE
        if layer is None or layer == -1 or layers.LAYERS[layer][0] in skipped or module.startswith(USER_CODE):
            return
        if module.startswith("cache") and frame.f_code.co_name in ENVIRON_HOOKS:
            return
        if not visits or visits[-1] != module:
            visits.append(module)

    with contextlib.chdir(project):
        sys.setprofile(profile)
        try:
            result = CliRunner().invoke(app, list(args) or ["check"])
        finally:
            sys.setprofile(None)
    if result.exit_code not in (0, 1):
        raise SystemExit(f"{' '.join(args)} exited {result.exit_code}: {result.output[-2000:]}")
    return visits


def main() -> None:
    from hlo_audit import layers

    args = [a for a in sys.argv[1:] if a != "--with-targets"]
    visits = walk(*args, with_targets="--with-targets" in sys.argv)
    climbs = [(a, b) for a, b in zip(visits, visits[1:]) if layers.layer_of(b) > layers.layer_of(a)]
    distinct = sorted(set(climbs))
    entered = Counter(visits)
    print(f"modules entered: {len(entered)}; visits: {len(visits)}; climbing visits: {len(climbs)}; "
          f"climbs (distinct): {len(distinct)}")
    for a, b in distinct:
        print(f"  climb {a} ({layers.LAYERS[layers.layer_of(a)][0]}) -> {b} ({layers.LAYERS[layers.layer_of(b)][0]})")
    print("  entered: " + ", ".join(f"{m} {n}" for m, n in entered.most_common()))


if __name__ == "__main__":
    main()
