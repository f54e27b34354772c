"""``kernels``: Pallas / Mosaic / Triton kernel bodies by content digest (``hlo.kernels``) against the golden
record's; a kernel added or removed from the diff. A golden written before digests were kept compares none."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from hlo_audit.findings import GoldenPart, KernelBody, NamedChange
from hlo_audit.hlo.changes import Change, ChangeKind
from hlo_audit.rules.spec import Context, KindWords, named_spec, of_kind
from hlo_audit.rules.wording import VERBS

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "kernels"


def kernels(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Kernel bodies against the golden record's digests (both sides must have them: a golden from before they were
    kept compares none), and kernels added or removed as the diff names them."""
    golden, now = d.kernels
    bodies: list[KernelBody] = []
    if golden is not None and now is not None:
        bodies = [KernelBody(name, tuple(golden.get(name, ())), tuple(now.get(name, ())))
                  for name in sorted(golden.keys() | now.keys())
                  if Counter(golden.get(name, ())) != Counter(now.get(name, ()))]
    changes = of_kind(d, ChangeKind.KERNEL)
    if not bodies and not changes:
        return None
    return NamedChange(NAME, True, changes, kernels=tuple(bodies), command=ctx.command(d.cell))


def _line(c: Change, kind: str, where: str) -> str:
    return f"{kind} {VERBS[c.action]}: {c.subject}{' x' + str(c.count) if c.count > 1 else ''} {where}".rstrip()


def _numbers(facts: NamedChange) -> list[str]:
    return [f"kernel body changed: {k.name} ({', '.join(k.golden) or 'none'} -> {', '.join(k.now) or 'none'})"
            for k in facts.kernels]


SPEC = named_spec(NAME, kernels, (KindWords(ChangeKind.KERNEL, "kernel", _line),),
                  "kernel bodies by content digest, kernels added or removed",
                  golden_parts=(GoldenPart.KERNEL_DIGESTS,), numbers=_numbers)
