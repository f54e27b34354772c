"""``program_size``: instructions in the text and executed per step, against the golden's, beyond its tolerance,
either way: a program that shrinks is no improvement by itself (lost gradient work, a removed transform or collective
shrink it too), a change to judge as growth is, unless the loops, remat, gradient, conditional, precision or routing
rules name what went (they judge it); nor where only the instructions per step moved with the loops the loops rule
names (a trip count: the same program run more times, not a program of another size)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import Moved, NamedChange
from hlo_audit.hlo.changes import RANDOM_BITS, Action, Change, ChangeKind
from hlo_audit.rules.spec import Context, KindWords, Tolerance, named_spec
from hlo_audit.rules.wording import leading_int, ops_text, plural, program_sizes_text

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "program_size"


def program_size(d: CellDelta, ctx: Context) -> NamedChange | None:
    """The ratchet on instructions (in the text and per step) beyond the tolerance. Only a changed program: RNG state
    alone is the count rule's, renames are no change. A program that shrinks because it lost work the loops, remat,
    gradient, transform, precision or routing rules name (a loop rolled, remat removed, gradient reach lost, clipping
    removed, argmax's computations gone with top-k) is no improvement: those rules judge it. Where the golden's jax
    and this one write closed_calls apart (``CellDelta.closed_calls_moved``), the finding is advisory."""
    structural, tolerance = d.structural, ctx.tolerance(NAME)
    if structural is None or structural.diff.verdict != "changed":
        return None
    changes = structural.named(ChangeKind.PROGRAM_SIZE)
    sizes = structural.sizes
    grew = any(b > a * (1 + tolerance) for a, b in sizes.values())
    shrank = not grew and any(b < a * (1 - tolerance) for a, b in sizes.values())
    elsewhere = ctx.size_explained  # the kinds whose rules judge a program that shrank with them (their specs say)
    if not (grew or shrank) or shrank and any(structural.named(kind) for kind in elsewhere):
        return None
    before, after = sizes["instructions"]
    if _explained(structural, changes, before, after, tolerance, elsewhere):
        return None
    if before * (1 - tolerance) <= after <= before * (1 + tolerance) and structural.named(ChangeKind.LOOPS):
        return None  # the same program run more (or less) per step: the loops' trip counts, the loops rule's words
    # A program that shrinks is no improvement by itself (lost gradient work, a removed transform or collective
    # shrink it too): a change to judge, as growth is.
    return NamedChange(NAME, grew or shrank, changes, sizes=sizes,
                       by_opcode=structural.per_step_by_opcode, tolerance=tolerance, command=ctx.command(d.cell),
                       environment=d.closed_calls_moved, moved_by=Moved.CLOSED_CALLS)


def _explained(structural, changes, before: int, after: int, tolerance: float,
               elsewhere: tuple[ChangeKind, ...]) -> bool:
    """Whether the instructions the rules judging elsewhere name (remat's checkpoints and recomputation, a loss term,
    clipping, a routing's selection, a precision change's converts; the random-bit computations a literal or reused
    key brings, where the rng_keys rule names one) account for the program's growth but for its tolerance: a program
    that grew by what another finding says is not counted again (the per-step count moves with them: those are the
    instructions it runs)."""
    named = [c.instructions for kind in elsewhere for c in structural.named(kind)]
    if structural.named(ChangeKind.RNG_KEYS):  # a program-size record's instructions are the whole difference:
        # of the random bits, the instructions that are theirs (its count), with their sign
        named += [c.count if c.action is Action.ADDED else -c.count for c in changes if c.subject == RANDOM_BITS]
    left = after - before - sum(named)
    return bool(named) and abs(left) <= before * tolerance


def _line(c: Change, kind: str, where: str) -> str:
    """``program size: rematerialization removed: -95 instructions (-19.3%), 492 instructions -> 397 instructions``;
    where the kinds named before it took part of the program's change, what is left is said as such beside the
    program's whole change, so the two numbers never read as one (``+0 instructions, 1742 -> 1961``)."""
    before, after = leading_int(c.before), leading_int(c.after)
    ops = ops_text(c)
    if before is not None and after is not None and after - before != c.instructions:
        whole = after - before
        share = f", {whole / before:+.1%}" if before else ""
        text = (f"{kind}: {c.subject}: {c.instructions:+,} {plural(c.instructions, 'instruction')} besides the changes "
                f"named above; the program {c.before} -> {c.after} ({whole:+,}{share})")
    else:
        share = f" ({c.instructions / before:+.1%})" if before else ""
        text = (f"{kind}: {c.subject}: {c.instructions:+,} {plural(c.instructions, 'instruction')}{share}, "
                f"{c.before} -> {c.after}")
    if c.layers > 1:
        text += f" ({c.instructions / c.layers:+,.0f} per layer, {c.layers} layers)"
    text += f"; {ops}" if ops else ""
    return f"{text}; {where}".rstrip("; ")


def _numbers(facts: NamedChange) -> list[str]:
    return [f"against the golden (tolerance {facts.tolerance:.0%}): "
            f"{program_sizes_text(facts.sizes, facts.by_opcode)}"]


# A jax release moves a module's instruction count by a few percent, and under another environment than the
# golden's this rule still gates: wider than memory's.
SPEC = named_spec(NAME, program_size, (KindWords(ChangeKind.PROGRAM_SIZE, "program size", _line),),
                  "instructions (in the text and per step) beyond its tolerance, either way",
                  Tolerance(0.05, "0.05 for 5%", top_level=True),
                  also_reads=(ChangeKind.RNG_KEYS,), numbers=_numbers)
