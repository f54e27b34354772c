"""``remat``: rematerialization removed or added, or its policy changed: memory against recomputation, a change to
judge either way."""

from __future__ import annotations

from hlo_audit.hlo.changes import REMAT_POLICY, Action, Change, ChangeKind
from hlo_audit.rules.spec import KindWords, change_spec
from hlo_audit.rules.wording import counted, ops_text, per_layer, plural

NAME = "remat"


def _line(c: Change, kind: str, where: str) -> str:
    if c.subject == REMAT_POLICY:
        text = (f"{kind}: policy changed at {counted(c.count, 'checkpoint')}{per_layer(c)}: {c.before} -> "
                f"{c.after}; the backward pass recomputes {ops_text(c)}")
    else:
        verb = "added" if c.action is Action.ADDED else "removed"
        text = f"{kind}: rematerialization {verb} at {counted(c.count, 'checkpoint')}{per_layer(c)}: " \
               f"{c.instructions:+,} {plural(c.instructions, 'instruction')}"
        text += f" ({ops_text(c)})" if c.groups else ""
        text += f"; {c.after}" if c.after else ""
    return f"{text}; {where}".rstrip("; ")


SPEC = change_spec(NAME, KindWords(ChangeKind.REMAT, "remat", _line),
                   "rematerialization removed or added, or its policy changed")
