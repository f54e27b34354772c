"""``rng_keys``: random bits drawn from a literal key (``PRNGKey(0)`` inside the step: every call draws the same bits)
or one key drawn from twice without a split or fold_in between (two dropouts drop the same units), beyond the
golden's (``hlo.rng_keys``), placed at the draws; fewer is an improvement."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import NamedChange
from hlo_audit.hlo.changes import LITERAL_KEY, LOOP_KEY, Action, Change, ChangeKind
from hlo_audit.rules.spec import Context, KindWords, named_spec
from hlo_audit.rules.wording import counted

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "rng_keys"


def rng_keys(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Random bits drawn from a literal key, or one key drawn from twice, that the golden does not have
    (``CellDelta.key_changes``: its text's, or, for a stage whose text is XLA's, those of the module XLA was handed): a
    regression whatever the text's verdict; fewer, an improvement."""
    changes = d.key_changes
    if not changes:
        return None
    return NamedChange(NAME, any(c.action is Action.ADDED for c in changes), changes, command=ctx.command(d.cell))


def _line(c: Change, kind: str, where: str) -> str:
    """``rng keys: a literal key drawn from at model.py:12 (…): every call draws the same bits (no entry parameter
    upstream; literal keys 0 -> 1)``; a key drawn from twice with its draws; fewer, in numbers."""
    if c.action is Action.REMOVED:
        return f"{kind}: {counted(c.count, c.subject, c.subject.replace('key', 'keys', 1))} fewer ({c.before} -> " \
               f"{c.after})"
    tally = f"{'literal' if c.subject == LITERAL_KEY else 'reused'} keys {c.before} -> {c.after}"
    if c.subject == LITERAL_KEY:
        return f"{kind}: a literal key drawn from {where}: every call draws the same bits (no entry parameter " \
               f"upstream: pass the key in and split it per step); {tally}"
    also = f", again at {', '.join(p for p, _ in c.groups[:3])}" if c.groups else ""
    if c.subject == LOOP_KEY:
        return f"{kind}: one key drawn from on every loop iteration, unchanged ({c.per_step} draws per step) " \
               f"{where}: every iteration draws the same bits (fold_in the iteration or split per layer); {tally}"
    return f"{kind}: one key drawn from {c.per_step} times without a split or fold_in between {where}{also}: the " \
           f"draws are the same bits (split the key or fold_in per draw); {tally}"


SPEC = named_spec(NAME, rng_keys, (KindWords(ChangeKind.RNG_KEYS, "rng keys", _line),),
                  "bits drawn from a literal key, or one key drawn twice")
