"""Where a change is, and how often a step runs it: the two sides of a match read for places (computation, op_name
and source, the state paths a value comes from, layer indices folded) and executions per step (changes.py's
module doc says what a place is)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property

from hlo_audit.hlo.call_sites import CallSites, Chain
from hlo_audit.hlo.changes import Place
from hlo_audit.hlo.locations import Locations, Origin, Places, changed_lines_of
from hlo_audit.hlo.loops import trip_count
from hlo_audit.hlo.match import InstructionEdit, ModuleMatch
from hlo_audit.hlo.normalize import computation_words
from hlo_audit.hlo.param_reads import ParameterReads
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.rng_flow import PASS_THROUGH_CUSTOM_CALLS, random_computations
from hlo_audit.hlo.text import HloModule, Instruction, split_name_list

_LAYER_INDEX = re.compile(r"\b((?:layers?|blocks?|h|cell)[_.])\d+\b")
# What passes a value on for attribution: the value a dot reads through these is still its weight.
_ATTRIBUTION_PASS_THROUGH = frozenset({
    "bitcast", "copy", "opt-barrier", "optimization-barrier", "add-dependency", "domain", "convert", "reshape",
    "transpose", "broadcast", "slice", "dynamic-slice", "reduce-precision", "bitcast-convert", "all-gather",
    "copy-start",
})

# jax's name stack for what a checkpoint keeps or recomputes: ``.../checkpoint/rematted_computation/...`` forward,
# ``transpose(jvp(...))/remat2`` backward (flax's nn.remat and equinox's filter_checkpoint alike).
_UNDER_CHECKPOINT = re.compile(r"(?:^|[/(])(?:remat\d*|checkpoint|rematted_computation)(?:[/)]|$)")


# jax's name stack for a checkpoint's recomputation (the forward ops it copies, in the backward pass).
RECOMPUTED = "rematted_computation"


def under_checkpoint(op_name: str) -> bool:
    """Whether jax's ``op_name`` puts an instruction under a checkpoint (remat's own, or its recomputation)."""
    return _UNDER_CHECKPOINT.search(op_name) is not None


def passes_value(instr: Instruction) -> bool:
    if instr.opcode == "custom-call":
        return instr.custom_call_target in PASS_THROUGH_CUSTOM_CALLS
    return instr.opcode in _ATTRIBUTION_PASS_THROUGH


def fold(text: str) -> str:
    """Layer indices folded as parameter patterns fold them: ``layers_3`` -> ``layers_*``."""
    return _LAYER_INDEX.sub(r"\1*", text)


class ModuleView:
    """One side of a match as the kinds read it: places, executions per step, users, state read."""

    def __init__(self, module: HloModule, params: Sequence[EntryParam], places: Places | None = None):
        self.module = module
        self.params = {p.index: p for p in params}
        self.reads = ParameterReads(module, passes_value)
        self.locations = Locations(module)
        self.places = places or {}
        # Which instructions the match changed (``Sides``): a changed one's place climbs past a wrapper both sides
        # share (call_sites.py); none before a match says.
        self._changed: Callable[[Instruction, str], bool] | None = None
        self._partner: Callable[[Instruction], tuple[str, Chain] | None] | None = None
        self._origins: dict[int, tuple[str, Chain, bool]] = {}
        self._executions: dict[str, int] | None = None
        self._users: dict[int, list[Instruction]] | None = None
        self._fusions: dict[str, list[tuple[Instruction, str]]] | None = None
        self._callers: dict[str, list[Instruction]] | None = None
        self._computation_of: dict[int, str] | None = None

    @property
    def changed_lines(self) -> frozenset[str]:
        """The pull request's changed lines this side was placed by (``locations.PlacedByChange``), where known."""
        return changed_lines_of(self.places)

    def read(self, instr: Instruction, computation: str) -> list[EntryParam]:
        """The entry parameters whose values reach ``instr``'s operands through ops that pass values on."""
        comp = self.module.computations[computation]
        found: set[int] = set()
        for operand in instr.operands:
            found |= self.reads.value(comp, operand, ())
        return [self.params[n] for n in sorted(found) if n in self.params]

    def place(self, instr: Instruction, computation: str) -> Place:
        comp = self.module.computations[computation]
        paths = tuple(sorted({p.folded_path for p in self.read(instr, computation)}))
        where = "main" if comp.is_entry else computation_words(comp.name)
        op_name, source = self.origin(instr, computation)
        changed = self.changed_lines
        return Place(where, op_name, source, paths, near=self._origin(instr, computation)[2],
                     on_change=(source in changed) if changed else None)

    def origin(self, instr: Instruction, computation: str) -> tuple[str, str]:
        """jax's op_name (layer indices folded) and the source ``file:line``: from the instruction's metadata, else
        from the places the stage kept beside a text printed without it (``places``, by canonical names), else from
        the ops next to it (``_borrowed``); a changed instruction's source is its call site past a wrapper both sides
        share (``call_sites``)."""
        op_name, chain, near = self._origin(instr, computation)
        if len(chain) > 1 and not near and self.call_sites is not None:  # a borrowed line is another op's: as it is
            return fold(op_name), self.call_sites.place(instr, chain)
        return fold(op_name), chain[0] if chain else ""

    def changed_by(self, changed: Callable[[Instruction, str], bool]) -> None:
        """Which of this side's instructions (in which computation) the match changed: what ``call_sites`` reads."""
        self._changed = changed

    def partnered(self, partner: Callable[[Instruction], tuple[str, Chain] | None]) -> None:
        """Where the other side says each of this side's kept instructions is (``partner``: its op_name and chain, or
        None): a golden's text keeps no lines, so what was removed is placed near the kept code next to it
        (``_borrowed``)."""
        self._partner = partner

    @cached_property
    def call_sites(self) -> CallSites | None:
        if self._changed is None:
            return None
        return CallSites(self.module, lambda i, c: self.said(i, c)[1], self._changed)

    def chain(self, instr: Instruction, computation: str) -> Chain:
        """The instruction's source ``file:line`` and the user's frames that called it, innermost first."""
        return self._origin(instr, computation)[1]

    def _origin(self, instr: Instruction, computation: str) -> tuple[str, Chain, bool]:
        """op_name, chain, and whether the chain is near rather than the instruction's own (borrowed from the ops
        next to it: ``_borrowed``)."""
        found = self._origins.get(id(instr))
        if found is None:
            op_name, chain, near = self.said(instr, computation)
            if not chain:
                chain, near = self._borrowed(instr)
            found = self._origins[id(instr)] = (op_name, chain, near)
        return found

    def said(self, instr: Instruction, computation: str) -> tuple[str, Chain, bool]:
        """What is said of the instruction itself (``_origin`` without borrowing from its neighbours)."""
        chain = self.locations.chain_of(instr)
        if instr.op_name or chain:
            return instr.op_name, chain, False
        kept = self.places.get((computation, instr.name))
        if kept is not None:
            return kept.op_name, (kept.source, *kept.callers) if kept.source else (), False
        other = self._partner(instr) if self._partner is not None else None
        return ("", other[1], True) if other is not None and other[1] else ("", (), False)

    def _borrowed(self, instr: Instruction) -> tuple[Chain, bool]:
        """The line of the nearest ops that say one (``_nearby``), else of the op calling its computation (a loop
        body's while, a branch's conditional), nested ``_STEPS`` deep at most; "near" either way."""
        chain = self._nearby.get(id(instr))
        frontier = [instr]
        for _ in range(_STEPS):
            if chain:
                return chain, True
            frontier = [caller for i in frontier for caller in self._calling(i)]
            calls = Counter(c for n in frontier if (c := self.said(n, self.computation_of(n))[1] or
                                                        self._nearby.get(id(n))))
            chain = calls.most_common(1)[0][0] if calls else ()
        return (), False

    @cached_property
    def _nearby(self) -> dict[int, Chain]:
        """For each instruction no line is said of, the line of the nearest ops that say one, in the dataflow either
        way, ``_STEPS`` steps at most: the one most of the ops a step nearer say (a loop's carried values, its
        parameter, get-tuple-elements and tuple, are where the ops reading them are; a removed op, by its kept
        neighbours' partners). Spread from every op that says one at once: one walk of the module."""
        labels: dict[int, Chain] = {}
        frontier = []
        for comp in self.module.computations.values():
            for instr in comp.instructions:
                chain = self.said(instr, comp.name)[1]
                if chain:
                    labels[id(instr)] = chain
                    frontier.append(instr)
        for _ in range(_STEPS):
            votes: dict[int, Counter] = {}
            reached: dict[int, Instruction] = {}
            for done in frontier:
                for n in self._next_to(done):
                    if id(n) not in labels:
                        votes.setdefault(id(n), Counter())[labels[id(done)]] += 1
                        reached[id(n)] = n
            labels.update((key, counts.most_common(1)[0][0]) for key, counts in votes.items())
            frontier = list(reached.values())
        return labels

    def _next_to(self, instr: Instruction) -> list[Instruction]:
        return [*self.operands(instr, self.computation_of(instr)), *self.users(instr)]

    def _calling(self, instr: Instruction) -> list[Instruction]:
        """The instructions that call ``instr``'s computation (a loop's body: the while; a branch: the conditional)."""
        if self._callers is None:
            self._callers = defaultdict(list)
            for comp in self.module.computations.values():
                for caller in comp.instructions:
                    for callee in caller.called_computations():
                        self._callers[callee].append(caller)
        return self._callers.get(self.computation_of(instr), [])

    @cached_property
    def random_computations(self) -> frozenset[str]:
        return random_computations(self.module)

    def executions(self, computation: str) -> int:
        if self._executions is None:
            self._executions = executions(self.module)
        return self._executions.get(computation, 1)

    def operands(self, instr: Instruction, computation: str) -> list[Instruction]:
        by_name = self.module.computations[computation].by_name
        return [by_name[ref] for ref in instr.operands if ref in by_name]

    def users(self, instr: Instruction) -> list[Instruction]:
        if self._users is None:
            self._users = defaultdict(list)
            for comp in self.module.computations.values():
                for user in comp.instructions:
                    for ref in user.operands:
                        operand = comp.by_name.get(ref)
                        if operand is not None:
                            self._users[id(operand)].append(user)
        return self._users.get(id(instr), [])


    # A compiled module's fusions: one value's work split by XLA's choice of what to fuse. The model's terms read
    # dataflow across them (a loss term's reductions in one fusion, the sum it joins in another), as a lowered
    # module's has none to cross.

    def computation_of(self, instr: Instruction) -> str:
        if self._computation_of is None:
            self._computation_of = {id(i): comp.name for comp in self.module.computations.values()
                                    for i in comp.instructions}
        return self._computation_of.get(id(instr), "")

    def fused_callers(self, computation: str) -> list[tuple[Instruction, str]]:
        """The fusions that call ``computation`` (its body), each with the computation it is in."""
        if self._fusions is None:
            self._fusions = defaultdict(list)
            for comp in self.module.computations.values():
                for instr in comp.instructions:
                    if instr.opcode == "fusion":
                        for callee in instr.called_computations():
                            self._fusions[callee].append((instr, comp.name))
        return self._fusions.get(computation, [])

    def inputs(self, instr: Instruction, computation: str) -> list[Instruction]:
        """What ``instr``'s value is computed from, through fusions: its operands; a fusion's body's root; a fused
        parameter's, the operand each fusion calling the body passes it."""
        found = self.operands(instr, computation)
        if instr.opcode == "fusion":
            found += [self.module.computations[c].root for c in instr.called_computations()
                      if c in self.module.computations]
        elif instr.opcode == "parameter" and instr.parameter_number is not None:
            for fusion, caller in self.fused_callers(computation):
                if instr.parameter_number < len(fusion.operands):
                    operand = self.module.computations[caller].by_name.get(fusion.operands[instr.parameter_number])
                    found += [operand] if operand is not None else []
        return found

    def consumers(self, instr: Instruction, computation: str) -> list[Instruction]:
        """What reads ``instr``'s value, through fusions (``inputs``'s other way): its users, a fusion it feeds
        by the body's parameter it is; a fused body's root, by the fusions that call the body."""
        found = []
        for user in self.users(instr):
            if user.opcode != "fusion":
                found.append(user)
                continue
            body = self.module.computations.get(next(iter(user.called_computations()), ""))
            numbers = {n for n, ref in enumerate(user.operands) if ref == instr.name}
            found += [p for p in body.parameters if p.parameter_number in numbers] if body is not None else [user]
        comp = self.module.computations.get(computation)
        if comp is not None and comp.root is instr:
            found += [fusion for fusion, _ in self.fused_callers(computation)]
        return found


_NOWHERE = Origin("", "")
# How far a place is borrowed from (``ModuleView._borrowed``): a removed stretch of code is a chain of a few dozen ops.
_STEPS = 6


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
                    trips = trip_count(module, comp, instr)
                    times *= (trips or 1) + (condition is not None and callee == condition.name)
                runs[callee] = runs.get(callee, 0) + times
                if callee not in seen:
                    seen.add(callee)
                    order.append(target)
    return runs


def instructions_per_step(module: HloModule) -> Counter:
    """Instructions one step executes, by opcode: each computation's times its runs per step (``executions``), the
    computations applied per element (a reduction's reducer, a sort's comparator, a scatter's combiner) left out:
    they are the op that applies them, not instructions of the program."""
    runs = executions(module)
    # A call's to_apply is no per-element function: it runs once per call (jax 0.10 writes an unrolled loop as 8
    # calls of one computation; ``executions`` counts them).
    per_element = {c for comp in module.computations.values() for instr in comp.instructions if instr.opcode != "call"
                   for key in _PER_ELEMENT if key in instr.attrs for c in split_name_list(instr.attrs[key])}
    counts: Counter = Counter()
    for name, times in runs.items():
        if name in per_element:
            continue
        for instr in module.computations[name].instructions:
            counts[instr.opcode] += times
    return counts


_PER_ELEMENT = ("to_apply", "scatter", "select")


class Sides:
    """Both sides, and what an edit reads on its own side."""

    def __init__(self, match: ModuleMatch, old_params: Sequence[EntryParam], new_params: Sequence[EntryParam],
                 new_places: Places | None = None, old_places: Places | None = None):
        self.match = match
        self.old = ModuleView(match.old, old_params, old_places)
        self.new = ModuleView(match.new, new_params, new_places)
        edited = {id(i) for e in match.edits for i in (e.old, e.new) if i is not None}
        inserted, deleted = set(match.computations_inserted), set(match.computations_deleted)
        self.new.changed_by(lambda instr, comp: id(instr) in edited or comp in inserted)
        self.old.changed_by(lambda instr, comp: id(instr) in edited or comp in deleted)
        self.old.partnered(self._new_side_of)

    def _new_side_of(self, instr: Instruction) -> tuple[str, Chain] | None:
        partner = self.match.partner(instr)
        return self.new.said(partner, self.new.computation_of(partner))[:2] if partner is not None else None

    def side(self, e: InstructionEdit) -> tuple[ModuleView, Instruction, str]:
        if e.new is not None:
            return self.new, e.new, e.new_computation
        return self.old, e.old, e.old_computation

    def place(self, e: InstructionEdit) -> Place:
        module, instr, computation = self.side(e)
        return module.place(instr, computation)

    def origin(self, e: InstructionEdit) -> tuple[str, str]:
        module, instr, computation = self.side(e)
        return module.origin(instr, computation)

    def in_random_bits(self, e: InstructionEdit) -> bool:
        """The edit's instruction is in jax.random's own computations (``rng_flow.random_computations``)."""
        module, _, computation = self.side(e)
        return computation in module.random_computations

    def runs(self, e: InstructionEdit) -> int:
        module, _, computation = self.side(e)
        return module.executions(computation)

    def layers(self, e: InstructionEdit) -> set[str]:
        """The layers (their indices) whose state the edit's instruction reads."""
        module, instr, computation = self.side(e)
        return {layer_of(p) for p in module.read(instr, computation) if p.layer_prefix}


class Groups:
    """Edits of one kind folded by a key: count, runs per step, layers spanned, and one place for all (the paths
    any of them reads; the op_name and source most of them share)."""

    def __init__(self):
        self.found: dict[tuple, dict] = {}

    def add(self, key: tuple, place: Place, runs: int, layers: set[str], **sums: int) -> None:
        group = self.found.setdefault(key, {"count": 0, "runs": 0, "paths": set(), "op_names": Counter(),
                                            "sources": Counter(), "own": set(), "computation": place.computation,
                                            "layers": set(), "sums": Counter(), "changed": Counter(),
                                            "judged": False})
        group["count"] += 1
        group["runs"] += runs
        group["paths"].update(place.paths)
        group["op_names"][place.op_name] += 1
        group["sources"][place.source] += 1
        if not place.near:
            group["own"].add(place.source)
        if place.on_change is not None:  # the pull request's changed lines are known: the group's place is one
            group["judged"] = True
            if place.on_change:
                group["changed"][place.source] += 1
        group["layers"] |= layers
        group["sums"].update(sums)

    def items(self) -> Iterable[tuple[tuple, dict, Place]]:
        for key, group in self.found.items():
            source = _most_said(group["changed"]) or _most_said(group["sources"])
            place = Place(group["computation"], _most_said(group["op_names"]), source, tuple(sorted(group["paths"])),
                          near=bool(source) and source not in group["own"],
                          on_change=bool(group["changed"]) if group["judged"] else None)
            yield key, group, place


def _most_said(counts: Counter) -> str:
    """The value most of a group's edits share among those that say one: a loop's carried values (its
    get-tuple-elements, its tuple) have no metadata, and a change that widens the loop state is mostly those, yet
    its ops say where it is."""
    said = [(n, value) for value, n in counts.most_common() if value]
    return said[0][1] if said else ""


def layer_count(layers: Iterable[str]) -> int:
    """How many layers the names ``layer_of`` gives span: their distinct indices (``block_3`` of a weight and
    ``0__mu__block_3`` of its optimizer moment are one layer, ``3``); a stack's name (a scanned stack, its layers one
    value) counts only where no index does, its moments' names as its own (``0__mu__layers`` is ``layers``). A step
    whose unrolled layers and scanned stack both appear (a scan rolled or unrolled) spans its indexed layers, not one
    more for the stack."""
    found = set(layers)
    indices = {m.group(0) for layer in found if (m := _INDEX.search(layer))}
    return len(indices) if indices else len({layer.rsplit("__", 1)[-1] for layer in found})


_INDEX = re.compile(r"\d+$")


def layer_of(p: EntryParam) -> str:
    """Which layer a parameter is in: its index (``3`` of ``layers_3`` or ``blocks.3``), the stack's name for a
    stacked (scanned) one."""
    depth = p.layer_prefix.count(".") + 1
    return p.path.split(".")[depth - 1]
