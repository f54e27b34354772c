"""The kinds of change that are about how a step computes, read from its dataflow: gradient reach, optimizer
transforms, loops and rematerialization (changes.py's module doc lists what each carries). ``explain`` runs them
before program size, so that the edits they explain are theirs, not a size tally's.

* ``gradient``: which trainable parameters' updates depend on the batch. A weight's update is the output that
  aliases it (``input_output_alias``; without donation, the output at its position of the same shape), and it
  depends on the batch where a value computed from a non-state input (an entry parameter no output aliases) reaches
  it through arrays: a scalar (a global norm, a loss scale, a step count) carries no gradient, so a clipped frozen
  weight, whose update reads every gradient's norm, is still one the loss no longer reaches. A weight reached in
  one module and not in the other is gradient reach lost (or gained).
* ``transform``: gradient clipping, a scalar ``sqrt`` of the sum of ``reduce(x * x)`` over several arrays (a global
  norm), added or removed with the instructions only it used; update scaling (``optax.scale``), a multiply by one
  constant added or removed once per weight.
* ``loops``: ``while`` instructions added or removed, with their trip counts and bodies' size; a loop whose body's
  copies replace it inline (unrolled), layers rolled into a loop of as many iterations (``nn.scan``,
  ``jax.lax.scan``); a paired loop's trip count changed.
* ``remat``: rematerialization removed or added (its ``opt-barrier``s, the recomputation behind them), or a remat
  policy changed: the barriers stay and what they carry changes, and the backward pass recomputes other
  instructions (jax names them ``rematted_computation`` in ``op_name``, where the text keeps it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from hlo_audit.hlo.change_places import RECOMPUTED, Sides, layer_count, layer_of, under_checkpoint
from hlo_audit.hlo.changes import (
    CLIPPING,
    GRADIENT_REACH,
    LOOP,
    REMAT,
    REMAT_POLICY,
    ROLLED,
    SCALING,
    TRIP_COUNT,
    UNROLLED,
    WEIGHT_DECAY,
    Action,
    Change,
    ChangeKind,
    Place,
)
from hlo_audit.hlo.header import output_aliases
from hlo_audit.hlo.loops import trip_count
from hlo_audit.hlo.match import Edit, InstructionEdit, ModuleMatch
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.state_flow import written_back
from hlo_audit.hlo.text import Computation, HloModule, Instruction

# The op_name part jax gives the instructions a checkpoint recomputes in the backward pass.
_BARRIERS = frozenset({"opt-barrier", "optimization-barrier"})


def _unclaimed(match: ModuleMatch, claimed: set[int]) -> list[InstructionEdit]:
    return [e for e in match.edits if id(e) not in claimed and e.edit is not Edit.CHANGED]


def _claim(match: ModuleMatch, sides: Sides, claimed: set[int], edits: Sequence[InstructionEdit]) -> None:
    """Claim ``edits``, and the paired instructions whose only change is to read from them (rewired: they follow)."""
    alone = {id(e.instruction) for e in edits if e.edit is not Edit.CHANGED}
    claimed.update(id(e) for e in edits)
    for e in match.edits:
        if e.edit is Edit.CHANGED and id(e) not in claimed and set(e.aspects) <= {"operands"} and (
                any(id(o) in alone for o in sides.new.operands(e.new, e.new_computation)) or
                any(id(o) in alone for o in sides.old.operands(e.old, e.old_computation))):
            claimed.add(id(e))


def _opcodes(edits: Sequence[InstructionEdit]) -> tuple[tuple[str, int], ...]:
    counts: Counter = Counter()
    for e in edits:
        counts[e.instruction.opcode] += 1 if e.edit is Edit.INSERTED else -1
    return tuple(sorted(((op, n) for op, n in counts.items() if n), key=lambda kv: (-abs(kv[1]), kv[0])))


def _net(edits: Sequence[InstructionEdit]) -> int:
    return sum(1 if e.edit is Edit.INSERTED else -1 for e in edits)


def _layers(edits: Sequence[InstructionEdit], sides: Sides) -> int:
    """The layers the edits' instructions read state of (``change_places.layer_count``)."""
    return layer_count(layer for e in edits for layer in sides.layers(e))


# --- gradient reach -------------------------------------------------------------------------------------------


def gradient(match: ModuleMatch, sides: Sides, claimed: set[int]) -> list[Change]:
    """Weights whose update depends on the batch in one module and not the other (module doc), with the inserted
    and deleted instructions left (the backward work that went or came with them; a checkpoint's barrier now
    keeping other values)."""
    old, new = _reached(match.old, [p.old for p in match.params if p.old]), \
        _reached(match.new, [p.new for p in match.params if p.new])
    if old is None or new is None:
        return []
    changes = []
    for action, subject in ((Action.REMOVED, "lost"), (Action.ADDED, "gained")):
        params = [p.new for p in match.params if p.old is not None and p.new is not None
                  and p.old.index in old and p.new.index in new
                  and old[p.old.index] is (action is Action.REMOVED) and new[p.new.index] is (action is Action.ADDED)]
        if not params:
            continue
        reached = sum(new.values()) if action is Action.REMOVED else sum(old.values())
        paths = tuple(sorted(p.path for p in params))
        changes.append(Change(ChangeKind.GRADIENT, action, f"{GRADIENT_REACH} {subject}",
                              Place("main", "", "", paths), count=len(params), bytes=sum(p.bytes for p in params),
                              before=f"{len(new)} weights", after=f"{reached} reached",
                              layers=layer_count(layer_of(p) for p in params if p.layer_prefix)))
    if changes:
        # The work that went with the reach lost (deleted instructions), or came with the reach gained (inserted).
        kept = Edit.DELETED if changes[0].action is Action.REMOVED else Edit.INSERTED
        work = [*(e for e in _unclaimed(match, claimed) if e.edit is kept), *_barriers_changed(match, claimed)]
        _claim(match, sides, claimed, work)
        changes[0] = replace(changes[0], instructions=_net(work), groups=_opcodes(work))
    return changes


def _weights(params: Sequence[EntryParam]) -> list[EntryParam]:
    """The trainable parameters: role ``weight``; where no leaf's type or name said so, float leaves under a
    ``params`` component (a linen ``TrainState``'s, lowered from text)."""
    weights = [p for p in params if p.role == "weight"]
    if weights:
        return weights
    return [p for p in params if p.role == "input" and p.dtype.startswith(("f", "bf"))
            and "params" in p.path.replace("_", ".").split(".")]


def _reached(module: HloModule, params: Sequence[EntryParam]) -> dict[int, bool] | None:
    """Weight parameter number -> whether its update depends on the batch; None where the module says no updates
    (no weights, no batch, an output that is not a tuple). ``params``: the module's entry parameters (RNG state
    stripped: its header counts the rest from 0, in order, while the entry keeps their numbers)."""
    entry = module.entry
    root = entry.root
    if root.opcode != "tuple":
        return None
    ordered = sorted(params, key=lambda p: p.index)
    aliased = {param: output[0] for output, param in output_aliases(module.header_attrs) if len(output) == 1}
    if not aliased:  # no donation: the state comes back in the order it came in
        aliased = {rank: rank for rank, p in enumerate(ordered) if rank < len(root.operands)
                   and entry.by_name[root.operands[rank]].shape.text == p.shape.text}
    output = {p.index: aliased[rank] for rank, p in enumerate(ordered) if rank in aliased}
    for number, write in written_back(module).items():  # state not donated: where the step returns it (state_flow)
        output.setdefault(number, write.output)
    batch = {p.index for p in ordered if p.index not in output}
    weights = [p for p in _weights(ordered) if p.index in output and output[p.index] < len(root.operands)]
    if not batch or not weights:
        return None
    tainted = _Taint(module).computation(entry, {p.index: p.index in batch for p in ordered})
    return {p.index: _any(tainted.get(root.operands[output[p.index]], False)) for p in weights}


Taint = bool | tuple


def _any(value: Taint) -> bool:
    return any(_any(v) for v in value) if isinstance(value, tuple) else value


class _Taint:
    """Which values are computed from the batch, through arrays (a scalar carries none: module doc), element by
    element through tuples, barriers and called computations."""

    def __init__(self, module: HloModule):
        self.module = module

    def computation(self, comp: Computation, params: dict[int, Taint]) -> dict[str, Taint]:
        values: dict[str, Taint] = {}
        for instr in comp.instructions:
            values[instr.name] = self.instruction(instr, [values.get(r, False) for r in instr.operands], params)
        return values

    def instruction(self, instr: Instruction, operands: list[Taint], params: dict[int, Taint]) -> Taint:
        op = instr.opcode
        if op == "parameter":
            return params.get(instr.parameter_number, False)
        if op == "tuple":
            return tuple(operands)
        if op in _BARRIERS and len(operands) == 1:
            return operands[0]
        if op == "get-tuple-element" and operands and isinstance(operands[0], tuple):
            index = int(instr.attrs.get("index", -1))
            return operands[0][index] if 0 <= index < len(operands[0]) else False
        callees = instr.called_computations()
        if op == "call" and len(callees) == 1 and callees[0] in self.module.computations:
            callee = self.module.computations[callees[0]]
            return self.computation(callee, dict(enumerate(operands)))[callee.root.name]
        if op == "conditional" and len(operands) == len(callees) + 1 and \
                all(c in self.module.computations for c in callees):
            # Each branch on its own operand; the result as any branch's (the predicate is a scalar or an index).
            results = [self._branch(self.module.computations[c], operand) for c, operand in zip(callees, operands[1:])]
            return _either(results)
        if not instr.shape.is_tuple and not instr.shape.dims:
            return False  # a scalar: a norm, a scale, a count
        return any(_any(v) for v in operands)


    def _branch(self, comp: Computation, operand: Taint) -> Taint:
        return self.computation(comp, {0: operand})[comp.root.name]


def _either(values: Sequence[Taint]) -> Taint:
    """Element by element, tainted where any of ``values`` is (structures of one shape; else any at all)."""
    if all(isinstance(v, tuple) for v in values) and len({len(v) for v in values}) == 1:
        return tuple(_either(parts) for parts in zip(*values))
    return any(_any(v) for v in values)


# --- optimizer transforms -------------------------------------------------------------------------------------


def transforms(match: ModuleMatch, sides: Sides, claimed: set[int]) -> list[Change]:
    """Gradient clipping added or removed: a global norm's ``sqrt`` inserted or deleted, with the inserted or deleted
    instructions that only feed it or only read from it (module doc)."""
    changes = []
    for edit, action in ((Edit.DELETED, Action.REMOVED), (Edit.INSERTED, Action.ADDED)):
        alone = {id(e.instruction): e for e in _unclaimed(match, claimed) if e.edit is edit}
        for e in [e for e in alone.values() if e.instruction.opcode == "sqrt"]:
            view = sides.old if edit is Edit.DELETED else sides.new
            comp = view.module.computations[e.computation]
            arrays = _global_norm(comp, e.instruction)
            if arrays < 2:
                continue
            mine = _connected(e, alone, view, comp)
            _claim(match, sides, claimed, mine)
            # The weights whose gradients it scales (it reads computed gradients, no state of its own).
            weights = _weights(list(view.params.values()))
            place = replace(sides.place(e), paths=tuple(sorted({p.folded_path for p in weights})))
            changes.append(Change(ChangeKind.TRANSFORM, action, CLIPPING, place,
                                  count=1, instructions=_net(mine), groups=_opcodes(mine),
                                  before=f"global norm over {arrays} arrays"))
        changes += _scaling(match, sides, claimed, edit, action)
    return changes


def _scaling(match: ModuleMatch, sides: Sides, claimed: set[int], edit: Edit, action: Action) -> list[Change]:
    """A multiply by a constant scalar inserted (or deleted) once for every weight: ``optax.scale`` (module doc)."""
    view = sides.old if edit is Edit.DELETED else sides.new
    weights = _weights(list(view.params.values()))
    alone = [e for e in _unclaimed(match, claimed) if e.edit is edit]
    # In the step itself (not a loop's body), and one of each weight's shape: the updates, not a model's own op.
    entry = view.module.entry.name
    factors = {id(e): f for e in alone if e.instruction.opcode == "multiply" and e.computation == entry
               and (f := _factor(view, e.instruction, e.computation)) is not None}
    shapes = Counter(e.instruction.shape.dims for e in alone if id(e) in factors)
    if len(weights) < 2 or shapes != Counter(p.shape.dims for p in weights):
        return []
    scales = [e for e in alone if id(e) in factors]
    # With the factor's constant and the broadcasts that carry it, where they came or went with it.
    feeding = {id(e.instruction): e for e in alone if e.instruction.opcode in ("broadcast", "convert", "constant")}
    mine, stack = list(scales), list(scales)
    while stack:
        e = stack.pop()
        for operand in view.operands(e.instruction, e.computation):
            found = feeding.pop(id(operand), None)
            if found is not None:
                mine.append(found)
                stack.append(found)
    _claim(match, sides, claimed, mine)
    (factor, _), = Counter(factors.values()).most_common(1)
    place = replace(sides.place(scales[0]), paths=tuple(sorted({p.folded_path for p in weights})))
    # Each weight scaled itself (not its gradient or update): weight decay, ``updates + wd * params``.
    numbers = {p.index for p in weights}
    decay = sum(_scaled_parameter(view, e.instruction, e.computation) in numbers for e in scales) * 2 > len(scales)
    return [Change(ChangeKind.TRANSFORM, action, WEIGHT_DECAY if decay else SCALING, place, count=len(scales),
                   instructions=_net(mine), groups=_opcodes(mine), before=f"x{factor} on {len(scales)} arrays")]


def _scaled_parameter(view, instr: Instruction, computation: str) -> int | None:
    """The entry parameter a multiply by a constant scales, as it is (through converts and reshapes), or None."""
    for operand in view.operands(instr, computation):
        source = _through(view, operand, computation, ("convert", "reshape", "bitcast", "copy"))
        if source.opcode == "parameter":
            return source.parameter_number
    return None


def _factor(view, instr: Instruction, computation: str) -> str | None:
    """The constant scalar one operand of a multiply is (through broadcasts and converts), as its literal."""
    for operand in view.operands(instr, computation):
        source = _through(view, operand, computation, ("broadcast", "convert", "reshape"))
        if source.opcode == "constant" and not source.shape.dims:
            return source.literal
    return None


def _through(view, operand: Instruction, computation: str, passing: tuple[str, ...]) -> Instruction:
    """What ``operand`` passes on through a chain of ``passing`` ops (their first operands)."""
    while operand.opcode in passing and operand.operands:
        inner = view.operands(operand, computation)
        if not inner:
            break
        operand = inner[0]
    return operand


def _global_norm(comp: Computation, sqrt: Instruction) -> int:
    """How many arrays a scalar ``sqrt`` takes the global norm of: the ``reduce(x * x)`` its operand sums."""
    if sqrt.shape.dims or sqrt.shape.is_tuple:
        return 0
    squares, stack, seen = 0, list(sqrt.operands), set()
    while stack:
        instr = comp.by_name.get(stack.pop())
        if instr is None or instr.name in seen:
            continue
        seen.add(instr.name)
        if instr.opcode in ("add", "convert") and not instr.shape.dims:
            stack.extend(instr.operands)
        elif instr.opcode == "reduce" and instr.operands:
            inner = comp.by_name.get(instr.operands[0])
            squares += inner is not None and inner.opcode == "multiply" and len(set(inner.operands)) == 1
    return squares


def _connected(start: InstructionEdit, alone: dict[int, InstructionEdit], view, comp: Computation) \
        -> list[InstructionEdit]:
    """The edits of one side reachable from ``start`` through its operands and users that are edits too."""
    found, stack = {id(start.instruction): start}, [start.instruction]
    while stack:
        instr = stack.pop()
        for other in (*view.operands(instr, comp.name), *view.users(instr)):
            e = alone.get(id(other))
            if e is not None and id(other) not in found and e.computation == comp.name:
                found[id(other)] = e
                stack.append(other)
    return list(found.values())


# --- loops ----------------------------------------------------------------------------------------------------


def loops(match: ModuleMatch, sides: Sides, claimed: set[int]) -> list[Change]:
    """Loops added, removed, unrolled or rolled, and paired loops whose trip count changed (module doc)."""
    changes = _trip_counts(match, sides, claimed)
    rest = _unclaimed(match, claimed)
    # threefry's rounds loop comes and goes with the draws it serves: the RNG's implementation, no loop of the model
    # (what it weighs is the program size's, said as random-bit generation there).
    deleted = [e for e in rest if e.edit is Edit.DELETED and e.old.opcode == "while" and not sides.in_random_bits(e)]
    inserted = [e for e in rest if e.edit is Edit.INSERTED and e.new.opcode == "while" and not sides.in_random_bits(e)]
    if not deleted and not inserted:
        return changes
    # Unrolled: loops gone and at least a body's worth of instructions inline in their place; rolled the other way.
    inline_in = sum(1 for e in rest if e.edit is Edit.INSERTED) - len(inserted)
    inline_out = sum(1 for e in rest if e.edit is Edit.DELETED) - len(deleted)
    if deleted and not inserted and inline_in >= _body_size(sides.old, deleted[0]) or \
            inserted and not deleted and inline_out >= _body_size(sides.new, inserted[0]):
        unrolled = bool(deleted)
        loops_ = deleted if unrolled else inserted
        view = sides.old if unrolled else sides.new
        trips = Counter(_trips(view, e) for e in loops_)
        (times, _), = trips.most_common(1)
        _claim(match, sides, claimed, rest)
        inline = [e for e in rest if e.edit is (Edit.INSERTED if unrolled else Edit.DELETED)]
        layers = _layers(inline, sides)
        return changes + [Change(
            ChangeKind.LOOPS, Action.REMOVED if unrolled else Action.ADDED, UNROLLED if unrolled else ROLLED,
            _placed(sides.place(loops_[0]), inline, sides), count=len(loops_), per_step=times or 0,
            before=_body(view, loops_[0]), after=f"{layers} layers" if layers else "",
            instructions=_net(rest), groups=_opcodes(rest), layers=layers)]
    if _net([e for e in rest if e.instruction.opcode in _BARRIERS]):
        return changes  # a checkpoint's recomputation, loops with it, added or removed: the remat kind's
    for found, action, view in ((deleted, Action.REMOVED, sides.old), (inserted, Action.ADDED, sides.new)):
        for e in found:
            mine = [e, *_in_body(e, rest, view)]
            _claim(match, sides, claimed, mine)
            changes.append(Change(ChangeKind.LOOPS, action, LOOP, sides.place(e), per_step=_trips(view, e) or 0,
                                  before=_body(view, e), instructions=_net(mine), groups=_opcodes(mine),
                                  layers=layer_count(sides.layers(e))))
    return changes


def _trip_counts(match: ModuleMatch, sides: Sides, claimed: set[int]) -> list[Change]:
    """Paired loops of another trip count, with the edits of their conditions (the bound's constant)."""
    changes = []
    loops_of = {id(i): c for c in match.new.computations.values() for i in c.instructions if i.opcode == "while"}
    for comp in match.old.computations.values():
        for instr in comp.instructions:
            if instr.opcode != "while":
                continue
            partner = match.partner(instr)
            if partner is None:
                continue
            new_comp = loops_of.get(id(partner))
            if new_comp is None:
                continue
            before = _trip(match.old, comp, instr)
            after = _trip(match.new, new_comp, partner)
            if before != after:
                condition = partner.attrs.get("condition", "").strip().lstrip("%")
                _claim(match, sides, claimed, [e for e in match.edits if e.edit is Edit.CHANGED
                                               and e.new_computation == condition and id(e) not in claimed])
                place = sides.new.place(partner, new_comp.name)
                changes.append(Change(ChangeKind.LOOPS, Action.CHANGED, TRIP_COUNT, place,
                                      before=f"{before or '?'} iterations", after=f"{after or '?'} iterations"))
    return changes


def _trip(module: HloModule, comp: Computation, loop: Instruction) -> int | None:
    return trip_count(module, comp, loop)


def _trips(view, e: InstructionEdit) -> int | None:
    return _trip(view.module, view.module.computations[e.computation], e.instruction)


def _body(view, e: InstructionEdit) -> str:
    """``8 iterations, body 120 instructions``."""
    return f"{_trips(view, e) or '?'} iterations, body {_body_size(view, e):,} instructions"


def _body_size(view, e: InstructionEdit) -> int:
    """A loop's body's instructions, with the computations it calls."""
    body = view.module.computations.get(e.instruction.attrs.get("body", "").strip().lstrip("%"))
    return _size(view.module, body, set()) if body is not None else 0


def _size(module: HloModule, comp: Computation, seen: set[str]) -> int:
    seen.add(comp.name)
    size = len(comp.instructions)
    for instr in comp.instructions:
        for callee in instr.called_computations():
            if callee not in seen and callee in module.computations:
                size += _size(module, module.computations[callee], seen)
    return size


def _in_body(loop: InstructionEdit, rest: Sequence[InstructionEdit], view) -> list[InstructionEdit]:
    """The edits in the computations a loop calls (its body, condition, and what they call)."""
    names: set[str] = set()
    stack = list(loop.instruction.called_computations())
    while stack:
        name = stack.pop()
        if name in names or name not in view.module.computations:
            continue
        names.add(name)
        stack.extend(c for i in view.module.computations[name].instructions for c in i.called_computations())
    return [e for e in rest if e is not loop and e.computation in names and e.edit is loop.edit]


def _placed(place: Place, edits: Sequence[InstructionEdit], sides: Sides) -> Place:
    """``place`` (a removed instruction's, which a golden's text does not locate), with the op_name and source most
    of ``edits`` share where it has none: a loop unrolled is where its body's copies come from."""
    if (place.op_name or place.source) and not place.near:
        return place
    # A layer's copies are where its dots are (an unrolled stack's optimizer updates come inline with it too).
    dots = [e for e in edits if e.instruction.opcode in ("dot", "convolution")]
    origins = Counter(o for o in map(sides.origin, dots or edits) if o[1])
    if not origins:
        return place
    (op_name, source), _ = origins.most_common(1)[0]
    changed = sides.new.changed_lines
    return Place(place.computation, op_name, source, place.paths, on_change=(source in changed) if changed else None)


# --- rematerialization ----------------------------------------------------------------------------------------


def remat(match: ModuleMatch, sides: Sides, claimed: set[int]) -> list[Change]:
    """Rematerialization removed or added (net ``opt-barrier``s), or its policy changed (barriers paired whose
    carried values changed), with the inserted and deleted instructions behind it (module doc); only between
    modules of the same entry parameters."""
    if any(p.old is None or p.new is None or p.reshaped for p in match.params):
        # Layers or weights added, removed or reshaped: their checkpoints come and go with them, and what a
        # checkpoint keeps changes with what it computes; the parameters and sizes say so, not a remat story.
        return []
    rest = _unclaimed(match, claimed)
    if not any(e.instruction.opcode in _BARRIERS for e in rest) and not _barriers_changed(match, claimed):
        return _remat_without_barriers(match, sides, claimed, rest)
    rest = _remat_work(rest, sides)
    barriers = [e for e in rest if e.instruction.opcode in _BARRIERS]
    net = _net(barriers)
    if net:
        sample = [e for e in barriers if (e.edit is Edit.INSERTED) == (net > 0)]
        _claim(match, sides, claimed, rest)
        return [Change(ChangeKind.REMAT, Action.ADDED if net > 0 else Action.REMOVED, REMAT, sides.place(sample[0]),
                       count=len(sample), instructions=_net(rest), groups=_opcodes(rest),
                       after=_recomputed(sides), layers=_layers(sample, sides))]
    changed = _barriers_changed(match, claimed)
    # Barriers paired that keep other values, or as many removed as added (the match pairs none of another shape).
    olds = [e.old for e in changed] + [e.old for e in barriers if e.edit is Edit.DELETED]
    news = [e.new for e in changed] + [e.new for e in barriers if e.edit is Edit.INSERTED]
    work = [e for e in rest if e.instruction.opcode not in _BARRIERS]
    if not news or not work:
        return []
    _claim(match, sides, claimed, [*rest, *changed])
    kept = (sum(map(_elements, olds)), sum(map(_elements, news)))
    recomputed = _recomputed(sides)
    sample = changed[0] if changed else next(e for e in barriers if e.edit is Edit.INSERTED)
    return [Change(ChangeKind.REMAT, Action.CHANGED, REMAT_POLICY, sides.place(sample), count=len(news),
                   before=f"{kept[0]} values kept", after=f"{kept[1]} values kept" + (
                       f", {recomputed}" if recomputed else ""),
                   instructions=_net(work), groups=_opcodes(work),
                   layers=_layers([*changed, *(e for e in barriers if e.edit is Edit.INSERTED)], sides))]


def _remat_without_barriers(match: ModuleMatch, sides: Sides, claimed: set[int],
                            rest: list[InstructionEdit]) -> list[Change]:
    """Remat added that writes no barrier (``jax.checkpoint(..., prevent_cse=False)``, as a scan's body and a policy
    saving dots lower): its recomputation is named by jax's name stack alone (``.../rematted_computation/...``).
    Added where the cell's side recomputes mostly what the match did not keep (a golden's text keeps no names, so
    such a remat removed is not seen: its work is named by the other kinds)."""
    recomputing = [e for e in rest if e.edit is Edit.INSERTED and RECOMPUTED in sides.origin(e)[0]]
    if not recomputing:
        return []  # (and no reading every op's name for one)
    inserted = {id(e.new) for e in match.edits if e.edit is Edit.INSERTED}
    view = sides.new
    kept = sum(1 for comp in view.module.computations.values() for instr in comp.instructions
               if id(instr) not in inserted and RECOMPUTED in view.origin(instr, comp.name)[0])
    if kept >= len(recomputing):
        # Most of it recomputed before: another policy, or work beside it (the named kinds say it). Some kept are
        # the reductions' bodies it shares and forward ops the match paired with their copies.
        return []
    work = _remat_work(rest, sides)
    _claim(match, sides, claimed, work)
    layers = _layers(recomputing, sides)
    return [Change(ChangeKind.REMAT, Action.ADDED, REMAT, sides.place(recomputing[0]), count=max(layers, 1),
                   instructions=_net(work), groups=_opcodes(work), after=_recomputed(sides), layers=layers)]


def _remat_work(rest: list[InstructionEdit], sides: Sides) -> list[InstructionEdit]:
    """What of ``rest`` is remat's: where the edits' side names their ops (a cell's lowering, a dump with metadata),
    the barriers, the instructions jax's name stack puts under a checkpoint, the recomputation (an op of the same
    opcode and name as one the program keeps: the forward op it copies) and those it names nothing (the calls'
    tuples); other work added beside it (layers added in the same edit) is left to the kinds that say it. Where no
    edit names its op (a golden's text keeps no metadata), every edit left, as before."""
    names = [sides.origin(e)[0] for e in rest]
    if not any(names):
        return rest
    # Of what went, all (remat removed takes its recomputation's loops and computations along, named as the forward
    # ones they copied were): what the cell's side added is where work beside remat shows.
    plain = {id(e) for e, name in zip(rest, names) if e.edit is Edit.DELETED or e.instruction.opcode in _BARRIERS
             or not name or under_checkpoint(name)}
    if len(plain) == len(rest):
        return rest
    mine = {id(e.instruction) for e in rest}
    kept = {(i.opcode, sides.new.origin(i, c.name)[0]) for c in sides.new.module.computations.values()
            for i in c.instructions if id(i) not in mine}
    return [e for e, name in zip(rest, names) if id(e) in plain or (e.instruction.opcode, name) in kept]


def _barriers_changed(match: ModuleMatch, claimed: set[int]) -> list[InstructionEdit]:
    """Barriers paired whose shape changed: they keep other values."""
    return [e for e in match.edits if e.edit is Edit.CHANGED and id(e) not in claimed
            and e.new.opcode in _BARRIERS and e.old.opcode in _BARRIERS and e.old.shape.text != e.new.shape.text]


def _elements(instr: Instruction) -> int:
    return len(instr.shape.elements) if instr.shape.is_tuple else 1


def _recomputed(sides: Sides) -> str:
    """``40 instructions recomputed``: the new module's instructions jax's metadata names as a checkpoint's
    recomputation, where the text or the places kept beside it say (empty otherwise)."""
    view = sides.new
    n = sum(1 for comp in view.module.computations.values() for instr in comp.instructions
            if RECOMPUTED in view.origin(instr, comp.name)[0])
    return f"{n:,} instructions recomputed" if n else ""
