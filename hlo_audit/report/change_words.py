"""The named changes of a diff (``hlo.changes``) in words: one line each, the same in every format that prints them.

Each line says the kind, what changed, how much, and where (the source line, jax's op_name, the state paths that
flow in), e.g. ``precision: 8 dots at state.blocks.*.up.kernel (4 per layer, 2 layers): bf16 x bf16 -> bf16 now
f32 x f32 -> f32; converts -6; 32,768 FLOPs per step moved; at model.py:72``. A diff lists at most ``SHOWN`` of
them and says how many more there are (``--format json`` has every one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hlo_audit.hlo.changes import (
    LITERAL_KEY,
    LOOP_KEY,
    REMAT_POLICY,
    REWIRED,
    ROLLED,
    TRIP_COUNT,
    UNROLLED,
    Action,
    Change,
    ChangeKind,
    MatchSummary,
    Place,
)

SHOWN = 12  # named changes a diff prints before "... N more"
_PATHS_SHOWN = 2
_OP_NAME_SHOWN = 60

_KIND_WORDS = {
    ChangeKind.DONATION: "donation", ChangeKind.HOST_TRANSFER: "host transfer", ChangeKind.PRECISION: "precision",
    ChangeKind.RNG_KEYS: "rng keys",
    ChangeKind.KERNEL: "kernel", ChangeKind.CONSTANTS: "constants", ChangeKind.GRADIENT: "gradient",
    ChangeKind.TRANSFORM: "optimizer",
    ChangeKind.LOOPS: "loops", ChangeKind.REMAT: "remat", ChangeKind.COLLECTIVES: "collectives",
    ChangeKind.SHARDING: "sharding", ChangeKind.SHAPES: "shapes", ChangeKind.OPS: "ops", ChangeKind.RENAME: "rename",
    ChangeKind.PARAMETERS: "parameters", ChangeKind.CONDITIONAL: "conditional",
    ChangeKind.LOSS_SCALING: "loss scaling", ChangeKind.LOSS_TERM: "loss", ChangeKind.ROUTING: "routing",
    ChangeKind.PROGRAM_SIZE: "program size", ChangeKind.HEADER: "header", ChangeKind.INSTRUCTIONS: "instructions",
}


def kind_word(kind: ChangeKind) -> str:
    return _KIND_WORDS[kind]


def place_text(place: Place, paths: bool = True) -> str:
    """``at model.py:72 (…/checkpoint/dot_general) reading state.blocks.*.up.kernel``: what the place says."""
    parts = []
    if place.source:
        parts.append(f"{'near' if place.near else 'at'} {place.source}")
    if place.op_name:
        op_name = place.op_name if len(place.op_name) <= _OP_NAME_SHOWN else "…" + place.op_name[-_OP_NAME_SHOWN:]
        parts.append(f"({op_name})")
    if place.computation and place.computation != "main":
        parts.append(f"in {place.computation}")
    if paths and place.paths:
        parts.append(f"reading {_paths(place.paths)}")
    return " ".join(parts)


def _paths(paths: Sequence[str]) -> str:
    shown = ", ".join(paths[:_PATHS_SHOWN])
    return shown + (f" (+{len(paths) - _PATHS_SHOWN} more)" if len(paths) > _PATHS_SHOWN else "")


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {_noun(n, one, many)}"


def _noun(n: int, one: str, many: str | None = None) -> str:
    return one if abs(n) == 1 else many or one + "s"


def _per_layer(c: Change) -> str:
    if c.layers > 1 and c.count % c.layers == 0:
        return f" ({c.count // c.layers:,} per layer, {c.layers} layers)"
    return ""


def change_line(c: Change) -> str:
    """One named change in words (module doc)."""
    kind = kind_word(c.kind)
    where = place_text(c.place)
    worded = _WORDED.get(c.kind)
    if worded is not None:
        return worded(c, kind, where)
    if c.kind is ChangeKind.HOST_TRANSFER:
        verb = "added" if c.action is Action.ADDED else "removed"
        where = where or f"in {c.place.computation or 'main'}"  # no metadata, no state read: its computation
        return f"{kind} {verb}: {c.subject}{' x' + str(c.count) if c.count > 1 else ''} {where}, " \
               f"{_plural(c.per_step, 'run')} per step"
    if c.kind is ChangeKind.KERNEL:
        verb = {Action.ADDED: "added", Action.REMOVED: "removed", Action.CHANGED: "changed"}[c.action]
        return f"{kind} {verb}: {c.subject}{' x' + str(c.count) if c.count > 1 else ''} {where}".rstrip()
    if c.kind is ChangeKind.RENAME:
        text = f"{kind}: {c.before} -> {c.after}, {_plural(c.count, 'parameter')}"
        return f"{text}: {_paths([f'{p} ({n})' if n > 1 else p for p, n in c.groups])}"
    if c.kind is ChangeKind.HEADER:
        return f"{kind}: {c.subject} {c.before} -> {c.after}"
    if c.subject == REWIRED:
        ops = ", ".join(f"{op} {n}" for op, n in c.groups[:4])
        return f"{kind}: {_plural(c.count, 'instruction')} rewired (the same op reading other values: {ops}), " \
               "following the changes above"
    verb = {Action.ADDED: "+", Action.REMOVED: "-", Action.CHANGED: ""}[c.action]
    text = f"{kind}: {verb}{c.count} {c.subject}{_per_layer(c)}"
    if c.before or c.after:
        text += f": {c.before} -> {c.after}"
    return f"{text} {where}".rstrip()


def _donation(c: Change, kind: str, where: str) -> str:
    if c.action is Action.REMOVED:
        text = (f"{_plural(c.count, 'parameter')} no longer donated ({c.subject}): +{c.bytes:,} bytes kept on "
                f"device beside the step's outputs")
        roles = c.before
    else:
        text = f"{_plural(c.count, 'parameter')} now donated ({c.subject}): {c.bytes:,} bytes reused"
        roles = c.after
    patterns = _paths([f"{p} ({n})" if n > 1 else p for p, n in c.groups])
    return f"{kind}: {text}; {roles}: {patterns}"


def _precision(c: Change, kind: str, where: str) -> str:
    text = f"{kind}: {_plural(c.count, c.subject)}{_per_layer(c)}: {c.before} now {c.after}"
    if c.instructions:
        text += f"; converts {c.instructions:+d}"
    follow = sum(n for op, n in c.groups if op != "rewired")
    if follow:
        text += f"; {_plural(follow, 'op')} follow the dtype"
    if c.flops:
        text += f"; {c.flops:,} FLOPs per step moved"
    return f"{text}; {where}".rstrip("; ")


def _parameters(c: Change, kind: str, where: str) -> str:
    if c.action is Action.CHANGED:
        return f"{kind}: {_plural(c.count, 'parameter')} {c.subject}: {c.before} -> {c.after} " \
               f"({c.bytes:+,} bytes)"
    sign = "+" if c.action is Action.ADDED else "-"
    dtype = c.after or c.before
    text = f"{kind}: {sign}{_plural(c.count, 'parameter')} {c.subject}{_per_layer(c)} ({dtype}, {c.bytes:,} bytes)"
    if len(c.groups) > 1:
        text += f": {_paths([f'{p} ({n})' if n > 1 else p for p, n in c.groups])}"
    return text


def _program_size(c: Change, kind: str, where: str) -> str:
    """``program size: rematerialization removed: -95 instructions (-19.3%), 492 instructions -> 397 instructions``;
    where the kinds named before it took part of the program's change, what is left is said as such beside the
    program's whole change, so the two numbers never read as one (``+0 instructions, 1742 -> 1961``)."""
    before, after = _leading_int(c.before), _leading_int(c.after)
    ops = ", ".join(f"{op} {n:+d}" for op, n in c.groups[:5])
    if before is not None and after is not None and after - before != c.instructions:
        whole = after - before
        share = f", {whole / before:+.1%}" if before else ""
        text = (f"{kind}: {c.subject}: {c.instructions:+,} {_noun(c.instructions, 'instruction')} besides the changes "
                f"named above; the program {c.before} -> {c.after} ({whole:+,}{share})")
    else:
        share = f" ({c.instructions / before:+.1%})" if before else ""
        text = (f"{kind}: {c.subject}: {c.instructions:+,} {_noun(c.instructions, 'instruction')}{share}, "
                f"{c.before} -> {c.after}")
    if c.layers > 1:
        text += f" ({c.instructions / c.layers:+,.0f} per layer, {c.layers} layers)"
    text += f"; {ops}" if ops else ""
    return f"{text}; {where}".rstrip("; ")


def _leading_int(text: str) -> int | None:
    """``492`` of ``492 instructions``; None where the text does not start with a number."""
    first = text.split()[0] if text.split() else ""
    return int(first) if first.isdigit() else None


def _ops(c: Change) -> str:
    return ", ".join(f"{op} {n:+d}" for op, n in c.groups[:5])


def _gradient(c: Change, kind: str, where: str) -> str:
    lost = c.action is Action.REMOVED
    text = (f"{kind}: reach {'lost' if lost else 'gained'}: {_plural(c.count, 'weight')} "
            f"{'no longer' if lost else 'now'} updated from the loss (their updates "
            f"{'no longer depend' if lost else 'depend'} on the batch; {c.after} of {c.before} now): "
            f"{_common(c.place.paths)}")
    if c.instructions or c.groups:
        text += f"; {c.instructions:+,} {_noun(c.instructions, 'instruction')}" + (f" ({_ops(c)})" if c.groups else "")
    return text


def _common(paths: Sequence[str]) -> str:
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
        return _paths([f"{key}.* ({n})" if n > 1 else key for key, n in _under(parts, head).items()])
    return _paths(list(paths))


def _under(parts: Sequence[Sequence[str]], head: int) -> dict[str, int]:
    """Paths counted by their first ``head + 1`` parts (with the part after, where that is a layer's index), the
    largest group first."""
    groups: Counter = Counter()
    for p in parts:
        depth = head + 2 if len(p) > head + 2 and p[head + 1].isdigit() else head + 1
        groups[".".join(p[:depth]) if len(p) > depth else ".".join(p)] += 1
    return dict(sorted(groups.items(), key=lambda kv: (-kv[1], kv[0])))


def _transform(c: Change, kind: str, where: str) -> str:
    verb = {Action.ADDED: "added", Action.REMOVED: "removed", Action.CHANGED: "changed"}[c.action]
    text = f"{kind}: {c.subject} {verb} ({c.before}): {c.instructions:+,} {_noun(c.instructions, 'instruction')}"
    return f"{text}; {_ops(c)}" if c.groups else text


def _loops(c: Change, kind: str, where: str) -> str:
    if c.subject == TRIP_COUNT:
        text = f"{kind}: trip count {c.before} -> {c.after}"
    elif c.subject == UNROLLED:
        loops = "a loop" if c.count == 1 else f"{c.count} loops"
        text = f"{kind}: {loops} of {c.before} unrolled ({c.per_step} copies of the body inline)"
    elif c.subject == ROLLED:
        layers = f"{c.layers} layers" if c.layers else "inline code"
        loops = "a loop" if c.count == 1 else f"{c.count} loops"
        text = f"{kind}: {layers} rolled into {loops} of {c.before}"
    else:
        verb = "added" if c.action is Action.ADDED else "removed"
        text = f"{kind}: a loop {verb}: {c.before}"
    if c.subject != TRIP_COUNT and c.instructions:
        text += f"; {c.instructions:+,} {_noun(c.instructions, 'instruction')}" + (f" ({_ops(c)})" if c.groups else "")
    return f"{text}; {where}".rstrip("; ")


def _conditional(c: Change, kind: str, where: str) -> str:
    """``conditional: a conditional removed (2 branches: 271 and 27 instructions), both branches computed, 26 values
    selected; -41 instructions; at train.py:125``."""
    verb = "added" if c.action is Action.ADDED else "removed"
    text = f"{kind}: a conditional {verb} ({c.before}, {_plural(c.per_step, 'run')} per step)"
    text += f", {'replaced by ' if c.action is Action.REMOVED else 'replacing '}{c.after}" if c.after else ""
    return f"{text}; {c.instructions:+,} instructions; {where}".rstrip("; ")


def _loss_scaling(c: Change, kind: str, where: str) -> str:
    """``loss scaling: removed (loss x1024, 9 values /1024; 3 constants x1024 folded); -18 instructions``."""
    verb = "added" if c.action is Action.ADDED else "removed"
    folded = f"; {c.after}" if c.after else ""
    return f"{kind}: {verb} ({c.before}{folded}); {c.instructions:+,} instructions; {where}".rstrip("; ")


def _loss_term(c: Change, kind: str, where: str) -> str:
    """``loss: a term removed (6 reductions, x0.01; 22 instructions of its backward pass); -33 instructions; reading
    state.0.layers_*.router``."""
    verb = "added" if c.action is Action.ADDED else "removed"
    return f"{kind}: a term {verb} ({c.before}; {c.after}); {c.instructions:+,} instructions; {where}".rstrip("; ")


def _routing(c: Change, kind: str, where: str) -> str:
    """``routing: argmax x2 -> top_k (k=2) x2, 8 runs per step; -12 instructions; at moe.py:89``."""
    before, after = c.before or "none", c.after or "none"
    text = f"{kind}: {before} -> {after}, {_plural(c.per_step, 'run')} per step"
    return f"{text}; {c.instructions:+,} {_noun(c.instructions, 'instruction')}; {where}".rstrip("; ")


def _remat(c: Change, kind: str, where: str) -> str:
    if c.subject == REMAT_POLICY:
        text = (f"{kind}: policy changed at {_plural(c.count, 'checkpoint')}{_per_layer(c)}: {c.before} -> "
                f"{c.after}; the backward pass recomputes {_ops(c)}")
    else:
        verb = "added" if c.action is Action.ADDED else "removed"
        text = f"{kind}: rematerialization {verb} at {_plural(c.count, 'checkpoint')}{_per_layer(c)}: " \
               f"{c.instructions:+,} {_noun(c.instructions, 'instruction')}" + (f" ({_ops(c)})" if c.groups else "")
        text += f"; {c.after}" if c.after else ""
    return f"{text}; {where}".rstrip("; ")


def _rng_keys(c: Change, kind: str, where: str) -> str:
    """``rng keys: a literal key drawn from at model.py:12 (…): every call draws the same bits (no entry parameter
    upstream; literal keys 0 -> 1)``; a key drawn from twice with its draws; fewer, in numbers."""
    if c.action is Action.REMOVED:
        return f"{kind}: {_plural(c.count, c.subject, c.subject.replace('key', 'keys', 1))} fewer ({c.before} -> " \
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


def _collectives(c: Change, kind: str, where: str) -> str:
    verb = {Action.ADDED: "added", Action.REMOVED: "removed", Action.CHANGED: "changed"}[c.action]
    text = f"{kind}: {c.subject} {verb} x{c.count}{_per_layer(c)}"
    if c.action is Action.CHANGED:
        text += f": {c.before} now {c.after}"
    text += f", {_plural(c.per_step, 'run')} per step moving {c.bytes:,} bytes"
    return f"{text}; {where or 'in ' + (c.place.computation or 'main')}"


def _sharding(c: Change, kind: str, where: str) -> str:
    if c.subject == "sharding constraint" and c.action is not Action.CHANGED:
        verb = "added" if c.action is Action.ADDED else "removed"
        return f"{kind}: {_plural(c.count, c.subject)} {verb} ({c.after or c.before}); {where}".rstrip("; ")
    what = c.subject.removesuffix(" (per-device shape)")
    text = f"{kind}: {_plural(c.count, what.removesuffix('s'), what) if what.endswith('s') else c.count} "
    if c.subject.endswith("(per-device shape)"):
        text += (f"per-device shape {c.before} -> {c.after} where their collectives changed (sharded otherwise "
                 "across the devices)")
    else:
        text += f"{c.before} -> {c.after}"
    if c.groups:
        return f"{text}: {_paths([f'{p} ({n})' if n > 1 else p for p, n in c.groups])}"
    return f"{text}; {where}".rstrip("; ")


def _shapes(c: Change, kind: str, where: str) -> str:
    if c.subject == "inputs":
        text = f"{kind}: {_plural(c.count, 'input')} {', '.join(f for f, _ in c.groups)} ({c.before} -> {c.after}"
        return f"{text}, {c.bytes:+,} bytes): {_paths(c.place.paths)}"
    factors = ", ".join(f"{f} on {n:,}" for f, n in c.groups)
    device = " per device (their shape or their sharding)" if c.subject.endswith("(per device)") else ""
    return f"{kind}: {_plural(c.count, 'value')}{_per_layer(c)} reshaped{device}, {factors} (most: {c.before} -> " \
           f"{c.after}); {where}".rstrip("; ")


def _op_mix(c: Change, kind: str, where: str) -> str:
    mix = ", ".join(f"{op} {n:+d}" if " -> " not in op and "(" not in op else f"{op} x{n}" for op, n in c.groups[:6])
    more = f" and {len(c.groups) - 6} more" if len(c.groups) > 6 else ""
    work = f", {c.flops:+,} FLOPs per step" if c.flops else ""
    return f"{kind}: {_plural(c.count, 'instruction')}{_per_layer(c)} at equal shapes: {mix}{more}, " \
           f"{_plural(c.per_step, 'run')} per step{work}; {where or 'in ' + (c.place.computation or 'main')}"


def _constants(c: Change, kind: str, where: str) -> str:
    """``constants: f32[] literal 0.001 -> 0.002 at train.py:12 (jit(step)/mul)``: both values, the type, the place."""
    what = f"{c.subject} literal" if c.count == 1 else f"{c.count:,} {c.subject} literals{_per_layer(c)}"
    return f"{kind}: {what} {c.before} -> {c.after} {where or 'in ' + (c.place.computation or 'main')}"


# The kinds whose sentence is longest, each its own function (the rest are a line or two in change_line).
_WORDED = {ChangeKind.DONATION: _donation, ChangeKind.PRECISION: _precision, ChangeKind.PARAMETERS: _parameters,
           ChangeKind.PROGRAM_SIZE: _program_size, ChangeKind.GRADIENT: _gradient,
           ChangeKind.TRANSFORM: _transform, ChangeKind.LOOPS: _loops, ChangeKind.REMAT: _remat,
           ChangeKind.CONDITIONAL: _conditional, ChangeKind.LOSS_SCALING: _loss_scaling,
           ChangeKind.LOSS_TERM: _loss_term, ChangeKind.ROUTING: _routing,
           ChangeKind.COLLECTIVES: _collectives, ChangeKind.RNG_KEYS: _rng_keys, ChangeKind.SHARDING: _sharding,
           ChangeKind.SHAPES: _shapes,
           ChangeKind.OPS: _op_mix, ChangeKind.CONSTANTS: _constants}


def named_lines(changes: Sequence[Change], shown: int = SHOWN) -> list[str]:
    """The first ``shown`` changes' lines, then one line for the rest."""
    lines = [change_line(c) for c in changes[:shown]]
    rest = changes[shown:]
    if rest:
        instructions = sum(abs(c.instructions) or c.count for c in rest)
        lines.append(f"... {len(rest)} more changes ({_plural(instructions, 'instruction')}): --format json lists "
                     "every one, --text shows the text")
    return lines


def match_line(m: MatchSummary) -> str:
    """The matched remainder in one line: ``1,234 of 1,240 instructions unchanged; 4 changed, 6 inserted, 2
    deleted; 24 of 24 computations matched``."""
    old, new = m.instructions
    text = f"{m.unchanged:,} of {_plural(old, 'instruction')} unchanged"
    text += f" ({new:,} now)" if new != old else ""
    edits = [f"{n:,} {word}" for n, word in ((m.changed, "changed"), (m.inserted, "inserted"), (m.deleted, "deleted"))
             if n]
    if edits:
        text += "; " + ", ".join(edits)
    comps_old, comps_new = m.computations
    matched = comps_old - m.computations_deleted
    text += f"; {matched} of {_plural(comps_old, 'computation')} matched"
    extra = [f"{m.computations_inserted} added" if m.computations_inserted else "",
             f"{m.computations_deleted} removed" if m.computations_deleted else ""]
    extra = [e for e in extra if e]
    return text + (f" ({', '.join(extra)})" if extra else "")
