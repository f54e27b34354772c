"""The kinds of change, found: ``explain`` sorts a structural match's edits into ``Change`` records, one detector a
kind (changes.py's module doc lists them and what each carries)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace

from hlo_audit.hlo import change_flow, change_terms
from hlo_audit.hlo.change_places import Groups, Sides, layer_count, layer_of
from hlo_audit.hlo.change_precision import precision
from hlo_audit.hlo.change_structure import collectives, ops, rewrite_story, shapes, shardings
from hlo_audit.hlo.changes import MESH, NO_SPLIT_CHANGE, RANDOM_BITS, REWIRED, Action, Change, ChangeKind, Place
from hlo_audit.hlo.effects import host_transfer_name, is_host_transfer
from hlo_audit.hlo.header import donated_parameters, position_entries
from hlo_audit.hlo.kernels import is_kernel_call, kernel_name
from hlo_audit.hlo.literals import literal_change
from hlo_audit.hlo.locations import Places
from hlo_audit.hlo.match import Edit, InstructionEdit, ModuleMatch, ParamPair
from hlo_audit.hlo.mesh import DeclaredSizes, without_meshes
from hlo_audit.hlo.normalize import header_attr_says_nothing
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.text import HloModule, Instruction, strip_number_suffix


def explain(match: ModuleMatch, old_params: Sequence[EntryParam], new_params: Sequence[EntryParam],
            old_header: dict[str, str], new_header: dict[str, str], new_places: Places | None = None,
            old_places: Places | None = None, mesh_sizes: DeclaredSizes = (None, None)) -> list[Change]:
    """The named changes of a match, most costly kinds first (module doc). ``*_params``: each module's entry
    parameters, RNG state included (donation is judged on them); ``*_header``: each module's header attributes
    before RNG state was stripped from it; ``new_places``: the new module's op_name and source by instruction, where
    its text is printed without metadata (``hlo.locations.canonical_places``); ``old_places``: the old module's, where
    its own text said them (a golden's canonical text says none: a removed instruction is placed near the kept code
    next to it); ``mesh_sizes``: the sizes each side's config gave its target mesh (``hlo.mesh``)."""
    sides = Sides(match, old_params, new_params, new_places, old_places)
    claimed: set[int] = set()  # id() of the edits a kind has named
    changes: list[Change] = []
    changes += _donation(match.params, old_params, new_params, old_header, new_header)
    changes += _host_transfers(match.edits, sides, claimed)
    changes += precision(match.edits, sides, claimed)
    changes += _kernels(match.edits, sides, claimed)
    changes += collectives(match.edits, sides, claimed)
    changes += shardings(match, sides, claimed, mesh_sizes)
    changes += change_flow.transforms(match, sides, claimed)
    changes += change_flow.gradient(match, sides, claimed)
    changes += change_flow.loops(match, sides, claimed)
    changes += change_flow.remat(match, sides, claimed)
    changes += change_terms.conditionals(match, sides, claimed)
    changes += change_terms.loss_scaling(match, sides, claimed)
    changes += change_terms.loss_terms(match, sides, claimed)
    changes += change_terms.routing(match, sides, claimed)
    changes += shapes(match, sides, claimed, changes)
    changes += _renames(match.params)
    changes += _parameters(match.params)
    changes += _constants(match.edits, sides, claimed, changes)
    changes += ops(match, sides, claimed, changes)
    changes += _program_size(match, sides, claimed)
    # The stripped headers (RNG state's entries gone), and what stripping removed whole (a mesh declaration only
    # RNG keys used) as the module had it.
    changes += _header({**old_header, **match.old.header_attrs}, {**new_header, **match.new.header_attrs},
                       match.old, match.new, donation_changed=any(c.kind is ChangeKind.DONATION for c in changes),
                       mesh_named=any(c.kind is ChangeKind.SHARDING and c.subject in (MESH, NO_SPLIT_CHANGE)
                                      for c in changes))
    changes += _instructions(match.edits, sides, claimed)
    return changes


def _grouped_patterns(params: Iterable[EntryParam]) -> tuple[tuple[str, int], ...]:
    counts = Counter(p.pattern for p in params)
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _donation(pairs: Sequence[ParamPair], old_params: Sequence[EntryParam], new_params: Sequence[EntryParam],
              old_header: dict[str, str], new_header: dict[str, str]) -> list[Change]:
    """Parameters of both modules (RNG state aside) donated in one and not the other."""
    old_donated, new_donated = donated_parameters(old_header), donated_parameters(new_header)
    lost, gained = [], []
    for pair in pairs:
        if pair.old is None or pair.new is None:
            continue
        if pair.old.index in old_donated and pair.new.index not in new_donated:
            lost.append((pair.new, old_donated[pair.old.index]))
        elif pair.new.index in new_donated and pair.old.index not in old_donated:
            gained.append((pair.new, new_donated[pair.new.index]))
    changes = []
    for action, found in ((Action.REMOVED, lost), (Action.ADDED, gained)):
        if not found:
            continue
        params = [p for p, _ in found]
        roles = _role_counts(params)
        changes.append(Change(
            ChangeKind.DONATION, action, " / ".join(sorted({a for _, a in found})),
            Place("main", "", "", tuple(p for p, _ in _grouped_patterns(params))), count=len(params),
            bytes=sum(p.bytes for p in params), groups=_grouped_patterns(params),
            before=roles if action is Action.REMOVED else "", after=roles if action is Action.ADDED else ""))
    return changes


def _role_counts(params: Iterable[EntryParam]) -> str:
    counts = Counter(p.role for p in params)
    return ", ".join(f"{n} {role}" for role, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _host_transfers(edits: Sequence[InstructionEdit], sides: Sides, claimed: set[int]) -> list[Change]:
    groups = Groups()
    transfers: list[InstructionEdit] = []
    for e in edits:
        if e.edit is Edit.CHANGED:
            was, now = is_host_transfer(e.old), is_host_transfer(e.new)
            if was == now:
                continue
            action, instr = (Action.ADDED, e.new) if now else (Action.REMOVED, e.old)
        else:
            instr = e.instruction
            if not is_host_transfer(instr):
                continue
            action = Action.ADDED if e.edit is Edit.INSERTED else Action.REMOVED
        claimed.add(id(e))
        if e.edit is not Edit.CHANGED:
            transfers.append(e)
        place = sides.place(e)
        groups.add((action, host_transfer_name(instr), place.op_name, place.source), place, sides.runs(e),
                   sides.layers(e))
    for edit in (Edit.INSERTED, Edit.DELETED):
        claimed.update(id(f) for f in _feeding_only([e for e in transfers if e.edit is edit], edits, sides, claimed))
    return [Change(ChangeKind.HOST_TRANSFER, action, name, place, count=g["count"], per_step=g["runs"],
                   layers=layer_count(g["layers"]))
            for (action, name, _, _), g, place in groups.items()]


def _feeding_only(starts: Sequence[InstructionEdit], edits: Sequence[InstructionEdit], sides: Sides,
                  claimed: set[int]) -> list[InstructionEdit]:
    """The edits of the starts' side (inserted with them, or deleted with them) that compute values only they read,
    at any depth: what ``jax.debug.print`` computes to print (``h.sum()``, sliced per example under vmap) came and
    goes with its callbacks, not as ops beside them."""
    if not starts:
        return []
    view = sides.new if starts[0].edit is Edit.INSERTED else sides.old
    alone = {id(f.instruction): f for f in edits if f.edit is starts[0].edit and id(f) not in claimed}
    taken = {id(e.instruction) for e in starts}
    found: list[InstructionEdit] = []
    frontier = [(e.instruction, e.computation) for e in starts]
    while frontier:
        instr, computation = frontier.pop()
        for o in view.operands(instr, computation):
            if id(o) in alone and id(o) not in taken and all(id(u) in taken for u in view.users(o)):
                taken.add(id(o))
                found.append(alone[id(o)])
                frontier.append((o, alone[id(o)].computation))
    return found


def _kernels(edits: Sequence[InstructionEdit], sides: Sides, claimed: set[int]) -> list[Change]:
    groups = Groups()
    for e in edits:
        if id(e) in claimed:
            continue
        if e.edit is Edit.CHANGED:
            if not is_kernel_call(e.new) or "kernel" not in e.aspects:
                continue
            action = Action.CHANGED
        elif is_kernel_call(e.instruction):
            action = Action.ADDED if e.edit is Edit.INSERTED else Action.REMOVED
        else:
            continue
        claimed.add(id(e))
        instr = e.instruction
        place = sides.place(e)
        groups.add((action, kernel_name(instr), instr.custom_call_target, place.source), place, sides.runs(e),
                   sides.layers(e))
    return [Change(ChangeKind.KERNEL, action, name if name == target else f"{name} ({target})", place,
                   count=g["count"], per_step=g["runs"], layers=layer_count(g["layers"]))
            for (action, name, target, _), g, place in groups.items()]


# Aspects of a paired constant that its value changing explains: the literal, the digest of an elided one.
_LITERAL = frozenset({"literal", "frontend_attributes", "dtype"})


def _constants(edits: Sequence[InstructionEdit], sides: Sides, claimed: set[int], found: Sequence[Change]
               ) -> list[Change]:
    """Constants paired whose value changed, both values with their type and place (literals.py), repeats of one
    change folded. None where a loop, remat or sharding story is the change: its rewrite moves constants too."""
    if rewrite_story(found):
        return []
    groups = Groups()
    users: dict[str, dict[str, list[Instruction]]] = {}
    for e in edits:
        if id(e) in claimed or e.edit is not Edit.CHANGED or not set(e.aspects) <= _LITERAL or \
                e.old.opcode != "constant" or e.new.opcode != "constant":
            continue
        values = literal_change(e.old, e.new)
        if values is None:
            continue
        claimed.add(id(e))
        place = _used_at(e, sides, users)
        groups.add((values.shape, values.before, values.after, place.computation, place.op_name, place.source),
                   place, sides.runs(e), sides.layers(e))
    return [Change(ChangeKind.CONSTANTS, Action.CHANGED, shape, place, count=g["count"], per_step=g["runs"],
                   before=before, after=after, layers=len(g["layers"]))
            for (shape, before, after, *_), g, place in groups.items()]


def _used_at(e: InstructionEdit, sides: Sides, users: dict[str, dict[str, list[Instruction]]]) -> Place:
    """A changed constant's place: its own metadata's, else where it is used. jax writes a constant without any (a
    learning rate's ``constant(-0.001)``): its op_name and source line are those of the first users, a few steps
    down (a broadcast, then the multiply by it), that have them. Users are indexed per computation asked."""
    place = sides.place(e)
    if (place.op_name or place.source) and not place.near:
        return place
    comp = sides.new.module.computations[e.new_computation]
    by_operand = users.get(comp.name)
    if by_operand is None:
        by_operand = users[comp.name] = defaultdict(list)
        for instr in comp.instructions:
            for ref in instr.operands:
                by_operand[ref].append(instr)
    frontier = [e.new.name]
    for _ in range(_USE_DEPTH):
        frontier = [u for name in frontier for u in by_operand.get(name, ())]
        for user in frontier:
            said, chain, _ = sides.new.said(user, comp.name)
            if said or chain:  # its own metadata's, not one borrowed from further on
                op_name, source = sides.new.origin(user, comp.name)
                return replace(place, op_name=op_name, source=source, near=False)
        frontier = [u.name for u in frontier]
    return place


_USE_DEPTH = 3  # steps from a constant to the user that places it (broadcast, reshape, then the op)


def _renames(pairs: Sequence[ParamPair]) -> list[Change]:
    """Renamed parameters by what was renamed: the path components that differ (``up`` -> ``up_proj``, whether
    under the weights or the optimizer's moments), each with the parameter patterns it renames."""
    groups: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for pair in pairs:
        if pair.renamed and not pair.old.is_rng and not pair.new.is_rng:
            before, after = pair.old.folded_path, pair.new.folded_path
            groups[_renamed_part(before, after)][f"{before} -> {after}"] += 1
    return [Change(ChangeKind.RENAME, Action.CHANGED, f"{old} -> {new}",
                   Place("main", "", "", tuple(sorted(p.split(" -> ")[1] for p in patterns))),
                   count=sum(patterns.values()), before=old, after=new,
                   groups=tuple(sorted(patterns.items(), key=lambda kv: (-kv[1], kv[0]))))
            for (old, new), patterns in sorted(groups.items())]


def _renamed_part(before: str, after: str) -> tuple[str, str]:
    """What a rename changed: the components between the common prefix and suffix of two dotted paths."""
    a, b = before.split("."), after.split(".")
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    return ".".join(a[head:len(a) - tail]) or before, ".".join(b[head:len(b) - tail]) or after


def _parameters(pairs: Sequence[ParamPair]) -> list[Change]:
    """Parameters (RNG state aside) added or removed, by what they are in the model (``blocks.*.up.bias``, whether
    the weight or an optimizer's moment of it, each pattern in ``groups``); those of another dtype or shape."""
    changes = []
    for action, side, other in ((Action.ADDED, "new", "old"), (Action.REMOVED, "old", "new")):
        alone = [getattr(p, side) for p in pairs if getattr(p, other) is None and not getattr(p, side).is_rng]
        by_leaf: dict[tuple, list[EntryParam]] = defaultdict(list)
        for p in alone:
            by_leaf[(_leaf(p), p.dtype)].append(p)
        for (leaf, dtype), params in sorted(by_leaf.items()):
            changes.append(Change(ChangeKind.PARAMETERS, action, leaf, Place("main", "", "", (leaf,)),
                                  count=len(params), bytes=sum(p.bytes for p in params),
                                  before=dtype if action is Action.REMOVED else "",
                                  after=dtype if action is Action.ADDED else "", groups=_grouped_patterns(params),
                                  layers=layer_count({layer_of(p) for p in params if p.layer_prefix})))
    reshaped: dict[tuple, list[ParamPair]] = defaultdict(list)
    for pair in pairs:
        if pair.reshaped and not pair.new.is_rng:
            reshaped[(_leaf(pair.new), pair.old.shape.text, pair.new.shape.text)].append(pair)
    for (leaf, before, after), found in sorted(reshaped.items()):
        changes.append(Change(ChangeKind.PARAMETERS, Action.CHANGED, leaf, Place("main", "", "", (leaf,)),
                              count=len(found), before=before, after=after,
                              bytes=sum(p.new.bytes - p.old.bytes for p in found),
                              groups=_grouped_patterns(p.new for p in found)))
    return changes


def _leaf(p: EntryParam) -> str:
    """What a parameter is in the model, wherever the state holds it: its folded path from the innermost layer
    container on (``blocks.*.up.bias`` for the weight and for each optimizer moment of it), else its last two
    components."""
    folded = p.folded_path.split(".")
    if p.layer_prefix:
        depth = p.layer_prefix.count(".") + 1
        return ".".join(folded[depth - 2 if folded[depth - 1] == "*" else depth - 1:])
    return ".".join(folded[-2:])


# Aspects of a paired instruction that only say it now reads other values: rewired to inserted or deleted code.
_REWIRED = frozenset({"operands"})


def _program_size(match: ModuleMatch, sides: Sides, claimed: set[int]) -> list[Change]:
    """What the named kinds left of inserted and deleted instructions, in one record (module doc); with it the
    instructions whose only change is to read from them (rewired). Its ``instructions`` are the program's own
    difference (``before`` -> ``after``), whatever the other kinds named of it: one line never says "+0
    instructions, 1742 -> 1961"."""
    rest = [e for e in match.edits if id(e) not in claimed and e.edit is not Edit.CHANGED]
    computations = (len(match.computations_inserted), len(match.computations_deleted))
    if not rest:  # a computation added or removed has its instructions among the edits: a kind claimed them
        return []
    alone = {id(e.instruction) for e in rest}
    rewired = [e for e in match.edits if e.edit is Edit.CHANGED and id(e) not in claimed and
               set(e.aspects) <= _REWIRED and _reads_any(e, sides, alone)]
    by_opcode: Counter = Counter()
    per_step = 0
    for e in rest:
        sign = 1 if e.edit is Edit.INSERTED else -1
        by_opcode[e.instruction.opcode] += sign
        per_step += sign * sides.runs(e)
    claimed.update(id(e) for e in (*rest, *rewired))
    added = sum(1 for e in rest if e.edit is Edit.INSERTED)
    removed = len(rest) - added
    before, after = match.instructions
    story, place, count, layers = _size_story(rest, sides, by_opcode)
    groups = tuple(sorted(((op, n) for op, n in by_opcode.items() if n), key=lambda kv: (-abs(kv[1]), kv[0])))
    groups += (("rewired", len(rewired)),) if rewired else ()
    groups += (("computations added", computations[0]),) if computations[0] else ()
    groups += (("computations removed", computations[1]),) if computations[1] else ()
    action = Action.ADDED if added > removed else Action.REMOVED if removed > added else Action.CHANGED
    return [Change(ChangeKind.PROGRAM_SIZE, action, story, place, count=count, per_step=per_step,
                   before=f"{before} instructions", after=f"{after} instructions", instructions=after - before,
                   groups=groups, layers=layers)]


def _reads_any(e: InstructionEdit, sides: Sides, instructions: set[int]) -> bool:
    return any(id(o) in instructions for o in sides.new.operands(e.new, e.new_computation)) or \
        any(id(o) in instructions for o in sides.old.operands(e.old, e.old_computation))


# What carries values between computations and does no work of its own (a loop's state, a call's arguments).
_PLUMBING = frozenset({"get-tuple-element", "tuple", "call", "parameter", "while", "copy", "bitcast",
                       "opt-barrier", "optimization-barrier"})


def _size_story(rest: Sequence[InstructionEdit], sides: Sides, by_opcode: Counter) -> tuple[str, Place, int, int]:
    """What the inserted and deleted instructions are, in a few words, with the place most of them share, how many
    times the story repeats and the layers it spans: copies of one subgraph; else instructions (loops and
    rematerialization are their own kinds: change_flow.py)."""
    inserted = [e for e in rest if e.edit is Edit.INSERTED]
    deleted = [e for e in rest if e.edit is Edit.DELETED]
    side = inserted if len(inserted) >= len(deleted) else deleted
    if not side:
        return "instructions", Place(), 0, 0
    random = [e for e in side if sides.in_random_bits(e)]
    if len(random) * 2 >= len(side):  # dropout turned off (or on): the draws' random bits went (or came)
        return RANDOM_BITS, sides.place(random[0]), len(random), 0
    keyed = [(e, (e.instruction.opcode, *sides.origin(e))) for e in side]
    # A pull request's changed line the instructions pass through is their place before the line most share.
    changed = sides.new.changed_lines
    copies = Counter(key for _, key in keyed)
    repeats = Counter(copies.values())
    times, kinds = max(repeats.items(), key=lambda kv: (kv[0] * kv[1], kv[0]))
    if times > 1 and times * kinds * 2 >= len(side) and any(key[1] or key[2] for key in copies):
        sample = next((e for e, key in keyed if copies[key] == times and key[2] in changed),
                      next(e for e, key in keyed if copies[key] == times))
        return (f"{times} copies of the same {kinds}-instruction subgraph", sides.place(sample), times,
                layer_count(sides.layers(sample)))
    # The work's lines, not the plumbing's: a scanned body's new ops come with the loop state's get-tuple-elements
    # and calls, which jax places at the scan call; the ops themselves are in the model's file.
    working = [(e, key) for e, key in keyed if key[0] not in _PLUMBING and key[2]] or keyed
    sources = Counter(key[2] for _, key in working)
    on_change = [source for source in sources if source in changed]
    source = max(on_change, key=sources.__getitem__) if on_change else sources.most_common(1)[0][0]
    sample = next(e for e, key in keyed if key[2] == source)
    return "instructions", sides.place(sample), len(side), layer_count(n for e in side for n in sides.layers(e))


def _header(old_header: dict[str, str], new_header: dict[str, str], old_module: HloModule,
            new_module: HloModule, donation_changed: bool, mesh_named: bool = False) -> list[Change]:
    """Header attributes that differ (RNG state's entries already gone from both), by name and entries; the module's
    name (the jitted function's) when it changed. ``mesh_named``: the sharding kind worded the mesh's change (Shardy's
    ``xla.sdy.meshes`` frontend attribute), which the header's ``frontend_attributes`` then differ by no more."""
    changes = []
    old_name, new_name = strip_number_suffix(old_module.name), strip_number_suffix(new_module.name)
    if old_name != new_name:
        changes.append(Change(ChangeKind.HEADER, Action.CHANGED, "name", Place("main"), before=old_name,
                              after=new_name))
    for key in sorted(old_header.keys() | new_header.keys()):
        before, after = old_header.get(key), new_header.get(key)
        if before is not None and header_attr_says_nothing(old_module, key, before):
            before = None
        if after is not None and header_attr_says_nothing(new_module, key, after):
            after = None
        if mesh_named and key == "frontend_attributes":
            before, after = (without_meshes(v) if v is not None else None for v in (before, after))
            before, after = (None if v == "{}" else v for v in (before, after))
        if before == after or key in ("input_output_alias", "buffer_donor") and donation_changed:
            continue
        action = Action.ADDED if before is None else Action.REMOVED if after is None else Action.CHANGED
        changes.append(Change(ChangeKind.HEADER, action, key, Place("main"), before=_entries(key, before),
                              after=_entries(key, after)))
    return changes


def _entries(key: str, value: str | None) -> str:
    if value is None:
        return "(none)"
    n = position_entries(key, value)
    if n is not None:
        return f"{n} entr{'y' if n == 1 else 'ies'}"
    return value if len(value) <= 60 else f"{len(value):,} characters"


# Ops that only carry values (a tuple, its elements, a barrier, a called computation's parameter): another shape or
# element index is the values they carry moving, not a change of their own.
_CARRIERS = frozenset({"tuple", "get-tuple-element", "opt-barrier", "parameter"})
_CARRIED = frozenset({"shape", "dims", "dtype", "layout", "index", "operands"})


def _rewired(e: InstructionEdit) -> bool:
    """A paired instruction that only reads other values: its operands, or (a carrier) what it carries."""
    aspects = set(e.aspects)
    return aspects <= _REWIRED or e.new.opcode == e.old.opcode in _CARRIERS and aspects <= _CARRIED


def _instructions(edits: Sequence[InstructionEdit], sides: Sides, claimed: set[int]) -> list[Change]:
    """The edits no kind named, grouped by what changed and where; the rewired ones (the same op reading other
    values) in one record: they follow a change named elsewhere."""
    groups = Groups()
    rewired = Groups()
    for e in edits:
        if id(e) in claimed:
            continue
        if e.edit is Edit.CHANGED and _rewired(e):
            place = sides.place(e)
            rewired.add((), place, sides.runs(e), sides.layers(e), **{e.new.opcode: 1})
            continue
        action = {Edit.INSERTED: Action.ADDED, Edit.DELETED: Action.REMOVED, Edit.CHANGED: Action.CHANGED}[e.edit]
        if e.edit is Edit.CHANGED:
            before, after = _form(e.old, e.aspects), _form(e.new, e.aspects)
            subject = e.old.opcode if e.old.opcode == e.new.opcode else f"{e.old.opcode} -> {e.new.opcode}"
            subject += f" ({', '.join(e.aspects)})"
        else:
            before = after = ""
            subject = e.instruction.opcode
        place = sides.place(e)
        groups.add((action, subject, before, after, place.computation, place.source), place, sides.runs(e),
                   sides.layers(e))
    sign = {Action.ADDED: 1, Action.REMOVED: -1, Action.CHANGED: 0}
    changes = [Change(ChangeKind.INSTRUCTIONS, action, subject, place, count=g["count"], per_step=g["runs"],
                      before=before, after=after, instructions=sign[action] * g["count"],
                      layers=layer_count(g["layers"]))
               for (action, subject, before, after, _, _), g, place in groups.items()]
    changes.sort(key=lambda c: (-c.count, c.subject))
    for _, g, place in rewired.items():
        by_opcode = tuple(sorted(g["sums"].items(), key=lambda kv: (-kv[1], kv[0])))
        changes.append(Change(ChangeKind.INSTRUCTIONS, Action.CHANGED, REWIRED, place, count=g["count"],
                              per_step=g["runs"], groups=by_opcode, layers=layer_count(g["layers"])))
    return changes


def _form(instr: Instruction, aspects: Sequence[str]) -> str:
    """The parts of an instruction that changed, as short text."""
    parts = []
    if "opcode" in aspects:
        parts.append(instr.opcode)
    if {"dtype", "dims", "layout", "shape"} & set(aspects):
        parts.append(_short(instr.shape.text))
    for aspect in aspects:
        if aspect in instr.attrs:
            parts.append(f"{aspect}={_short(instr.attrs[aspect])}")
    if "literal" in aspects:
        parts.append(_short(instr.literal, 40))
    return "; ".join(parts)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
