"""``conditional``: a ``conditional`` removed or added with its branches' sizes, replaced by computing both branches
and selecting (``jnp.where``): a change to judge, either way."""

from __future__ import annotations

from hlo_audit.hlo.changes import Action, Change, ChangeKind
from hlo_audit.rules.spec import KindWords, change_spec
from hlo_audit.rules.wording import counted

NAME = "conditional"


def _line(c: Change, kind: str, where: str) -> str:
    """``conditional: a conditional removed (2 branches: 271 and 27 instructions), both branches computed, 26 values
    selected; -41 instructions; at train.py:125``."""
    verb = "added" if c.action is Action.ADDED else "removed"
    text = f"{kind}: a conditional {verb} ({c.before}, {counted(c.per_step, 'run')} per step)"
    text += f", {'replaced by ' if c.action is Action.REMOVED else 'replacing '}{c.after}" if c.after else ""
    return f"{text}; {c.instructions:+,} instructions; {where}".rstrip("; ")


SPEC = change_spec(NAME, KindWords(ChangeKind.CONDITIONAL, "conditional", _line),
                   "a lax.cond removed or added (both branches computed)")
