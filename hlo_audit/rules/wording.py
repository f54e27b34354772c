"""The pieces a rule's words are built from: a count with its noun, a change's place, its paths, its share per layer,
two sizes golden to now. Each rule module words its own kinds of change and findings from these
(``spec.KindWords``, ``RuleSpec.numbers``); ``report.words`` and ``report.change_words`` build every other sentence
from the same pieces, so a count, a place or an arrow reads the same wherever it is printed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from hlo_audit.hlo.changes import Action, Change, Place
from hlo_audit.hlo.diff import signed_counts

PATHS_SHOWN = 2
OP_NAME_SHOWN = 60
VERBS = {Action.ADDED: "added", Action.REMOVED: "removed", Action.CHANGED: "changed"}


def plural(n: float, one: str, many: str | None = None) -> str:
    """The noun for ``n`` of it: ``cell`` for 1, ``cells`` otherwise (``many``: an irregular plural, ``leaves``).
    Callers write the number as they format it: ``f"{n:,} {plural(n, 'cell')}"``."""
    return one if abs(n) == 1 else many or one + "s"


def counted(n: int, one: str, many: str | None = None) -> str:
    """``1,234 instructions``, ``1 run``."""
    return f"{n:,} {plural(n, one, many)}"


def golden_to_now(golden, now, spec: str = "") -> str:
    """``golden 83 -> now 87``: the one use of an arrow in a finding, its two ends named (a series' depths are
    ``L2: 87, L4: 163``, never an arrow)."""
    return f"golden {golden:{spec}} -> now {now:{spec}}"


def byte_changes(changes: Mapping[str, tuple[int, int]]) -> str:
    """``temp_bytes golden 2,671,656,960 -> now 2,800,000,000 (+4.8%)``, one per kind."""
    return ", ".join(f"{k} {golden_to_now(a, b, ',')} ({(b - a) / a:+.1%})" if a else f"{k} {golden_to_now(a, b, ',')}"
                     for k, (a, b) in changes.items())


def program_sizes_text(sizes: Mapping[str, tuple[int, int]], by_opcode: Mapping[str, int]) -> str:
    """``instructions 492 -> 397 (-19.3%), instructions per step 1,510 -> 1,150 (-23.8%); per step: multiply -50,
    ...``: what `check`'s program-size finding and `diff` both say of two programs (``comparison.Structural``)."""
    said = ", ".join(f"{k.replace('_', ' ')} {a:,} -> {b:,}" + (f" ({(b - a) / a:+.1%})" if a else "")
                     for k, (a, b) in sizes.items())
    top = sorted(by_opcode.items(), key=lambda kv: (-abs(kv[1]), kv[0]))[:5]
    return said + (f"; per step: {signed_counts(dict(top))}" if top else "")


def place_text(place: Place, paths: bool = True) -> str:
    """``at model.py:72 (…/checkpoint/dot_general) reading state.blocks.*.up.kernel``: what the place says."""
    parts = []
    if place.source:
        parts.append(f"{'near' if place.near else 'at'} {place.source}")
    if place.op_name:
        op_name = place.op_name if len(place.op_name) <= OP_NAME_SHOWN else "…" + place.op_name[-OP_NAME_SHOWN:]
        parts.append(f"({op_name})")
    if place.computation and place.computation != "main":
        parts.append(f"in {place.computation}")
    if paths and place.paths:
        parts.append(f"reading {paths_text(place.paths)}")
    return " ".join(parts)


def in_computation(c: Change, where: str) -> str:
    """``where``, or, where the change's place says nothing (no metadata, no state read), its computation."""
    return where or f"in {c.place.computation or 'main'}"


def paths_text(paths: Sequence[str]) -> str:
    shown = ", ".join(paths[:PATHS_SHOWN])
    return shown + (f" (+{len(paths) - PATHS_SHOWN} more)" if len(paths) > PATHS_SHOWN else "")


def groups_text(groups: Sequence[tuple[str, int]]) -> str:
    """``state.a.* (4), state.b``: path patterns with their counts (one shown bare)."""
    return paths_text([f"{p} ({n})" if n > 1 else p for p, n in groups])


def per_layer(c: Change) -> str:
    if c.layers > 1 and c.count % c.layers == 0:
        return f" ({c.count // c.layers:,} per layer, {c.layers} layers)"
    return ""


def ops_text(c: Change) -> str:
    return ", ".join(f"{op} {n:+d}" for op, n in c.groups[:5])


def leading_int(text: str) -> int | None:
    """``492`` of ``492 instructions``; None where the text does not start with a number."""
    first = text.split()[0] if text.split() else ""
    return int(first) if first.isdigit() else None


def common_paths(paths: Sequence[str]) -> str:
    """``state.params.block_0.* (16)``: the paths' common prefix, or the first of them. A prefix that is only the
    argument's root (``model.* (8)`` says nothing) is split at its next part, a layer's index kept with it:
    ``model.blocks.0.* (6), model.embed.* (2)``."""
    parts = [p.split(".") for p in paths]
    head = 0
    while parts and all(len(p) > head + 1 and p[head] == parts[0][head] for p in parts):
        head += 1
    if len(paths) > 1 and head > 1:
        return f"{'.'.join(parts[0][:head])}.* ({len(paths)})"
    if len(paths) > 1 and head == 1:
        return paths_text([f"{key}.* ({n})" if n > 1 else key for key, n in _under(parts, head).items()])
    return paths_text(list(paths))


def _under(parts: Sequence[Sequence[str]], head: int) -> dict[str, int]:
    """Paths counted by their first ``head + 1`` parts (with the part after, where that is a layer's index), the
    largest group first."""
    groups: Counter = Counter()
    for p in parts:
        depth = head + 2 if len(p) > head + 2 and p[head + 1].isdigit() else head + 1
        groups[".".join(p[:depth]) if len(p) > depth else ".".join(p)] += 1
    return dict(sorted(groups.items(), key=lambda kv: (-kv[1], kv[0])))
