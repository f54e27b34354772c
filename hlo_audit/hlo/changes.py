"""Every difference between two modules, named: what kind of change it is, where, and what it costs.

``explain`` reads a structural match (match.py) and sorts its edits into the kinds of change users pay for, each
a typed record (``Change``) the report prints and the gate's rules read:

* ``donation``: entry parameters that stop (or start) being donated (``input_output_alias``, ``buffer_donor``;
  what ``donate_argnums`` becomes), with their bytes: each is a buffer the step now keeps besides its output;
* ``host_transfer``: host callbacks (``jax.debug.print``, ``pure_callback``, ``io_callback``), infeed / outfeed,
  send / recv to the host, added or removed, each with how often a step runs it (effects.py);
* ``precision``: dots and convolutions whose operand or result types or ``precision_config`` changed, with the
  converts added or removed beside them and the FLOPs that moved (from the module's own shapes);
* ``kernel``: Pallas / Mosaic / Triton kernels whose content changed (kernels.py: locations and install paths do
  not count), added or removed;
* ``rename``: entry parameters that are the same but for their state path;
* ``parameters``: entry parameters (RNG state aside) added, removed, or of another dtype or shape;
* ``program_size``: what is left, in instructions: inserted and deleted by opcode, computations added or removed,
  rematerialization removed (``opt-barrier`` and its recomputation gone), a subgraph repeated (a loop unrolled);
* ``header``: other module attributes, summarized (which attribute, how many entries), never printed whole;
* ``instructions``: the remaining edits, grouped (an opcode changed, a layout, a sharding, an attribute).

A change is placed (``Place``): the computation it sits in, jax's ``op_name`` and the source ``file:line`` from the
instruction's metadata, and the state paths whose values flow into it (through the ops that pass a value on:
converts, reshapes, slices of a scanned stack, loop state, called computations' parameters), with layer indices
folded as parameters are grouped (``blocks.*``). Repeats of one change across layers are one record with a count.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePath

from hlo_audit.hlo.effects import host_transfer_name, is_host_transfer
from hlo_audit.hlo.header import donated_parameters, position_entries
from hlo_audit.hlo.kernels import is_kernel_call, kernel_name
from hlo_audit.hlo.match import Edit, InstructionEdit, ModuleMatch, ParamPair
from hlo_audit.hlo.normalize import computation_words, header_attr_says_nothing
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.rng_flow import PASS_THROUGH_CUSTOM_CALLS, trip_count
from hlo_audit.hlo.text import Computation, HloModule, Instruction, strip_number_suffix
from hlo_audit.hlo.thunks import ParameterReads


class ChangeKind(StrEnum):
    """The kinds of change, in the order a report lists them (module doc)."""

    DONATION = "donation"
    HOST_TRANSFER = "host_transfer"
    PRECISION = "precision"
    KERNEL = "kernel"
    RENAME = "rename"
    PARAMETERS = "parameters"
    PROGRAM_SIZE = "program_size"
    HEADER = "header"
    INSTRUCTIONS = "instructions"


class Action(StrEnum):
    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


@dataclass(frozen=True, slots=True)
class Place:
    """Where a change is: its computation (``main`` for the entry, else the name's words: ``region``,
    ``checkpoint``...), jax's ``op_name`` and the source ``file:line`` (from metadata, layer indices folded), the
    state paths whose values flow into it (layer indices folded)."""

    computation: str = ""
    op_name: str = ""
    source: str = ""
    paths: tuple[str, ...] = ()

    def to_record(self) -> dict:
        return {"computation": self.computation, "op_name": self.op_name, "source": self.source,
                "paths": list(self.paths)}


@dataclass(frozen=True, slots=True)
class Change:
    """One named change (module doc), repeats folded into ``count``.

    ``subject``: what changed (an opcode, a custom call's target, a header attribute, a parameter pattern);
    ``before`` / ``after``: its two forms where it changed (``bf16 x bf16 -> bf16``, a shape, ``26 entries``);
    ``per_step``: executions in one step, loops' trip counts multiplied (host transfers, precision, size);
    ``bytes``: the parameters' bytes (donation: no longer donated, a buffer kept besides the output; parameters:
    added or removed); ``flops``: FLOPs per step that moved to ``after`` (precision); ``instructions``: instructions
    added (negative: removed); ``groups``: (pattern, count) of the parameters or instructions it covers."""

    kind: ChangeKind
    action: Action
    subject: str
    place: Place = Place()
    count: int = 1
    per_step: int = 0
    before: str = ""
    after: str = ""
    bytes: int = 0
    flops: int = 0
    instructions: int = 0
    groups: tuple[tuple[str, int], ...] = ()

    def to_record(self) -> dict:
        return {"kind": self.kind.value, "action": self.action.value, "subject": self.subject,
                "place": self.place.to_record(), "count": self.count, "per_step": self.per_step,
                "before": self.before, "after": self.after, "bytes": self.bytes, "flops": self.flops,
                "instructions": self.instructions, "groups": [[k, n] for k, n in self.groups]}


@dataclass(frozen=True, slots=True)
class MatchSummary:
    """The match in numbers: what `diff` prints as its one line for everything that did not change."""

    instructions: tuple[int, int]
    matched: int
    unchanged: int
    changed: int
    inserted: int
    deleted: int
    computations: tuple[int, int]
    computations_inserted: int
    computations_deleted: int

    def to_record(self) -> dict:
        return {"instructions": list(self.instructions), "matched": self.matched, "unchanged": self.unchanged,
                "changed": self.changed, "inserted": self.inserted, "deleted": self.deleted,
                "computations": list(self.computations), "computations_inserted": self.computations_inserted,
                "computations_deleted": self.computations_deleted}


def summary(match: ModuleMatch) -> MatchSummary:
    counts = match.counts()
    return MatchSummary(instructions=match.instructions, matched=match.matched,
                        unchanged=match.matched - counts["changed"], changed=counts["changed"],
                        inserted=counts["inserted"], deleted=counts["deleted"],
                        computations=(len(match.old.computations), len(match.new.computations)),
                        computations_inserted=len(match.computations_inserted),
                        computations_deleted=len(match.computations_deleted))


# --------------------------------------------------------------------------------------------------------------
# Places
# --------------------------------------------------------------------------------------------------------------

_SOURCE_FILE = re.compile(r'source_file="((?:[^"\\]|\\.)*)"')
_SOURCE_LINE = re.compile(r"source_line=(\d+)")
_LAYER_INDEX = re.compile(r"\b((?:layers?|blocks?|h|cell)[_.])\d+\b")
# What passes a value on for attribution: the value a dot reads through these is still its weight.
_ATTRIBUTION_PASS_THROUGH = frozenset({
    "bitcast", "copy", "opt-barrier", "optimization-barrier", "add-dependency", "domain", "convert", "reshape",
    "transpose", "broadcast", "slice", "dynamic-slice", "reduce-precision", "bitcast-convert", "all-gather",
    "copy-start",
})


def _passes_value(instr: Instruction) -> bool:
    if instr.opcode == "custom-call":
        return instr.custom_call_target in PASS_THROUGH_CUSTOM_CALLS
    return instr.opcode in _ATTRIBUTION_PASS_THROUGH


def _source(instr: Instruction) -> str:
    metadata = instr.attrs.get("metadata", "")
    file, line = _SOURCE_FILE.search(metadata), _SOURCE_LINE.search(metadata)
    if not file:
        return ""
    name = PurePath(file.group(1).replace("\\\\", "/")).name
    return f"{name}:{line.group(1)}" if line else name


def _fold(text: str) -> str:
    return _LAYER_INDEX.sub(r"\1*", text)


class _Places:
    """Places of one module's instructions: the computation's words, metadata, the state paths read."""

    def __init__(self, module: HloModule, params: Sequence[EntryParam]):
        self.module = module
        self.paths = {p.index: p.folded_path for p in params}
        self.reads = ParameterReads(module, _passes_value)
        self.computation_of: dict[int, Computation] = {}
        for comp in module.computations.values():
            for instr in comp.instructions:
                self.computation_of[id(instr)] = comp
        self._executions: dict[str, int] | None = None

    def place(self, instr: Instruction, computation: str) -> Place:
        comp = self.module.computations[computation]
        reads: set[int] = set()
        for operand in instr.operands:
            reads |= self.reads.value(comp, operand, ())
        paths = tuple(sorted({self.paths[n] for n in reads if n in self.paths}))
        where = "main" if comp.is_entry else computation_words(comp.name)
        return Place(where, _fold(instr.op_name), _source(instr), paths)

    def executions(self, computation: str) -> int:
        if self._executions is None:
            self._executions = executions(self.module)
        return self._executions.get(computation, 1)


def executions(module: HloModule) -> dict[str, int]:
    """How many times one step runs each computation: the entry once, a loop's body its trip count times per run
    of its caller (once where the count is not known), its condition once more; any other callee once per call."""
    runs: dict[str, int] = {module.entry.name: 1}
    order = [module.entry]
    seen = {module.entry.name}
    while order:
        comp = order.pop(0)
        for instr in comp.instructions:
            for callee in instr.called_computations():
                target = module.computations.get(callee)
                if target is None:
                    continue
                times = runs[comp.name]
                if instr.opcode == "while":
                    condition = module.computations.get(instr.attrs.get("condition", "").strip().lstrip("%"))
                    trips = trip_count(comp, instr, condition) if condition is not None else None
                    times *= (trips or 1) + (callee == (condition.name if condition else None))
                runs[callee] = runs.get(callee, 0) + times
                if callee not in seen:
                    seen.add(callee)
                    order.append(target)
    return runs


# --------------------------------------------------------------------------------------------------------------
# The kinds
# --------------------------------------------------------------------------------------------------------------

def explain(match: ModuleMatch, old_params: Sequence[EntryParam], new_params: Sequence[EntryParam],
            old_header: dict[str, str], new_header: dict[str, str]) -> list[Change]:
    """The named changes of a match, most costly kinds first (module doc). ``*_params``: each module's entry
    parameters, RNG state included (donation is judged on them); ``*_header``: each module's header attributes
    before RNG state was stripped from it."""
    old_places = _Places(match.old, old_params)
    new_places = _Places(match.new, new_params)
    claimed: set[int] = set()  # id() of edits a kind has named
    changes: list[Change] = []
    changes += _donation(match.params, old_params, new_params, old_header, new_header)
    changes += _host_transfers(match.edits, old_places, new_places, claimed)
    changes += _precision(match, old_places, new_places, claimed)
    changes += _kernels(match.edits, old_places, new_places, claimed)
    changes += _renames(match.params)
    changes += _parameters(match.params)
    changes += _program_size(match, old_places, new_places, claimed)
    # The stripped headers (RNG state's entries gone), and what stripping removed whole (a mesh declaration only
    # RNG keys used) as the module had it.
    changes += _header({**old_header, **match.old.header_attrs}, {**new_header, **match.new.header_attrs},
                       match.old, match.new, donation_changed=any(c.kind is ChangeKind.DONATION for c in changes))
    changes += _instructions(match.edits, old_places, new_places, claimed)
    return changes


def _grouped_patterns(params: Iterable[EntryParam]) -> tuple[tuple[str, int], ...]:
    counts = Counter(p.pattern for p in params)
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _donation(pairs: Sequence[ParamPair], old_params: Sequence[EntryParam], new_params: Sequence[EntryParam],
              old_header: dict[str, str], new_header: dict[str, str]) -> list[Change]:
    """Parameters of both modules (RNG state aside) donated in one and not the other."""
    old_donated, new_donated = donated_parameters(old_header), donated_parameters(new_header)
    lost, gained = [], []
    old_by_index = {p.index: p for p in old_params}
    new_by_index = {p.index: p for p in new_params}
    for pair in pairs:
        if pair.old is None or pair.new is None:
            continue
        old, new = old_by_index.get(pair.old.index, pair.old), new_by_index.get(pair.new.index, pair.new)
        if old.index in old_donated and new.index not in new_donated:
            lost.append((new, old_donated[old.index]))
        elif new.index in new_donated and old.index not in old_donated:
            gained.append((new, new_donated[new.index]))
    changes = []
    for action, found in ((Action.REMOVED, lost), (Action.ADDED, gained)):
        if not found:
            continue
        params = [p for p, _ in found]
        attributes = sorted({a for _, a in found})
        changes.append(Change(
            ChangeKind.DONATION, action, " / ".join(attributes),
            Place("main", "", "", tuple(p for p, _ in _grouped_patterns(params))), count=len(params),
            bytes=sum(p.bytes for p in params), groups=_grouped_patterns(params),
            before=_role_counts(params) if action is Action.REMOVED else "",
            after=_role_counts(params) if action is Action.ADDED else ""))
    return changes


def _role_counts(params: Iterable[EntryParam]) -> str:
    counts = Counter(p.role for p in params)
    return ", ".join(f"{n} {role}" for role, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _edit_place(e: InstructionEdit, old_places: _Places, new_places: _Places) -> Place:
    if e.new is not None:
        return new_places.place(e.new, e.new_computation)
    return old_places.place(e.old, e.old_computation)


def _edit_runs(e: InstructionEdit, old_places: _Places, new_places: _Places) -> int:
    if e.new is not None:
        return new_places.executions(e.new_computation)
    return old_places.executions(e.old_computation)


def _host_transfers(edits: Sequence[InstructionEdit], old_places: _Places, new_places: _Places,
                    claimed: set[int]) -> list[Change]:
    groups: dict[tuple, list] = {}
    for e in edits:
        if e.edit is Edit.CHANGED:
            was, now = is_host_transfer(e.old), is_host_transfer(e.new)
            if was == now:
                continue
            action = Action.ADDED if now else Action.REMOVED
            instr = e.new if now else e.old
        else:
            instr = e.instruction
            if not is_host_transfer(instr):
                continue
            action = Action.ADDED if e.edit is Edit.INSERTED else Action.REMOVED
        claimed.add(id(e))
        place = _edit_place(e, old_places, new_places)
        key = (action, host_transfer_name(instr), place)
        entry = groups.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += _edit_runs(e, old_places, new_places)
    return [Change(ChangeKind.HOST_TRANSFER, action, name, place, count=n, per_step=runs)
            for (action, name, place), (n, runs) in groups.items()]


_KERNEL_LABELS = re.compile(r"_(\w+)->")  # convolution dim_labels: input_kernel->output
_PRECISION_OPS = frozenset({"dot", "convolution", "ragged-dot"})
_PRECISION_ATTRS = ("precision_config", "algorithm", "operand_precision", "preferred_element_type")


def _type_signature(instr: Instruction, places: _Places, computation: str) -> str:
    comp = places.module.computations[computation]
    operands = [comp.by_name.get(ref) for ref in instr.operands]
    types = " x ".join((o.shape.dtype or "tuple") if o is not None else "?" for o in operands[:2])
    text = f"{types} -> {instr.shape.dtype or 'tuple'}"
    extra = [f"{k}={instr.attrs[k]}" for k in _PRECISION_ATTRS if k in instr.attrs]
    return text + (f" ({', '.join(extra)})" if extra else "")


def flops(instr: Instruction, comp: Computation) -> int:
    """Multiply-adds x 2 of one dot or convolution, from its shapes: the result's elements times the contracted
    (a convolution: the kernel's window and input features per output feature)."""
    result = instr.shape.num_elements if not instr.shape.is_tuple else 0
    operands = [comp.by_name.get(ref) for ref in instr.operands]
    if len(operands) < 2 or operands[0] is None or operands[1] is None:
        return 0
    if instr.opcode in ("dot", "ragged-dot"):
        dims = [int(d) for d in re.findall(r"\d+", instr.attrs.get("lhs_contracting_dims", ""))]
        lhs = operands[0].shape.dims
        contracted = 1
        for d in dims:
            contracted *= lhs[d] if d < len(lhs) else 1
        return 2 * result * contracted
    kernel = operands[1].shape
    labels = _KERNEL_LABELS.search(instr.attrs.get("dim_labels", ""))
    output_feature = labels.group(1).find("o") if labels else -1
    if 0 <= output_feature < len(kernel.dims) and kernel.dims[output_feature]:
        # The kernel's input features are per feature group already: window x input features per output.
        return 2 * result * (kernel.num_elements // kernel.dims[output_feature])
    return 2 * result * kernel.num_elements


def _neighbour_converts(e_instr: Instruction, computation: str, places: _Places, converts: dict[int, object],
                        users: dict[int, list[Instruction]]) -> list[object]:
    """Edits of converts right before or after ``e_instr`` (through reshapes and transposes)."""
    comp = places.module.computations[computation]
    found = []
    frontier = [comp.by_name.get(ref) for ref in e_instr.operands]
    for _ in range(3):
        nxt = []
        for instr in frontier:
            if instr is None:
                continue
            if id(instr) in converts:
                found.append(converts[id(instr)])
            if instr.opcode in ("convert", "reshape", "transpose", "bitcast", "copy", "broadcast"):
                nxt += [comp.by_name.get(ref) for ref in instr.operands]
        frontier = nxt
    frontier = list(users.get(id(e_instr), ()))
    for _ in range(3):
        nxt = []
        for instr in frontier:
            if id(instr) in converts:
                found.append(converts[id(instr)])
            if instr.opcode in ("convert", "reshape", "transpose", "bitcast", "copy"):
                nxt += users.get(id(instr), ())
        frontier = nxt
    return found


def _users(module: HloModule) -> dict[int, list[Instruction]]:
    users: dict[int, list[Instruction]] = defaultdict(list)
    for comp in module.computations.values():
        for instr in comp.instructions:
            for ref in instr.operands:
                operand = comp.by_name.get(ref)
                if operand is not None:
                    users[id(operand)].append(instr)
    return users


def _precision(match: ModuleMatch, old_places: _Places, new_places: _Places, claimed: set[int]) -> list[Change]:
    """Dots and convolutions paired whose type signature changed, the converts beside them, the FLOPs moved."""
    candidates = [e for e in match.edits if e.edit is Edit.CHANGED and e.old.opcode in _PRECISION_OPS
                  and e.new.opcode == e.old.opcode]
    if not candidates:
        return []
    old_converts = {id(e.old): e for e in match.edits if e.edit is Edit.DELETED and e.old.opcode == "convert"}
    new_converts = {id(e.new): e for e in match.edits if e.edit is Edit.INSERTED and e.new.opcode == "convert"}
    old_users, new_users = _users(match.old), _users(match.new)
    groups: dict[tuple, list] = {}
    for e in candidates:
        before = _type_signature(e.old, old_places, e.old_computation)
        after = _type_signature(e.new, new_places, e.new_computation)
        if before == after:
            continue
        claimed.add(id(e))
        near = {id(c): c for c in _neighbour_converts(e.new, e.new_computation, new_places, new_converts, new_users)}
        near.update((id(c), c) for c in _neighbour_converts(e.old, e.old_computation, old_places, old_converts,
                                                           old_users))
        converts = 0
        for c in near.values():
            if id(c) not in claimed:
                claimed.add(id(c))
                converts += 1 if c.edit is Edit.INSERTED else -1
        place = new_places.place(e.new, e.new_computation)
        runs = new_places.executions(e.new_computation)
        moved = flops(e.new, new_places.module.computations[e.new_computation]) * runs
        key = (e.new.opcode, before, after, place)
        entry = groups.setdefault(key, [0, 0, 0, 0])
        entry[0] += 1
        entry[1] += runs
        entry[2] += moved
        entry[3] += converts
    return [Change(ChangeKind.PRECISION, Action.CHANGED, opcode, place, count=n, per_step=runs, before=before,
                   after=after, flops=moved, instructions=converts)
            for (opcode, before, after, place), (n, runs, moved, converts) in groups.items()]


def _kernels(edits: Sequence[InstructionEdit], old_places: _Places, new_places: _Places,
             claimed: set[int]) -> list[Change]:
    groups: dict[tuple, list] = {}
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
        key = (action, kernel_name(instr), instr.custom_call_target, _edit_place(e, old_places, new_places))
        entry = groups.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += _edit_runs(e, old_places, new_places)
    return [Change(ChangeKind.KERNEL, action, name if name == target else f"{name} ({target})", place, count=n,
                   per_step=runs)
            for (action, name, target, place), (n, runs) in groups.items()]


def _renames(pairs: Sequence[ParamPair]) -> list[Change]:
    groups: Counter = Counter()
    for pair in pairs:
        if pair.renamed and not pair.old.is_rng and not pair.new.is_rng:
            groups[(_fold(pair.old.folded_path), _fold(pair.new.folded_path))] += 1
    return [Change(ChangeKind.RENAME, Action.CHANGED, f"{old} -> {new}", Place("main", "", "", (new,)), count=n,
                   before=old, after=new)
            for (old, new), n in sorted(groups.items())]


def _parameters(pairs: Sequence[ParamPair]) -> list[Change]:
    changes = []
    for action, side in ((Action.ADDED, "new"), (Action.REMOVED, "old")):
        alone = [getattr(p, side) for p in pairs if getattr(p, "old" if side == "new" else "new") is None
                 and not getattr(p, side).is_rng]
        by_pattern: dict[tuple, list[EntryParam]] = defaultdict(list)
        for p in alone:
            by_pattern[(p.pattern, p.dtype)].append(p)
        for (pattern, dtype), params in sorted(by_pattern.items()):
            changes.append(Change(ChangeKind.PARAMETERS, action, pattern, Place("main", "", "", (pattern,)),
                                  count=len(params), bytes=sum(p.bytes for p in params), after=dtype,
                                  groups=((pattern, len(params)),)))
    reshaped: dict[tuple, list[ParamPair]] = defaultdict(list)
    for pair in pairs:
        if pair.reshaped and not pair.new.is_rng:
            reshaped[(pair.new.pattern, pair.old.shape.text, pair.new.shape.text)].append(pair)
    for (pattern, before, after), found in sorted(reshaped.items()):
        changes.append(Change(ChangeKind.PARAMETERS, Action.CHANGED, pattern, Place("main", "", "", (pattern,)),
                              count=len(found), before=before, after=after,
                              bytes=sum(p.new.bytes - p.old.bytes for p in found)))
    return changes


def _program_size(match: ModuleMatch, old_places: _Places, new_places: _Places, claimed: set[int]) -> list[Change]:
    """What the named kinds left of inserted and deleted instructions, in one record (module doc)."""
    rest = [e for e in match.edits if id(e) not in claimed and e.edit is not Edit.CHANGED]
    computations = (len(match.computations_inserted), len(match.computations_deleted))
    if not rest and not any(computations):
        return []
    by_opcode: Counter = Counter()
    per_step = 0
    for e in rest:
        sign = 1 if e.edit is Edit.INSERTED else -1
        by_opcode[e.instruction.opcode] += sign
        per_step += sign * _edit_runs(e, old_places, new_places)
    for e in rest:
        claimed.add(id(e))
    added = sum(1 for e in rest if e.edit is Edit.INSERTED)
    removed = len(rest) - added
    before, after = match.instructions
    subject, place, count = _size_story(rest, old_places, new_places, by_opcode)
    groups = tuple(sorted(((op, n) for op, n in by_opcode.items() if n), key=lambda kv: (-abs(kv[1]), kv[0])))
    words = [f"+{added} -{removed} instructions"]
    if computations[0]:
        words.append(f"{computations[0]} computation{'s' * (computations[0] != 1)} added")
    if computations[1]:
        words.append(f"{computations[1]} computation{'s' * (computations[1] != 1)} removed")
    action = Action.ADDED if added > removed else Action.REMOVED if removed > added else Action.CHANGED
    return [Change(ChangeKind.PROGRAM_SIZE, action, subject, place, count=count, per_step=per_step,
                   before=f"{before} instructions", after=f"{after} instructions", instructions=added - removed,
                   groups=groups)]


def _size_story(rest: Sequence[InstructionEdit], old_places: _Places, new_places: _Places,
                by_opcode: Counter) -> tuple[str, Place, int]:
    """What the inserted and deleted instructions are, in a few words: rematerialization removed or added (its
    ``opt-barrier``s), copies of one subgraph (a loop unrolled), else the instructions' own count; with the place
    most of them share and how many times it repeats."""
    barriers = by_opcode.get("opt-barrier", 0)
    if barriers:
        edits = [e for e in rest if e.instruction.opcode == "opt-barrier"]
        story = "rematerialization " + ("added" if barriers > 0 else "removed")
        return story, _edit_place(edits[0], old_places, new_places), abs(barriers)
    inserted = [e for e in rest if e.edit is Edit.INSERTED]
    deleted = [e for e in rest if e.edit is Edit.DELETED]
    side = inserted if len(inserted) >= len(deleted) else deleted
    copies = Counter((e.instruction.opcode, _fold(e.instruction.op_name), _source(e.instruction)) for e in side)
    repeats = Counter(copies.values())
    if repeats:
        times, kinds = max(repeats.items(), key=lambda kv: (kv[0] * kv[1], kv[0]))
        covered = times * kinds
        if times > 1 and covered * 2 >= len(side):
            sample = next(e for e in side if copies[(e.instruction.opcode, _fold(e.instruction.op_name),
                                                     _source(e.instruction))] == times)
            story = f"{times} copies of the same {kinds}-instruction subgraph"
            return story, _edit_place(sample, old_places, new_places), times
    sources = Counter(_source(e.instruction) for e in side)
    source = sources.most_common(1)[0][0] if sources else ""
    sample = next((e for e in side if _source(e.instruction) == source), side[0]) if side else None
    place = _edit_place(sample, old_places, new_places) if sample is not None else Place()
    return "instructions", place, len(side)


def _header(old_header: dict[str, str], new_header: dict[str, str], old_module: HloModule,
            new_module: HloModule, donation_changed: bool) -> list[Change]:
    """Header attributes that differ (RNG state's entries already gone from both), by name and entries; the module's
    name (the jitted function's) when it changed."""
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
        if before == after:
            continue
        if key in ("input_output_alias", "buffer_donor") and donation_changed:
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


def _instructions(edits: Sequence[InstructionEdit], old_places: _Places, new_places: _Places,
                  claimed: set[int]) -> list[Change]:
    """The edits no kind named, grouped by what changed and where."""
    groups: dict[tuple, list] = {}
    for e in edits:
        if id(e) in claimed:
            continue
        action = {Edit.INSERTED: Action.ADDED, Edit.DELETED: Action.REMOVED, Edit.CHANGED: Action.CHANGED}[e.edit]
        if e.edit is Edit.CHANGED:
            before, after = _form(e.old, e.aspects), _form(e.new, e.aspects)
            subject = e.old.opcode if e.old.opcode == e.new.opcode else f"{e.old.opcode} -> {e.new.opcode}"
            subject += f" ({', '.join(e.aspects)})"
        else:
            before = after = ""
            subject = e.instruction.opcode
        key = (action, subject, before, after, _edit_place(e, old_places, new_places))
        entry = groups.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += _edit_runs(e, old_places, new_places)
    changes = [Change(ChangeKind.INSTRUCTIONS, action, subject, place, count=n, per_step=runs, before=before,
                      after=after, instructions=n if action is Action.ADDED else -n if action is Action.REMOVED
                      else 0)
               for (action, subject, before, after, place), (n, runs) in groups.items()]
    changes.sort(key=lambda c: (-c.count, c.subject))
    return changes


def _form(instr: Instruction, aspects: Sequence[str]) -> str:
    """The parts of an instruction that changed, as short text."""
    parts = []
    if "opcode" in aspects:
        parts.append(instr.opcode)
    if {"dtype", "dims", "layout", "shape"} & set(aspects):
        parts.append(instr.shape.text if len(instr.shape.text) <= 60 else f"{instr.shape.text[:57]}...")
    for aspect in aspects:
        if aspect in instr.attrs:
            value = instr.attrs[aspect]
            parts.append(f"{aspect}={value if len(value) <= 60 else value[:57] + '...'}")
    if "literal" in aspects:
        parts.append(instr.literal if len(instr.literal) <= 40 else instr.literal[:37] + "...")
    return "; ".join(parts)
