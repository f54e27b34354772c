"""``rng_keys``: random bits drawn from a literal key (``PRNGKey(0)`` inside the step: every call draws the same bits)
or one key drawn from twice without a split or fold_in between (two dropouts drop the same units), beyond the
golden's (``hlo.rng_keys``), placed at the draws; fewer is an improvement."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import NamedChange
from hlo_audit.hlo.changes import Action, ChangeKind
from hlo_audit.rules.spec import Context, named_spec, of_kind

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "rng_keys"


def rng_keys(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Random bits drawn from a literal key, or one key drawn from twice, that the golden's text does not have: a
    regression whatever the text's verdict (a key drawn twice instead of split is RNG state only once stripped);
    fewer, an improvement."""
    changes = of_kind(d, ChangeKind.RNG_KEYS)
    if not changes:
        return None
    return NamedChange(NAME, any(c.action is Action.ADDED for c in changes), changes, command=ctx.command(d.cell))


SPEC = named_spec(NAME, rng_keys, (ChangeKind.RNG_KEYS,), "bits drawn from a literal key, or one key drawn twice")
