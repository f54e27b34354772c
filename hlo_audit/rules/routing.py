"""``routing``: the step selects by another op (an MoE router's experts by ``argmax`` now ``top_k`` with k=2, a
sampler's ``sort``): which values flow on changes, a change to judge either way (``hlo.change_terms.routing``)."""

from __future__ import annotations

from hlo_audit.hlo.changes import Change, ChangeKind
from hlo_audit.rules.spec import KindWords, change_spec
from hlo_audit.rules.wording import counted, plural

NAME = "routing"


def _line(c: Change, kind: str, where: str) -> str:
    """``routing: argmax x2 -> top_k (k=2) x2, 8 runs per step; -12 instructions; at moe.py:89``."""
    before, after = c.before or "none", c.after or "none"
    text = f"{kind}: {before} -> {after}, {counted(c.per_step, 'run')} per step"
    return f"{text}; {c.instructions:+,} {plural(c.instructions, 'instruction')}; {where}".rstrip("; ")


SPEC = change_spec(NAME, KindWords(ChangeKind.ROUTING, "routing", _line),
                   "a selection by another op (argmax, top_k of another k, sort)")
