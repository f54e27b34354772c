"""What a step writes back for each entry parameter: the weights an update writes, whatever they are called.

A train step returns its state. An optimizer's update writes a trainable leaf as ``p + u`` (``optax`` and
equinox's ``apply_updates``; ``p - lr * g`` for hand-written SGD): the leaf itself is an operand of the
``add`` / ``subtract`` that the step returns. A frozen leaf (a partition filter that leaves it out of the
gradient) comes back as it came in. A batch does not come back at all, and an optimizer's moments come back as
``b * m + (1 - b) * g``, the leaf only under a multiply. So what comes back, and how, says what a leaf is where
neither its type nor its name does (an equinox model's fields, a plain dict's leaves): ``params._roles`` reads
it. jax-free: the entry computation's root alone, through the ops that only carry a value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hlo_audit.hlo.rng_flow import PASS_THROUGH_CUSTOM_CALLS
from hlo_audit.hlo.text import Computation, HloModule, Instruction

# Ops that carry a value unchanged in what it is (a dtype cast back after the update, a layout copy; and the
# custom calls that only annotate sharding or placement, rng_flow's).
_CARRIES = frozenset({"convert", "copy", "bitcast", "reshape", "bitcast-convert"})
_UPDATES = frozenset({"add", "subtract"})


class WrittenBack(enum.Enum):
    UPDATED = "updated"     # returned as itself plus or minus a computed value: an optimizer's write
    RETURNED = "returned"   # returned as it came in


def _source(comp: Computation, name: str) -> Instruction | None:
    """The instruction ``name`` carries, through ``_CARRIES``."""
    instr = comp.by_name.get(name)
    while instr is not None and instr.operands and (instr.opcode in _CARRIES or instr.opcode == "custom-call"
                                                    and instr.custom_call_target in PASS_THROUGH_CUSTOM_CALLS):
        instr = comp.by_name.get(instr.operands[0])
    return instr


@dataclass(frozen=True)
class Write:
    how: WrittenBack
    output: int  # the root tuple's operand that returns it


def written_back(module: HloModule) -> dict[int, Write]:
    """Entry parameter number -> how the step returns it and where, for the parameters it returns as themselves or
    updated by an ``add`` / ``subtract`` of which they are an operand; an entry whose root is not a tuple says
    nothing."""
    entry = module.entry
    root = entry.root
    if root is None or root.opcode != "tuple":
        return {}
    found: dict[int, Write] = {}
    for output, operand in enumerate(root.operands):
        value = _source(entry, operand)
        if value is None:
            continue
        if value.opcode == "parameter" and value.parameter_number is not None:
            found.setdefault(value.parameter_number, Write(WrittenBack.RETURNED, output))
        elif value.opcode in _UPDATES:
            for term in value.operands:
                source = _source(entry, term)
                if source is not None and source.opcode == "parameter" and source.parameter_number is not None:
                    found[source.parameter_number] = Write(WrittenBack.UPDATED, output)
    return found
