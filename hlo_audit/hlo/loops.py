"""How many times a while loop of an HLO module runs, when the module says: what per-step counts multiply by (RNG
counter increments, rng_flow.py; launches, launches.py and launch_model.py; change_places.py and change_kinds.py's
loops).

Two ways a module says it. XLA's ``known_trip_count`` in the loop's ``backend_config`` (``{"known_trip_count":
{"n":"16"}}``), which its optimized modules carry where XLA worked it out. Else the shape jax gives every
``fori_loop`` and ``scan``: the loop state's counter starts at a constant, the condition is ``counter < bound``, and
the body adds a constant step. An optimizing compiler moves those constants: TPU's passes the counter's initial
0 through a ``copy`` (measured on a v5e, 2026-12-05: a scan of 16 layers read as 1 trip), sinks the constants into
the body and condition, and wraps values in bitcasts and converts. So each of start, bound and step is read
through the ops that pass a value on unchanged (``_PASS_ON``) and through a tuple taken apart again.
"""

from __future__ import annotations

import json

from hlo_audit.hlo.json_attrs import canonical_attr_value
from hlo_audit.hlo.text import Computation, HloModule, Instruction

# Ops whose result is their one operand's value (an integer counter converted to another integer type keeps it).
_PASS_ON = frozenset({"copy", "bitcast", "convert", "reshape"})
_COMPARES = {"LT": 0, "LE": 1}  # counter < bound, counter <= bound (one trip more)
_MIRRORED = {"GT": "LT", "GE": "LE"}  # bound > counter is counter < bound
_MAX_STEPS = 64  # ops followed back from a value before giving up (a chain of wrappers is a few)


def trip_count(module: HloModule, comp: Computation, loop: Instruction) -> int | None:
    """Iterations of the while loop ``loop`` of ``comp``: XLA's known_trip_count, else a counter read from its
    initial value, condition and body (module doc); None when the module does not say."""
    known = _known_trip_count(loop)
    if known is not None:
        return known
    condition = module.computations.get(loop.attrs.get("condition", "").strip().lstrip("%"))
    body = module.computations.get(loop.attrs.get("body", "").strip().lstrip("%"))
    if condition is None or not loop.operands:
        return None
    counted = _counter_and_bound(module, condition)
    if counted is None:
        return None
    index, bound, inclusive = counted
    start = _constant(comp, comp.by_name.get(loop.operands[0]), index)
    step = _step(module, body, index) if body is not None else None
    if start is None or step is None or step <= 0:
        return None
    return max(0, -(-(bound + inclusive - start) // step))


def _known_trip_count(loop: Instruction) -> int | None:
    config = loop.attrs.get("backend_config")
    if not config or "known_trip_count" not in config:
        return None
    try:
        n = json.loads(canonical_attr_value(config))["known_trip_count"]["n"]
        return int(n)
    except (ValueError, TypeError, KeyError):
        return None


def _counter_and_bound(module: HloModule, condition: Computation) -> tuple[int, int, int] | None:
    """The loop state's counter index, the bound it is compared with and 1 for ``<=`` (0 for ``<``), from a
    condition whose root is ``compare(counter, bound)``."""
    compare = _operation(module, condition, condition.root)
    if compare is None or compare[0].opcode != "compare" or len(compare[1]) != 2:
        return None
    direction = compare[0].attrs.get("direction", "").strip()
    counter, bound = (_passed_on(condition, operand) for operand in compare[1])
    if direction in _MIRRORED:
        direction, counter, bound = _MIRRORED[direction], bound, counter
    inclusive = _COMPARES.get(direction)
    if inclusive is None:
        return None
    index = _state_index(condition, counter)
    limit = _constant(condition, bound)
    if index is None or limit is None:
        return None
    return index, limit, inclusive


def _step(module: HloModule, body: Computation, index: int) -> int | None:
    """What the body adds to the counter each trip: the root tuple's ``index`` is ``counter + constant``."""
    root = _passed_on(body, body.root)
    if root is None or root.opcode != "tuple" or index >= len(root.operands):
        return None
    update = _operation(module, body, body.by_name.get(root.operands[index]))
    if update is None or update[0].opcode != "add" or len(update[1]) != 2:
        return None
    a, b = (_passed_on(body, operand) for operand in update[1])
    for counter, step in ((a, b), (b, a)):
        if _state_index(body, counter) == index:
            return _constant(body, step)
    return None


def _operation(module: HloModule, comp: Computation, instr: Instruction | None
               ) -> tuple[Instruction, list[Instruction | None]] | None:
    """The operation ``instr`` does and its operands in ``comp``, through ops that pass a value on and through a
    fusion that wraps one operation of its parameters (XLA's CPU and GPU compilers wrap a loop's ``compare`` and
    ``add`` so: ``wrapped_compare``)."""
    instr = _passed_on(comp, instr)
    if instr is None or instr.opcode != "fusion":
        return None if instr is None else (instr, [comp.by_name.get(r) for r in instr.operands])
    fused = module.computations.get(instr.attrs.get("calls", "").strip().lstrip("%"))
    inner = _passed_on(fused, fused.root) if fused is not None else None
    if inner is None:
        return None
    operands = []
    for ref in inner.operands:
        param = _passed_on(fused, fused.by_name.get(ref))
        if param is None or param.opcode != "parameter" or param.parameter_number >= len(instr.operands):
            return None
        operands.append(comp.by_name.get(instr.operands[param.parameter_number]))
    return inner, operands


def _state_index(comp: Computation, instr: Instruction | None) -> int | None:
    """Which element of the computation's loop-state parameter ``instr`` is (``get-tuple-element(param), index=i``)."""
    if instr is None or instr.opcode != "get-tuple-element" or not instr.operands:
        return None
    source = _passed_on(comp, comp.by_name.get(instr.operands[0]))
    if source is None or source.opcode != "parameter":
        return None
    return _tuple_index(instr)


def _tuple_index(instr: Instruction) -> int | None:
    index = instr.attrs.get("index", "").strip()
    return int(index) if index.isdigit() else None


def _passed_on(comp: Computation, instr: Instruction | None) -> Instruction | None:
    """The instruction whose value ``instr`` holds, through copies, bitcasts, converts and reshapes."""
    for _ in range(_MAX_STEPS):
        if instr is None or instr.opcode not in _PASS_ON or len(instr.operands) != 1:
            return instr
        instr = comp.by_name.get(instr.operands[0])
    return None


def _constant(comp: Computation, instr: Instruction | None, element: int | None = None) -> int | None:
    """The integer an instruction holds when it is a constant, read through ops that pass a value on and through
    tuples taken apart (``element``: of the tuple ``instr``, which element)."""
    path = [] if element is None else [element]
    for _ in range(_MAX_STEPS):
        instr = _passed_on(comp, instr)
        if instr is None:
            return None
        if instr.opcode == "get-tuple-element" and instr.operands and _tuple_index(instr) is not None:
            path.append(_tuple_index(instr))
            instr = comp.by_name.get(instr.operands[0])
        elif instr.opcode == "tuple" and path:
            at = path.pop()
            instr = comp.by_name.get(instr.operands[at]) if at < len(instr.operands) else None
        elif instr.opcode == "constant" and not path:
            try:
                return int(instr.literal.strip())
            except ValueError:
                return None
        else:
            return None
    return None
