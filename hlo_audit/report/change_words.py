"""The named changes of a diff (``hlo.changes``) in words: one line each, the same in every format that prints them.

Each line says the kind, what changed, how much, and where (the source line, jax's op_name, the state paths that
flow in), e.g. ``precision: 8 dots at state.blocks.*.up.kernel (4 per layer, 2 layers): bf16 x bf16 -> bf16 now
f32 x f32 -> f32; converts -6; 32,768 FLOPs per step moved; at model.py:72``. A diff lists at most ``SHOWN`` of
them and says how many more there are (``--format json`` has every one).
"""

from __future__ import annotations

from collections.abc import Sequence

from hlo_audit.hlo.changes import REWIRED, Action, Change, MatchSummary
from hlo_audit.rules import registry
from hlo_audit.rules.wording import counted, per_layer, place_text

SHOWN = 12  # named changes a diff prints before "... N more"


def change_line(c: Change) -> str:
    """One named change in words (module doc): its kind's own line, worded by the rule that words the kind
    (``registry.kind_words``), else the common line."""
    words = registry.kind_words(c.kind)
    where = place_text(c.place)
    if words.line is not None:
        return words.line(c, words.word, where)
    if c.subject == REWIRED:
        ops = ", ".join(f"{op} {n}" for op, n in c.groups[:4])
        return f"{words.word}: {counted(c.count, 'instruction')} rewired (the same op reading other values: {ops}), " \
               "following the changes above"
    verb = {Action.ADDED: "+", Action.REMOVED: "-", Action.CHANGED: ""}[c.action]
    text = f"{words.word}: {verb}{c.count} {c.subject}{per_layer(c)}"
    if c.before or c.after:
        text += f": {c.before} -> {c.after}"
    return f"{text} {where}".rstrip()


def named_lines(changes: Sequence[Change], shown: int = SHOWN) -> list[str]:
    """The first ``shown`` changes' lines, then one line for the rest."""
    lines = [change_line(c) for c in changes[:shown]]
    rest = changes[shown:]
    if rest:
        instructions = sum(abs(c.instructions) or c.count for c in rest)
        lines.append(f"... {len(rest)} more changes ({counted(instructions, 'instruction')}): --format json lists "
                     "every one, --text shows the text")
    return lines


def match_line(m: MatchSummary) -> str:
    """The matched remainder in one line: ``1,234 of 1,240 instructions unchanged; 4 changed, 6 inserted, 2
    deleted; 24 of 24 computations matched``."""
    old, new = m.instructions
    text = f"{m.unchanged:,} of {counted(old, 'instruction')} unchanged"
    text += f" ({new:,} now)" if new != old else ""
    edits = [f"{n:,} {word}" for n, word in ((m.changed, "changed"), (m.inserted, "inserted"), (m.deleted, "deleted"))
             if n]
    if edits:
        text += "; " + ", ".join(edits)
    comps_old, comps_new = m.computations
    matched = comps_old - m.computations_deleted
    text += f"; {matched} of {counted(comps_old, 'computation')} matched"
    extra = [f"{m.computations_inserted} added" if m.computations_inserted else "",
             f"{m.computations_deleted} removed" if m.computations_deleted else ""]
    extra = [e for e in extra if e]
    return text + (f" ({', '.join(extra)})" if extra else "")
