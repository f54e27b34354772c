"""How many times a while loop of an HLO module runs, when the module says: what per-step counts multiply by (RNG
counter increments, rng_flow.py; launches, launches.py and launch_model.py; change_kinds.py's loops).
"""

from __future__ import annotations

import re

from hlo_audit.hlo.text import Computation, Instruction

_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_DIRECTION = re.compile(r"direction=(\w+)")


def trip_count(comp: Computation, loop: Instruction, condition: Computation) -> int | None:
    """Iterations of a while loop: XLA's known_trip_count, or jax's ``i < N`` with ``i`` starting at 0."""
    m = _TRIP_COUNT.search(loop.attrs.get("backend_config", ""))
    if m:
        return int(m.group(1))
    root = condition.root
    if root.opcode != "compare" or len(root.operands) != 2:
        return None
    direction = _DIRECTION.search("direction=" + root.attrs.get("direction", ""))
    if not direction or direction.group(1) != "LT":
        return None
    counter, bound = (condition.by_name[r] for r in root.operands)
    if counter.opcode != "get-tuple-element" or bound.opcode != "constant":
        return None
    index = int(counter.attrs["index"])
    init = comp.by_name.get(loop.operands[0])
    if init is None or init.opcode != "tuple" or index >= len(init.operands):
        return None
    start = comp.by_name.get(init.operands[index])
    try:
        if start is None or start.opcode != "constant" or int(start.literal) != 0:
            return None
        return int(bound.literal)
    except ValueError:
        return None
