"""The pieces a rule's words and JSON details are built from: a count with its noun, a change's place, its paths,
its share per layer, two sizes golden to now, an environment's changes, path patterns, counter increments, launches,
slopes, a host time. Each rule module words its own kinds of change and findings from these (``spec.KindWords``,
``RuleSpec.numbers``, ``RuleSpec.message``, ``RuleSpec.details``); ``report.words`` and ``report.change_words`` build
every other sentence from the same pieces, so a count, a place or an arrow reads the same wherever it is printed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from hlo_audit.findings import EnvironmentChange, IncrementChange, LaunchChange, PatternChanges, SlopeChange
from hlo_audit.hlo.changes import Action, Change, Place
from hlo_audit.hlo.diff import signed_counts

PATHS_SHOWN = 2
# A pull request's changed config lines a place names (a mesh axis declared, its size, a rule using it: a few).
CONFIG_LINES_SHOWN = 4
OP_NAME_SHOWN = 60
Json = dict[str, Any]  # a finding's JSON details (the edge: ``merge.details_record``)
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
    if place.config:  # the changed config lines the cell read, then the code that made the change of them
        shown = ", ".join(place.config[:CONFIG_LINES_SHOWN])
        more = f" (+{len(place.config) - CONFIG_LINES_SHOWN} more)" if len(place.config) > CONFIG_LINES_SHOWN else ""
        parts.append(f"at {shown}{more} (changed config the cell read)")
    if place.source:
        parts.append(f"{'via' if place.config else 'near' if place.near else 'at'} {place.source}")
    if place.on_change is False:  # the pull request's lines are known, and this stack passes none of them
        parts.append("(no changed line in its stack)")
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


def and_list(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def cells_named(ids: Sequence[str], shown: int = 3) -> str:
    """``a, b and c``; past ``shown`` names, ``a, b, c and 4 more``; ``no cell`` for none."""
    if not ids:
        return "no cell"
    if len(ids) <= shown:
        return and_list(list(ids))
    return f"{', '.join(ids[:shown])} and {len(ids) - shown} more"


def environment_text(changes: Sequence[EnvironmentChange]) -> str:
    """``jax 0.11.0 -> 0.12.0.1, libtpu 0.0.52 -> (none), maxtext (none) -> 0.2.5``"""
    def shown(value) -> str:
        return "(none)" if value is None else str(value)

    return ", ".join(f"{c.key} {shown(c.golden)} -> {shown(c.now)}" for c in changes)


def patterns_text(patterns: PatternChanges) -> str:
    """``grown: +84 ...to_nnx__rngs.* (rng_count +42, rng_key +42); renamed: a -> b (6 params)``"""
    def entry(change) -> str:
        roles = f" ({signed_counts(change.roles)})" if change.roles else ""
        return f"{change.delta:+d} {change.pattern}{roles}"

    parts = [f"{kind}: {', '.join(entry(c) for c in getattr(patterns, kind))}" for kind in ("grown", "shrunk")
             if getattr(patterns, kind)]
    if patterns.renamed:
        parts.append("renamed: " + ", ".join(f"{r.before} -> {r.after} ({r.params} {plural(r.params, 'param')})"
                                             for r in patterns.renamed))
    if patterns.retyped:
        parts.append("retyped: " + ", ".join(f"{r.pattern} ({signed_counts({**r.dtypes, **r.roles})})"
                                             for r in patterns.retyped))
    return "; ".join(parts)


PARAM_GROUPS_SHOWN = 4  # parameter groups a text finding names before "and N more"


def param_groups_text(groups) -> str:
    """``+2 state.model.layers.*.scale (f32 weight), -2 ...``: the entry parameters a text differs by, by path
    pattern (``hlo.diff.ParamGroupDelta``); "" when none."""
    shown = ", ".join(f"{g.count:+d} {g.pattern} ({g.dtype} {g.role})" for g in groups[:PARAM_GROUPS_SHOWN])
    more = len(groups) - PARAM_GROUPS_SHOWN
    return shown + (f" and {more} more groups" if more > 0 else "")


def increments_text(increments: IncrementChange) -> str:
    """``RNG counter increments per step 7 -> 679 (carried +672), in state.model...rngs (x3 streams: a, b, c)``"""
    text = (f"RNG counter increments per step {golden_to_now(increments.golden, increments.now, 'g')} "
            f"({signed_counts(increments.by_verdict)})")
    grown = [f"{pattern} {delta:+g} ({', '.join(increments.paths.get(pattern, ()))})"
             for pattern, delta in increments.by_pattern.items() if delta > 0]
    return text + (f" in {'; '.join(grown)}" if grown else "")


def launches_text(launches: LaunchChange) -> str:
    """``kernels per step 580 -> 622 (+42, scalar +42): +42 scalar kernels loop_add_fusion, each reading ...``"""
    lines = launch_lines(launches)
    more = f"; and {len(lines) - 3} more launch groups" if len(lines) > 3 else ""
    return launches_change_text(launches, labelled=True) + (f": {'; '.join(lines[:3])}{more}" if lines else "")


def change_text(before: Mapping[str, int], after: Mapping[str, int], delta: Mapping[str, int],
                labelled: bool = False) -> str:
    """``kernels per step 580 -> 622 (+42, scalar +42)``: two programs' gated launch counts (``total``, ``scalar``,
    ``collectives``) and their differences, as ``diff`` says them (its files named above); ``labelled``: a finding's
    ``golden 580 -> now 622``."""
    moved = ", ".join(f"{v:+d}" if k == "total" else f"{k} {v:+d}" for k, v in delta.items())
    counts = (golden_to_now(before['total'], after['total']) if labelled
              else f"{before['total']} -> {after['total']}")
    return f"kernels per step {counts}" + (f" ({moved})" if moved else " (unchanged)")


def launches_change_text(change: LaunchChange, labelled: bool = False) -> str:
    """``kernels per step 580 -> 622 (+42, scalar +42)`` of two programs' launches (``compare.launch_comparison``)."""
    return change_text(change.golden, change.now, change.delta, labelled)


def launch_lines(change: LaunchChange) -> list[str]:
    """The launch groups that came (``+42 scalar kernels loop_add_fusion, each reading ...``) and went."""
    return [g.describe(signed=True) for g in change.groups]


SLOPE_WORDS = {"params_per_layer": "entry parameters per layer", "rng_per_layer": "RNG parameters per layer",
                "kernels_per_layer": "kernels per layer",
                "rng_kernels_per_layer": "kernels reading RNG state per layer"}


def slopes_text(slopes: SlopeChange) -> str:
    return "; ".join(f"{SLOPE_WORDS[k]} {golden_to_now(a, b, '+g')}" for k, (a, b) in slopes.moved.items())


def host_time(us: float, signed: bool = False) -> str:
    """Microseconds as people read them: ``812 us``, ``26.3 ms`` (``signed``: ``+26.3 ms``)."""
    sign = "+" if signed and us > 0 else "-" if signed and us < 0 else ""
    magnitude = abs(us) if signed else us
    return f"{sign}{magnitude / 1e3:.1f} ms" if magnitude >= 1000 else f"{sign}{magnitude:.0f} us"


# What a text rule's advisory under another compiler stack adds: which run keeps it advisory (``stack.stack_mode``).
LOCAL_STACK = "advisory on this local run (a pinned CI run fails it: CI=true)"


def launch_change_record(change: LaunchChange) -> Json:
    return {"golden": dict(change.golden), "now": dict(change.now), "delta": dict(change.delta),
            "groups": [g.to_record() for g in change.groups], "lines": launch_lines(change)}
