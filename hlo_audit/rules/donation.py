"""``donation``: entry parameters that stop being donated (``input_output_alias``, ``buffer_donor``), with their
bytes; at a compiled stage the record's ``alias_bytes`` too, so that a step that lost its donation is not a memory
"improvement" (its temp bytes fall while every donated buffer is now kept beside the outputs). Donation gained is an
improvement to record; alias bytes that grew because the donated buffers grew (no parameter newly donated) are no
donation change: the shapes and memory rules judge them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from hlo_audit.findings import GoldenPart, NamedChange
from hlo_audit.hlo.changes import Action, Change, ChangeKind
from hlo_audit.rules.spec import Context, KindWords, named_spec, of_kind
from hlo_audit.rules.wording import byte_changes, counted, groups_text

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta, Structural

NAME = "donation"
# The memory kinds a lost donation moves (reported with it, not as a memory finding of their own).
_DONATION_MEMORY = ("alias_bytes", "temp_bytes", "argument_bytes", "output_bytes")
# Alias bytes are judged within the memory rule's tolerance: the bytes a lost donation moved are that rule's kinds.
TOLERANCE_OF = "memory"


def donation(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Parameters no longer (or newly) donated, from the diff; at a compiled stage, ``alias_bytes`` against the
    golden's (beyond the memory tolerance) says the same where no text is compared, and the memory that moved with
    it is reported here."""
    golden_memory, memory, tolerance = d.golden.memory, d.result.memory, ctx.tolerance(TOLERANCE_OF)
    changes = of_kind(d, ChangeKind.DONATION)
    sizes: dict[str, tuple[int, int]] = {}
    if golden_memory is not None and memory is not None and "alias_bytes" in golden_memory and "alias_bytes" in memory:
        before, after = golden_memory["alias_bytes"], memory["alias_bytes"]
        if abs(after - before) > tolerance * before or (changes and after != before):
            sizes = {k: (golden_memory[k], memory[k]) for k in _DONATION_MEMORY
                     if k in golden_memory and k in memory and golden_memory[k] != memory[k]}
    if not changes and "alias_bytes" not in sizes:
        return None
    if not changes and _buffers_grew(d.structural, sizes):
        return None
    lost = any(c.action is Action.REMOVED for c in changes) or (
        "alias_bytes" in sizes and sizes["alias_bytes"][1] < sizes["alias_bytes"][0])
    return NamedChange(NAME, lost, changes, sizes=sizes, command=ctx.command(d.cell))


def _buffers_grew(structural: Structural | None, sizes: Mapping[str, tuple[int, int]]) -> bool:
    """Alias bytes that grew with no parameter newly donated: the donated buffers grew (a KV cache of twice the
    length), a change of shapes the shapes and memory rules judge, never a donation gained. Without a text compared,
    the arguments grew by as much."""
    before, after = sizes["alias_bytes"]
    if after <= before:
        return False
    if structural is not None:
        return True
    arguments = sizes.get("argument_bytes", (0, 0))
    return arguments[1] - arguments[0] >= after - before


def _line(c: Change, kind: str, where: str) -> str:
    if c.action is Action.REMOVED:
        text = (f"{counted(c.count, 'parameter')} no longer donated ({c.subject}): +{c.bytes:,} bytes kept on "
                f"device beside the step's outputs")
        roles = c.before
    else:
        text = f"{counted(c.count, 'parameter')} now donated ({c.subject}): {c.bytes:,} bytes reused"
        roles = c.after
    patterns = groups_text(c.groups)
    return f"{kind}: {text}; {roles}: {patterns}"


def _numbers(facts: NamedChange) -> list[str]:
    """The compiled memory the donation moved, where the cell is compiled."""
    if not facts.sizes:
        return []
    lost = "; the cost of the lost donation, not a memory improvement" if facts.worse else ""
    return [f"compiled memory: {byte_changes(facts.sizes)}{lost}"]


SPEC = named_spec(NAME, donation, (KindWords(ChangeKind.DONATION, "donation", _line),),
                  "parameters no longer donated, and the alias bytes a compiled cell lost with them",
                  golden_parts=(GoldenPart.MEMORY,), numbers=_numbers)
