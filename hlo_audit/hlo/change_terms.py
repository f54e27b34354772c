"""Kinds of change said in the model's terms, read from the program's structure (changes.py's module doc lists what
each carries); ``explain`` runs them after the dataflow kinds and before the structural ones, so that the edits
they explain are not counted again as ops, shapes or program size:

* ``conditional``: a ``conditional`` instruction removed (or added) with its branches (``lax.cond``), and where the
  other side computes the branches' work inline and selects among the results (``jnp.where`` of both branches), the
  values it selects: "replaced by computing both branches", not "program size -5%".
* ``loss_scaling``: the loss multiplied by a constant and the gradients divided by the same constant after (static
  loss scaling for low precision), removed or added: a scalar multiply by F and divides by F (the gradients', the
  loss's), with the constants jax folded F into (the backward pass's seeds, whose literals change by F).
* ``routing``: the selection a step makes (an MoE router's experts, a sampler's tokens) by another op: ``argmax``
  (a call of jax's ``argmax`` computation), ``topk`` of another ``k``, a ``sort``, with the computations those call
  and the instructions at the same source line that turn the selection into gates (``one_hot``, a sum): "routing:
  argmax x2 -> top_k (k=2) x2", not ops and computations added and removed.
* ``loss_term``: a term of the loss removed or added (an MoE load-balancing aux loss): a scalar ``add`` of a value
  both sides compute (the rest of the loss) and a value only one side computes from reductions (what reduced into
  the loss), with the term's backward pass, connected to it by edits of the same side.

A compiled module splits the model's ops across fusions by XLA's choice: each kind follows dataflow through them
(``ModuleView.inputs``, ``consumers``), takes the bodies of the fusions it names, and reads XLA's forms (argmax's
reduce of values and indices, a divide by F as a multiply by 1/F, ``jnp.where`` as fusions of selects).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hlo_audit.hlo.change_places import Sides
from hlo_audit.hlo.changes import (
    BOTH_BRANCHES,
    CONDITIONAL,
    LOSS_SCALING,
    LOSS_TERM,
    ROUTING,
    Action,
    Change,
    ChangeKind,
    Place,
)
from hlo_audit.hlo.match import Edit, InstructionEdit, ModuleMatch
from hlo_audit.hlo.normalize import computation_words
from hlo_audit.hlo.rng_flow import called_closure
from hlo_audit.hlo.text import HloModule, Instruction


def _unclaimed(match: ModuleMatch, claimed: set[int], edit: Edit) -> list[InstructionEdit]:
    return [e for e in match.edits if id(e) not in claimed and e.edit is edit]


def _called(module: HloModule, names: Sequence[str]) -> set[str]:
    """The computations ``names`` are, with every computation they call."""
    found, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name in found or name not in module.computations:
            continue
        found.add(name)
        stack.extend(c for instr in module.computations[name].instructions for c in instr.called_computations())
    return found


def _size(module: HloModule, name: str) -> int:
    return sum(len(module.computations[c].instructions) for c in _called(module, [name]))


def conditionals(match: ModuleMatch, sides: Sides, claimed: set[int]) -> list[Change]:
    """Conditionals removed or added, each with its branches' sizes, the edits in its branches and the values that
    only unpack its result; where the other side gained selects, the branches' work it now computes inline (as many
    instructions of each opcode as the branches held) and the selects: both branches computed."""
    changes = []
    for edit, action, other in ((Edit.DELETED, Action.REMOVED, Edit.INSERTED), (Edit.INSERTED, Action.ADDED,
                                                                                 Edit.DELETED)):
        view, facing = (sides.old, sides.new) if edit is Edit.DELETED else (sides.new, sides.old)
        for cond in [e for e in _unclaimed(match, claimed, edit) if e.instruction.opcode == "conditional"]:
            branches = cond.instruction.called_computations()
            inside = _called(view.module, branches)
            mine = [cond, *(e for e in _unclaimed(match, claimed, edit) if e is not cond and (
                e.computation in inside or e.computation == cond.computation and _unpacks(view, e, cond)))]
            selects = _selects(match, claimed, other, facing.module)
            claimed.update(id(e) for e in (*mine, *selects))
            # What decides: the conditional's branch index, the selects' predicate, each computed for it alone (a
            # compiled module fuses the isfinite checks apart on each side); and the state the selects read, copied.
            decided = _deciding(match, claimed, edit, view, [(cond.instruction, cond.computation, 0)])
            decided += _deciding(match, claimed, other, facing, [
                (_side_of(e, other), _on(e, other), n) for e in selects if e.instruction.opcode == "select"
                for n in (0, 1, 2)])
            claimed.update(id(e) for e in decided)
            inline = _inline(match, claimed, other, cond.computation, Counter(
                e.instruction.opcode for e in mine if e.computation in inside)) if selects else []
            claimed.update(id(e) for e in inline)
            # Compiled, the branches' work inline and the selects are fusions: their bodies are theirs.
            bodies = _bodies(match, claimed, other, facing, [*selects, *inline, *decided])
            claimed.update(id(e) for e in bodies)
            # Placed where the model writes it: the side that has the source (the cell's; a golden's has none).
            # The line most selects share (each may read its own state: their places differ by the paths they
            # read; compiled, the branches' work fused with them is elsewhere), at its most common place.
            places = Counter(p for e in selects if (p := sides.place(e)).source) if action is Action.REMOVED \
                else Counter()
            lines = Counter(p.source for e in selects if _selecting(facing.module, e) and (p := sides.place(e)).source)
            line = lines.most_common(1)[0][0] if lines else places.most_common(1)[0][0].source if places else ""
            place = next((p for p, _ in places.most_common() if p.source == line), None) or sides.place(cond)
            sign = 1 if edit is Edit.INSERTED else -1
            net = sign * (len(mine) - len(inline) - len(selects)) + sum(
                -1 if e.edit is Edit.DELETED else 1 for e in (*decided, *bodies) if e.edit is not Edit.CHANGED)
            # The values the step now selects: its selects, less those the branches held (their own work, inline).
            own = Counter(_selecting(view.module, e) for e in mine if e.computation in inside)
            found = Counter(_selecting(facing.module, e) for e in selects)
            values = (found["call"] - own["call"]) or (found["select"] - own["select"])
            changes.append(Change(
                ChangeKind.CONDITIONAL, action, CONDITIONAL, place, count=1, per_step=sides.runs(cond),
                before=f"{len(branches)} branches: " + " and ".join(
                    f"{_size(view.module, b):,}" for b in branches) + " instructions",
                after=f"{BOTH_BRANCHES}, {values:,} values selected" if selects else "", instructions=net))
    return changes


def _unpacks(view, e: InstructionEdit, cond: InstructionEdit) -> bool:
    """The edit only takes its value from the conditional (a get-tuple-element of its result, a tuple of those) or
    feeds it its predicate (a convert)."""
    reads = view.operands(e.instruction, e.computation)
    if e.instruction.opcode == "get-tuple-element":
        return any(r is cond.instruction for r in reads)
    if e.instruction.opcode == "tuple" and any(u is cond.instruction for u in view.users(e.instruction)):
        return True  # the operands packed for its branches
    if e.instruction.opcode == "tuple":
        return bool(reads) and all(r.opcode == "get-tuple-element" and any(
            o is cond.instruction for o in view.operands(r, e.computation)) for r in reads)
    return e.instruction.opcode == "convert" and any(u is cond.instruction for u in view.users(e.instruction))


def _bodies(match: ModuleMatch, claimed: set[int], edit: Edit, view,
            edits: Sequence[InstructionEdit]) -> list[InstructionEdit]:
    """The unclaimed edits of ``edit``'s side in the computations ``edits``' fusions call (and those call)."""
    called = called_closure(view.module, [c for e in edits if e.edit is edit and e.instruction.opcode == "fusion"
                                          for c in e.instruction.called_computations()
                                          if c in view.module.computations])
    return [e for e in _unclaimed(match, claimed, edit) if e.computation in called] if called else []


def _side_of(e: InstructionEdit, edit: Edit) -> Instruction:
    return e.old if edit is Edit.DELETED and e.old is not None else e.instruction


def _deciding(match: ModuleMatch, claimed: set[int], edit: Edit, view,
              starts: Sequence[tuple[Instruction, str, int]]) -> list[InstructionEdit]:
    """The unclaimed edits of ``edit``'s side that compute the operands ``starts`` name (an instruction, its
    computation, the operand's position) for them alone: through fusions (``ModuleView.inputs``), and through
    fusions paired with another that computes the same value otherwise (their bodies re-fused). The branch
    index's converts, the isfinite reductions, the state a select reads copied: the operand ``0`` of a conditional,
    ``0``-``2`` of a select; values both sides compute stop the walk."""
    alone = {id(e.instruction): e for e in _unclaimed(match, claimed, edit)}
    refused = {id(_side_of(e, edit)) for e in match.edits if e.edit is Edit.CHANGED and id(e) not in claimed
               and e.old.opcode == e.new.opcode == "fusion"}
    found: dict[int, InstructionEdit] = {}
    stack = []
    for instr, computation, n in starts:
        operands = view.inputs(instr, computation)
        stack += operands[n:n + 1]
    seen: set[int] = set()
    while stack:
        instr = stack.pop()
        if id(instr) in seen:
            continue
        seen.add(id(instr))
        mine = alone.get(id(instr))
        if mine is None and id(instr) not in refused and instr.opcode != "parameter":
            continue
        if mine is not None:
            found[id(instr)] = mine
        stack += view.inputs(instr, _on(mine, edit) if mine is not None else view.computation_of(instr))
    return list(found.values())


def _selects(match: ModuleMatch, claimed: set[int], edit: Edit, module: HloModule) -> list[InstructionEdit]:
    """Selects of the other side (``jnp.where``), inline or in computations of their own (``_where``), with the
    calls (compiled: the fusions) of those."""
    alone = _unclaimed(match, claimed, edit)
    holding = {e.computation for e in alone if e.instruction.opcode == "select"}
    holding |= {name for name, comp in module.computations.items()
                if any(i.opcode == "select" for i in comp.instructions) and len(comp.instructions) <= _WHERE_SIZE}
    return [e for e in alone if e.instruction.opcode == "select" or e.computation in holding or
            e.instruction.opcode in ("call", "fusion") and set(e.instruction.called_computations()) & holding]


_WHERE_SIZE = 8  # a jnp.where's own computation: its parameters, broadcasts and the select


def _selecting(module: HloModule, e: InstructionEdit) -> str:
    """``select`` for a select, ``call`` for a call of a ``jnp.where``'s computation, else ``""``."""
    instr = e.instruction
    if instr.opcode in ("call", "fusion") and any(i.opcode == "select" for c in instr.called_computations()
                                      if c in module.computations for i in module.computations[c].instructions):
        return "call"
    return "select" if instr.opcode == "select" else ""


def _inline(match: ModuleMatch, claimed: set[int], edit: Edit, computation: str,
            budget: Counter) -> list[InstructionEdit]:
    """The other side's edits in the conditional's computation that are the branches' work inline: of each opcode,
    at most as many as the branches held."""
    found = []
    for e in _unclaimed(match, claimed, edit):
        opcode = e.instruction.opcode
        if e.computation == computation and budget[opcode] > 0:
            budget[opcode] -= 1
            found.append(e)
    return found


def loss_scaling(match: ModuleMatch, sides: Sides, claimed: set[int]) -> list[Change]:
    """Static loss scaling removed or added (module doc): a scalar multiply by a constant F and at least two divides
    by F, inserted or deleted together."""
    changes = []
    for edit, action in ((Edit.DELETED, Action.REMOVED), (Edit.INSERTED, Action.ADDED)):
        view = sides.old if edit is Edit.DELETED else sides.new
        alone = _unclaimed(match, claimed, edit)
        by = {id(e): f for e in alone if e.instruction.opcode in ("multiply", "divide")
              and (f := _constant_operand(view, e.instruction, e.computation, e.instruction.opcode == "divide"))}
        scale = [e for e in alone
                 if e.instruction.opcode == "multiply" and id(e) in by and not e.instruction.shape.dims]
        for factor in dict.fromkeys(by[id(e)] for e in scale):
            divides = [e for e in alone if id(e) in by and e.instruction.opcode == "divide" and by[id(e)] == factor]
            if len(divides) < 2:
                # Compiled, XLA divides by a constant as a multiply by its reciprocal; a multiply by 1/F is the
                # scaling's only where the backward pass's constants changed by F too (jax folded the loss's F
                # there): a mean squared error's x2 and x0.5 are no loss scaling.
                divides = [e for e in alone if id(e) in by and _reciprocal(by[id(e)], factor)]
                if len(divides) < 2 or not _folded(match, claimed, factor, edit):
                    continue
            multiplies = [e for e in scale if by[id(e)] == factor]
            mine = [*multiplies, *divides]
            fed = {id(o) for e in mine for o in view.operands(e.instruction, e.computation)}
            carriers = [e for e in alone if e.instruction.opcode in ("constant", "broadcast", "convert")
                        and id(e.instruction) in fed]
            fed |= {id(o) for e in carriers for o in view.operands(e.instruction, e.computation)}
            carriers += [e for e in alone if e.instruction.opcode == "constant" and id(e.instruction) in fed
                         and e not in carriers]
            carriers += _fused_feeds(match, claimed, edit, view, [*mine, *carriers])
            seeds = _folded(match, claimed, factor, edit)
            claimed.update(id(e) for e in (*mine, *carriers, *seeds))
            changes.append(Change(
                ChangeKind.LOSS_SCALING, action, LOSS_SCALING, _placed(match, sides, mine, edit), count=len(divides),
                before=f"loss x{factor}, {len(divides)} values /{factor}",
                after=f"{len(seeds)} constants x{factor} folded" if seeds else "",
                # Each edit once: a fused feed's body can also be a carrier (what a compiled module fused to feed the
                # scaling), and counted twice it made the finding say more than the program shrank (-28 of -24).
                instructions=sum(map(_signed, {id(e): e for e in (*mine, *carriers)}.values()))))
    return changes


def _fused_feeds(match: ModuleMatch, claimed: set[int], edit: Edit, view,
                 edits: Sequence[InstructionEdit]) -> list[InstructionEdit]:
    """What a compiled module fused only to feed ``edits`` (``edit``'s side): their fused bodies' parameters of
    that side alone, the fusions those read that the other side has not, with their bodies; and the kept op that
    read them as another op now (the gradient's accumulation: a scatter into zeros and an add of the scaled
    result, XLA's one scatter into the sum once nothing scales it)."""
    alone = {id(e.instruction): e for e in _unclaimed(match, claimed, edit)}
    taken = {id(e.instruction) for e in edits}
    found: dict[int, InstructionEdit] = {}
    stack = [_side_of(e, edit) for e in edits]
    computations = {id(_side_of(e, edit)): _on(e, edit) for e in edits}
    while stack:
        instr = stack.pop()
        for operand in view.inputs(instr, computations[id(instr)]):
            mine = alone.get(id(operand))
            if id(operand) in taken or id(operand) in found or id(operand) in computations or \
                    operand.opcode not in ("parameter", "fusion"):
                continue
            if mine is not None:
                found[id(operand)] = mine
            computations[id(operand)] = _on(mine, edit) if mine is not None else view.computation_of(operand)
            stack.append(operand)  # through a fusion both sides keep, to what only fed it here (its zeros)
    # The fusions whose bodies went whole with them (the gradient's scaled sum), with what is left of those bodies.
    gone_with = {_on(e, edit) for e in (*edits, *found.values())}
    whole = {c for c in gone_with if all(id(i) in alone for i in view.module.computations[c].instructions)}
    for c in whole:
        for fusion, _ in view.fused_callers(c):
            if id(fusion) in alone and id(fusion) not in taken:
                found[id(fusion)] = alone[id(fusion)]
    bodies = _bodies(match, claimed, edit, view, list(found.values()))
    gone = taken | set(found)
    readers = [e for e in _unclaimed(match, claimed, Edit.CHANGED) if "opcode" in e.aspects and any(
        id(o) in gone for o in view.operands(_side_of(e, edit), _on(e, edit)))] if edit is Edit.DELETED else []
    # What the reader, made another op, reads that its computation takes in anew (the scatter's indices, updates).
    added = {id(e.new): e for e in _unclaimed(match, claimed, Edit.INSERTED) if e.new.opcode == "parameter"}
    fed = [added[id(o)] for e in readers for ref in e.new.operands
           if (o := match.new.computations[e.new_computation].by_name.get(ref)) is not None and id(o) in added]
    return [*found.values(), *bodies, *readers, *fed]


def _signed(e: InstructionEdit) -> int:
    """An instruction more (inserted), one less (deleted), or the same one changed."""
    return 1 if e.edit is Edit.INSERTED else -1 if e.edit is Edit.DELETED else 0


def _reciprocal(literal: str, factor: str) -> bool:
    a, b = _number(literal), _number(factor)
    return a is not None and b is not None and abs(a * b - 1) <= 1e-6 and abs(b) != 1


def _constant_operand(view, instr: Instruction, computation: str, second: bool) -> str | None:
    """The scalar constant (through broadcasts and converts) an operand of ``instr`` is, as its literal (a divide's
    divisor only: ``second``)."""
    operands = view.operands(instr, computation)
    for operand in operands[1:] if second else operands:
        while operand.opcode in ("broadcast", "convert", "reshape") and view.operands(operand, computation):
            operand = view.operands(operand, computation)[0]
        if operand.opcode == "constant" and not operand.shape.dims and _number(operand.literal) not in (None, 0.0):
            return operand.literal
    return None


def _folded(match: ModuleMatch, claimed: set[int], factor: str, edit: Edit) -> list[InstructionEdit]:
    """Scalar constants whose literal changed by ``factor`` (scaling removed: divided by it; added: multiplied): the
    backward pass's seeds jax folded the scale into."""
    scale = _number(factor)
    found = []
    for e in match.edits:
        if id(e) in claimed or e.edit is not Edit.CHANGED or e.new.opcode != "constant" or e.new.shape.dims:
            continue
        old, new = _number(e.old.literal), _number(e.new.literal)
        if old is None or new is None or not (old and new):
            continue
        ratio = old / new if edit is Edit.DELETED else new / old
        if abs(ratio - scale) <= 1e-6 * abs(scale):
            found.append(e)
    return found


def _number(literal: str | None) -> float | None:
    try:
        return float(literal) if literal is not None else None
    except ValueError:
        return None


def loss_terms(match: ModuleMatch, sides: Sides, claimed: set[int]) -> list[Change]:
    """Loss terms removed or added (module doc), each with the reductions that fed it, its scalar weight where it is
    multiplied by a constant last, and the edits connected to it in its computation (its backward pass)."""
    changes = []
    for edit, action in ((Edit.DELETED, Action.REMOVED), (Edit.INSERTED, Action.ADDED)):
        view = sides.old if edit is Edit.DELETED else sides.new
        for total in [e for e in _unclaimed(match, claimed, edit) if e.instruction.opcode in ("add", "subtract")
                      and not e.instruction.shape.dims and not e.instruction.shape.is_tuple]:
            if id(total) in claimed:
                continue
            # Of every computation: a compiled module's term may be fused apart from the sum (``ModuleView.inputs``).
            alone = {id(e.instruction): e for e in _unclaimed(match, claimed, edit)}
            operands = view.operands(total.instruction, total.computation)
            term = [o for o in operands if id(o) in alone]
            if len(operands) != 2 or len(term) != 1:
                continue  # a term is added to what both sides compute: one operand kept, one of this side alone
            feeding = _closure(view, alone, [alone[id(term[0])]], users=False, edit=edit)
            reductions = sum(1 for e in feeding if e.instruction.opcode == "reduce")
            if not reductions:
                continue
            # Its backward pass: the edits connected to it, through the paired ones it rewired (the cotangent
            # it added to each gradient gone: an add paired with what is left of the sum).
            rewired = {id(e.old if edit is Edit.DELETED else e.new): e for e in match.edits if id(e) not in claimed
                       and e.edit is Edit.CHANGED and set(e.aspects) <= {"operands", "opcode"}}
            mine = _closure(view, {**alone, **rewired}, [total], users=True, edit=edit)
            mine += _gradient_of_inputs(view, alone, mine, feeding, edit)
            backward = sum(1 for e in mine if e.edit is edit and e not in feeding and e is not total)
            claimed.update(id(e) for e in mine)
            weight = _constant_operand(view, term[0], total.computation, False) if term[0].opcode == "multiply" \
                else None
            place = _placed(match, sides, [total], edit)
            changes.append(Change(
                ChangeKind.LOSS_TERM, action, LOSS_TERM, place, count=1, per_step=sides.runs(total),
                before=f"{reductions} reductions" + (f", x{weight}" if weight else ""),
                after=f"{backward} instructions of its backward pass",
                instructions=(1 if edit is Edit.INSERTED else -1) * sum(1 for e in mine if e.edit is edit)))
    return changes


def _gradient_of_inputs(view, alone: dict[int, InstructionEdit], mine: list[InstructionEdit],
                        feeding: list[InstructionEdit], edit: Edit) -> list[InstructionEdit]:
    """The term's gradient with respect to what it read: the edits of this side alone that read the values the
    term's reductions read (an L2 penalty's ``2c * w`` per weight, added to each weight's gradient), with what they
    connect to. jax folds the loss's cotangent into their constants, so no dataflow edge joins them to the term's
    sum: they are found from the inputs the two share. Constants are no such input (every reduction reads one)."""
    taken = {id(e.instruction) for e in mine}
    inputs = {id(o) for e in feeding for o in view.operands(e.instruction, _on(e, edit))
              if id(o) not in alone and o.opcode not in ("constant", "iota")}
    rest = {key: e for key, e in alone.items() if key not in taken}
    starts = [e for e in rest.values() if any(id(o) in inputs for o in view.operands(e.instruction, _on(e, edit)))]
    return _closure(view, rest, starts, users=True, edit=edit) if starts else []


def _on(e: InstructionEdit, edit: Edit) -> str:
    """The edit's computation on the side of ``edit`` (a paired instruction's computations are named apart)."""
    return e.old_computation if edit is Edit.DELETED else e.new_computation


def _closure(view, alone: dict[int, InstructionEdit], start: Sequence[InstructionEdit], users: bool,
             edit: Edit = Edit.DELETED, operands: bool = True) -> list[InstructionEdit]:
    """The edits of ``alone`` (keyed by their instruction on ``edit``'s side) reachable from ``start`` through
    operands (unless not ``operands``) and users (with ``users``), ``start`` first."""
    found = {id(e.instruction): e for e in start}
    stack = [e.instruction for e in start]
    while stack:
        instr = stack.pop()
        e = found[id(instr)]
        where = _on(e, edit)
        near = [*(view.inputs(instr, where) if operands else ()), *(view.consumers(instr, where) if users else ())]
        for other in near:
            if id(other) in alone and id(other) not in found:
                found[id(other)] = alone[id(other)]
                stack.append(other)
    return list(found.values())


def _placed(match: ModuleMatch, sides: Sides, edits: Sequence[InstructionEdit], edit: Edit) -> Place:
    """Where a change is: removed (the golden's side, whose text keeps no source), at the kept instruction that read
    what was removed, placed in the cell's module (the loss now computed without a term, the gradients without the
    divide); added, at the first of its own instructions."""
    if edit is Edit.DELETED:
        gone = {id(e.instruction) for e in edits}
        for e in match.edits:
            if e.edit is Edit.CHANGED and any(id(o) in gone for o in sides.old.operands(e.old, e.old_computation)):
                return sides.place(e)
    return sides.place(edits[0])


def _selection(instr: Instruction, module: HloModule) -> str | None:
    """What an instruction selects by (``argmax``, ``top_k (k=2)``, ``sort``), or None. Compiled, jax's ``argmax``
    call is inlined: a reduce of values and their indices to the best of each (its comparator's ``GT``: argmax)."""
    if instr.opcode == "reduce" and _indexed(instr):
        compares = [i.attrs.get("direction", "") for c in instr.called_computations() if c in module.computations
                    for i in module.computations[c].instructions if i.opcode == "compare"]
        return "argmin" if "LT" in compares and "GT" not in compares else "argmax"
    if instr.opcode == "topk" or instr.opcode == "custom-call" and instr.custom_call_target == "TopK":
        k = instr.attrs.get("k", "").strip()
        leaves = instr.shape.leaves()
        if not k and leaves and leaves[0].dims:  # XLA's compiled TopK says k only by its result: [..., k]
            k = str(leaves[0].dims[-1])
        return f"top_k (k={k})" if k else "top_k"
    if instr.opcode == "sort":
        return "sort"
    if instr.opcode == "call":
        called = [computation_words(c.lstrip("%")) for c in instr.called_computations()]
        if called and called[0] in ("argmax", "argmin"):
            return called[0]
    return None


def _indexed(instr: Instruction) -> bool:
    """A reduce to a value and an integer index (argmax's, argmin's): two results, the second an integer's."""
    leaves = instr.shape.leaves() if instr.shape.is_tuple else []
    return len(leaves) == 2 and leaves[1].dtype[:1] in ("s", "u") and leaves[0].dtype[:1] in ("f", "b")


def routing(match: ModuleMatch, sides: Sides, claimed: set[int]) -> list[Change]:
    """The step's selection by another op (module doc): the selections removed and added, each side's with the
    computations they call and, on the cell's side (the golden's text keeps no source), the edits at their source
    lines that connect to them."""
    modules = {Edit.DELETED: match.old, Edit.INSERTED: match.new}
    chosen = {edit: [e for e in _unclaimed(match, claimed, edit) if _selection(e.instruction, modules[edit])]
              for edit in (Edit.DELETED, Edit.INSERTED)}
    for edit, starts in chosen.items():  # a lowered argmax's reduce is its call's (the call names it)
        inside = called_closure(modules[edit], [c for e in starts if e.instruction.opcode == "call"
                                                for c in e.instruction.called_computations()
                                                if c in modules[edit].computations])
        chosen[edit] = [e for e in starts if _on(e, edit) not in inside]
    if not any(chosen.values()):
        return []
    mine: list[InstructionEdit] = []
    for edit, starts in chosen.items():
        if not starts:
            continue
        view = sides.old if edit is Edit.DELETED else sides.new
        alone = {id(e.instruction): e for e in _unclaimed(match, claimed, edit)}
        # What turns the selection into gates (one_hot of its index), with the computations they all call; and the
        # instructions of both sides that changed as they read the gates (compiled, ``probs * one_hot(argmax)`` is
        # fused into a select that top_k's gates make a multiply), and the constants only the gates read.
        reshaped = {id(e.old if edit is Edit.DELETED else e.new): e for e in _unclaimed(match, claimed, Edit.CHANGED)
                    if not set(e.aspects) <= {"operands"}}
        taken = _closure(view, {**alone, **reshaped}, starts, users=True, edit=edit, operands=False)
        # What the selection reads that its side computes for it alone (compiled: the softmax fused into argmax's
        # reduce, a fusion of its own before top_k).
        taken += _closure(view, alone, starts, users=False, edit=edit)[len(starts):]
        taken += _constant_feeds(view, alone, taken, edit)
        called = called_closure(view.module, [c for e in taken for c in e.instruction.called_computations()
                                              if c in view.module.computations])
        taken += [e for e in alone.values() if _on(e, edit) in called]
        lines = {sides.origin(e)[1] for e in starts} - {""}
        near = {key: e for key, e in alone.items() if lines and sides.origin(e)[1] in lines}
        taken += _closure(view, near, [e for e in starts if id(e.instruction) in near], users=True, edit=edit)
        mine += {id(e): e for e in taken}.values()
    claimed.update(id(e) for e in mine)
    words = {edit: _counted([_selection(e.instruction, modules[edit]) or "" for e in starts])
             for edit, starts in chosen.items()}
    action = Action.CHANGED if all(chosen.values()) else Action.ADDED if chosen[Edit.INSERTED] else Action.REMOVED
    sample = (chosen[Edit.INSERTED] or chosen[Edit.DELETED])[0]
    net = sum(1 if e.edit is Edit.INSERTED else -1 for e in mine if e.edit is not Edit.CHANGED)
    return [Change(ChangeKind.ROUTING, action, ROUTING, sides.place(sample), count=len(chosen[sample.edit]),
                   per_step=sum(sides.runs(e) for e in chosen[sample.edit]), before=words[Edit.DELETED],
                   after=words[Edit.INSERTED], instructions=net)]


def _constant_feeds(view, alone: dict[int, InstructionEdit], taken: Sequence[InstructionEdit],
                    edit: Edit) -> list[InstructionEdit]:
    """The edits of ``alone`` that feed ``taken`` values made of constants only (an iota, a constant, their
    broadcasts): the one_hot's indices to compare with, a select's zeros."""
    found: dict[int, InstructionEdit] = {}
    have = {id(e.instruction) for e in taken}
    stack = list(taken)
    while stack:
        e = stack.pop()
        for operand in view.inputs(e.old if edit is Edit.DELETED and e.old is not None else e.instruction,
                                   _on(e, edit)):
            mine = alone.get(id(operand))
            if mine is None or id(operand) in have or id(operand) in found or \
                    not _constant_made(view, operand, _on(mine, edit)):
                continue
            found[id(operand)] = mine
            stack.append(mine)
    return list(found.values())


def _constant_made(view, instr: Instruction, computation: str) -> bool:
    if instr.opcode in ("constant", "iota"):
        return True
    operands = view.operands(instr, computation)
    return instr.opcode in ("broadcast", "reshape", "convert", "bitcast", "copy") and bool(operands) and \
        all(_constant_made(view, o, computation) for o in operands)


def _counted(names: Sequence[str]) -> str:
    """``argmax x2``, ``top_k (k=2) x2, sort``: each selection op with how many there are."""
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in Counter(names).items())
