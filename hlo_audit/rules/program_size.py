"""``program_size``: instructions in the text and executed per step, against the golden's, beyond its tolerance,
either way: a program that shrinks is no improvement by itself (lost gradient work, a removed transform or collective
shrink it too), a change to judge as growth is, unless the loops, remat, gradient or conditional rules name what went
(they judge it); nor where only the instructions per step moved with the loops the loops rule names (a trip count:
the same program run more times, not a program of another size)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import Moved, NamedChange
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.rules.spec import Context, Tolerance, named_spec

if TYPE_CHECKING:
    from hlo_audit.compare import CellDelta

NAME = "program_size"
# The kinds whose rules judge a program that shrank with them.
_JUDGED_ELSEWHERE = (ChangeKind.LOOPS, ChangeKind.REMAT, ChangeKind.GRADIENT, ChangeKind.TRANSFORM,
                     ChangeKind.CONDITIONAL, ChangeKind.LOSS_SCALING, ChangeKind.LOSS_TERM)


def program_size(d: CellDelta, ctx: Context) -> NamedChange | None:
    """The ratchet on instructions (in the text and per step) beyond the tolerance. Only a changed program: RNG state
    alone is the count rule's, renames are no change. A program that shrinks because it lost work the loops, remat,
    gradient or transform rules name (a loop rolled, remat removed, gradient reach lost, clipping removed) is no
    improvement: those rules judge it. Where the golden's jax and this one write closed_calls apart
    (``CellDelta.closed_calls_moved``), the finding is advisory."""
    structural, tolerance = d.structural, ctx.tolerance(NAME)
    if structural is None or structural.diff.verdict != "changed":
        return None
    changes = structural.named(ChangeKind.PROGRAM_SIZE)
    sizes = structural.sizes
    grew = any(b > a * (1 + tolerance) for a, b in sizes.values())
    shrank = not grew and any(b < a * (1 - tolerance) for a, b in sizes.values())
    if not (grew or shrank) or shrank and any(structural.named(kind) for kind in _JUDGED_ELSEWHERE):
        return None
    before, after = sizes["instructions"]
    if before * (1 - tolerance) <= after <= before * (1 + tolerance) and structural.named(ChangeKind.LOOPS):
        return None  # the same program run more (or less) per step: the loops' trip counts, the loops rule's words
    # A program that shrinks is no improvement by itself (lost gradient work, a removed transform or collective
    # shrink it too): a change to judge, as growth is.
    return NamedChange(NAME, grew or shrank, changes, sizes=sizes,
                       by_opcode=structural.per_step_by_opcode, tolerance=tolerance, command=ctx.command(d.cell),
                       environment=d.closed_calls_moved, moved_by=Moved.CLOSED_CALLS)


# A jax release moves a module's instruction count by a few percent, and under another environment than the
# golden's this rule still gates: wider than memory's.
SPEC = named_spec(NAME, program_size, (ChangeKind.PROGRAM_SIZE, ChangeKind.LOOPS, *_JUDGED_ELSEWHERE),
                  "instructions (in the text and per step) beyond its tolerance, either way",
                  Tolerance(0.05, "0.05 for 5%", top_level=True))
