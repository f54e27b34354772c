"""``gradient``: weights the loss no longer reaches (or newly does), optimizer transforms (clipping), loss scaling and
loss terms added or removed: a regression, never an improvement, whatever it does to the program's size."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import NamedChange
from hlo_audit.hlo.changes import Action, Change, ChangeKind
from hlo_audit.rules.spec import Context, KindWords, named_spec, of_kind
from hlo_audit.rules.wording import VERBS, common_paths, counted, ops_text, plural

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "gradient"


def _reach_line(c: Change, kind: str, where: str) -> str:
    lost = c.action is Action.REMOVED
    text = (f"{kind}: reach {'lost' if lost else 'gained'}: {counted(c.count, 'weight')} "
            f"{'no longer' if lost else 'now'} updated from the loss (their updates "
            f"{'no longer depend' if lost else 'depend'} on the batch; {c.after} of {c.before} now): "
            f"{common_paths(c.place.paths)}")
    if c.instructions or c.groups:
        text += f"; {c.instructions:+,} {plural(c.instructions, 'instruction')}"
        text += f" ({ops_text(c)})" if c.groups else ""
    return text


def _transform_line(c: Change, kind: str, where: str) -> str:
    verb = VERBS[c.action]
    text = f"{kind}: {c.subject} {verb} ({c.before}): {c.instructions:+,} {plural(c.instructions, 'instruction')}"
    return f"{text}; {ops_text(c)}" if c.groups else text


def _loss_scaling_line(c: Change, kind: str, where: str) -> str:
    """``loss scaling: removed (loss x1024, 9 values /1024; 3 constants x1024 folded); -18 instructions``."""
    verb = "added" if c.action is Action.ADDED else "removed"
    folded = f"; {c.after}" if c.after else ""
    return f"{kind}: {verb} ({c.before}{folded}); {c.instructions:+,} instructions; {where}".rstrip("; ")


def _loss_term_line(c: Change, kind: str, where: str) -> str:
    """``loss: a term removed (6 reductions, x0.01; 22 instructions of its backward pass); -33 instructions; reading
    state.0.layers_*.router``."""
    verb = "added" if c.action is Action.ADDED else "removed"
    return f"{kind}: a term {verb} ({c.before}; {c.after}); {c.instructions:+,} instructions; {where}".rstrip("; ")


WORDS = (KindWords(ChangeKind.GRADIENT, "gradient", _reach_line),
         KindWords(ChangeKind.TRANSFORM, "optimizer", _transform_line),
         KindWords(ChangeKind.LOSS_SCALING, "loss scaling", _loss_scaling_line),
         KindWords(ChangeKind.LOSS_TERM, "loss", _loss_term_line))
_KINDS = tuple(w.kind for w in WORDS)


def gradient(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Weights the loss no longer reaches (or newly does) and optimizer transforms added or removed (clipping): a
    regression, never an improvement, whatever it does to the program's size."""
    changes = tuple(c for kind in _KINDS for c in of_kind(d, kind, program_changed=True))
    return NamedChange(NAME, True, changes, command=ctx.command(d.cell)) if changes else None


SPEC = named_spec(NAME, gradient, WORDS, "gradient reach lost, optimizer transforms, loss scaling or terms changed",
                  explains_size=True)
