"""The ``precision`` kind: dots and convolutions paired whose precision changed, with the instructions that only follow
their dtype and the converts added or removed around them (``explain`` runs it first among the dataflow kinds).

A dot's precision is its operands' and result's types and its precision attributes; and, where those are the same on
both sides, the types its operands were rounded to on their way in: a compiler that has no bf16 dot (XLA's CPU
backend) computes a bf16 dot in f32 on operands rounded to bf16 (``convert`` to bf16 and back, in fusions of their
own), and the dot's own types say nothing of it: "the router in bf16" is then a dot of the same types reading
rounded values, not "ops: fusion +2" beside a rewired dot.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hlo_audit.hlo.change_places import Groups, ModuleView, Sides, layer_count
from hlo_audit.hlo.changes import Action, Change, ChangeKind, Place
from hlo_audit.hlo.flops import flops
from hlo_audit.hlo.match import Edit, InstructionEdit
from hlo_audit.hlo.text import Instruction

_PRECISION_OPS = frozenset({"dot", "convolution", "ragged-dot"})
_PRECISION_ATTRS = ("precision_config", "algorithm", "operand_precision", "preferred_element_type")
# Aspects of an instruction that only follows a precision change: its dtype (and so its operands' names).
_FOLLOWS_DTYPE = frozenset({"dtype", "operands", "literal"})
# Between a dot and the converts that round its operands: ops that pass the value on.
_BESIDE = frozenset({"convert", "reshape", "transpose", "bitcast", "copy", "broadcast"})
_FLOAT = re.compile(r"b?f(\d+)\w*")


def type_signature(instr: Instruction, operands: Sequence[Instruction], rounded: Sequence[str | None] = ()) -> str:
    """``bf16 x bf16 -> f32`` and the attributes that set a dot's precision; where operands were rounded
    (``rounded``: each operand's narrower type, or None), their rounded types and what they were rounded from:
    ``bf16 x bf16 -> f32 (f32 rounded to bf16)``."""
    declared = [o.shape.dtype or "tuple" for o in operands[:2]]
    rounded = (*rounded, *[None] * len(declared))[:len(declared)]
    types = " x ".join(r or d for d, r in zip(declared, rounded))
    text = f"{types} -> {instr.shape.dtype or 'tuple'}"
    extra = [f"{k}={instr.attrs[k]}" for k in _PRECISION_ATTRS if k in instr.attrs]
    extra += [f"{' and '.join(sorted({d for d, r in zip(declared, rounded) if r}))} rounded to "
              f"{' and '.join(sorted({r for r in rounded if r}))}"] if any(rounded) else []
    return text + (f" ({', '.join(extra)})" if extra else "")


def _same_dot(old: Instruction, old_operands: Sequence[Instruction], new: Instruction,
              new_operands: Sequence[Instruction], transposed: bool = False) -> bool:
    """Two paired dots of the same dims, reading operands of the same dims: the same dot, whose types may have
    changed. Of other dims they are other dots the match paired (a transpose added before one shifts the pairs):
    their types differing says nothing of precision."""
    def dims(operands: Sequence[Instruction]) -> list[tuple[int, ...]]:
        return sorted(tuple(o.shape.dims) for o in operands[:2])

    result = tuple(new.shape.dims)[::-1] if transposed else tuple(new.shape.dims)
    return tuple(old.shape.dims) == result and dims(old_operands) == dims(new_operands)


# A dot removed and one added that is it with its result transposed (``_transposed``): a pair of the precision kind's
# own, which the match cannot make (the two dots' operands are each other's only through the roundings).
_TRANSPOSED = ("transposed",)


def _transposed(edits: Sequence[InstructionEdit], sides: Sides,
                claimed: set[int]) -> dict[int, tuple[InstructionEdit, InstructionEdit]]:
    """Dots deleted and inserted in a pair of computations, of the same operands' dims, the new one's 2-d result the
    old one's transposed (compiled: XLA lays out a dot of rounded operands otherwise): each as one dot changed, by
    the id of that pair's edit, with the two edits it stands for."""
    paired = dict(c for c in sides.match.computations if None not in c)
    inserted = [e for e in edits if e.edit is Edit.INSERTED and e.new.opcode == "dot" and id(e) not in claimed
                and len(e.new.shape.dims) == 2]
    found: dict[int, tuple[InstructionEdit, InstructionEdit]] = {}
    taken: set[int] = set()
    for d in edits:
        if d.edit is not Edit.DELETED or d.old.opcode != "dot" or id(d) in claimed or len(d.old.shape.dims) != 2:
            continue
        for i in inserted:
            if id(i) in taken or paired.get(d.old_computation) != i.new_computation:
                continue
            pair = InstructionEdit(Edit.CHANGED, d.old, i.new, d.old_computation, i.new_computation, _TRANSPOSED)
            if _same_dot(d.old, sides.old.operands(d.old, d.old_computation), i.new,
                         sides.new.operands(i.new, i.new_computation), transposed=True):
                taken.add(id(i))
                found[id(pair)] = (pair, (d, i))
                break
    return found


def _precision_key(instr: Instruction, operands: Sequence[Instruction]) -> tuple:
    """What a dot's precision is: its operands' types (in either order: a transpose that swaps a dot's operands,
    ``bf16 x f32`` now ``f32 x bf16``, changes no precision), its result's, its precision attributes."""
    types = sorted(o.shape.dtype or "tuple" for o in operands[:2])
    attrs = (f"{k}={instr.attrs[k]}" for k in _PRECISION_ATTRS if k in instr.attrs)
    return (*types, instr.shape.dtype or "tuple", *attrs)


def _width(dtype: str | None) -> int | None:
    """A float type's bits (``bf16`` 16, ``f8e4m3fn`` 8); None for any other type."""
    m = _FLOAT.fullmatch(dtype or "")
    return int(m.group(1)) if m else None


def _narrows(wide: str | None, narrow: str | None) -> bool:
    """Whether a float of type ``wide`` made ``narrow`` is rounded: both floats, ``narrow`` of fewer bits (an integer
    or a predicate is no rounding of a float)."""
    bits = _width(wide), _width(narrow)
    return None not in bits and bits[1] < bits[0]


@dataclass(frozen=True)
class _Rounding:
    """How one operand of a dot reached it: the instructions it passed through on its way (ops that pass a value on,
    into the fusions that compute it, with their computations), the converts among them that narrowed a float, and
    the narrowest type they rounded it to where narrower than the operand's own (else None)."""

    walked: tuple[tuple[Instruction, str], ...]
    narrowing: tuple[tuple[Instruction, str], ...]
    type: str | None


def _rounding(view: ModuleView, operand: Instruction, computation: str) -> _Rounding:
    walked, narrowing, widened = [], [], []
    instr, comp = operand, computation
    while instr.opcode in _BESIDE or instr.opcode == "fusion" or \
            instr.opcode == "parameter" and not view.module.computations[comp].is_entry:
        walked.append((instr, comp))
        called = instr.called_computations() if instr.opcode == "fusion" else []
        if called and called[0] in view.module.computations:
            comp = called[0]
            instr = view.module.computations[comp].root
            continue
        operands = view.operands(instr, comp) if instr.opcode in _BESIDE else []
        if len(operands) != 1:
            break
        if instr.opcode == "convert" and _narrows(operands[0].shape.dtype, instr.shape.dtype):
            narrowing.append((instr, comp))
        elif instr.opcode == "convert" and _narrows(instr.shape.dtype, operands[0].shape.dtype):
            widened.append(operands[0].shape.dtype)  # computed narrow (a bf16 dot's result), read wide
        instr = operands[0]
    narrowest = min((*(i.shape.dtype for i, _ in narrowing), *widened), key=_width, default=None)
    return _Rounding(tuple(walked), tuple(narrowing),
                     narrowest if narrowest and _narrows(operand.shape.dtype, narrowest) else None)


def _roundings(view: ModuleView, instr: Instruction, computation: str) -> tuple[_Rounding, ...]:
    return tuple(_rounding(view, o, computation) for o in view.operands(instr, computation)[:2])


def _seeds(edits: Sequence[InstructionEdit], sides: Sides) -> list[tuple[InstructionEdit, str, str, tuple]]:
    """The dots paired whose precision changed: (edit, its signature before, after, each side's roundings where
    they are what changed, else ``()``)."""
    seeds = []
    for e in edits:
        if e.edit is not Edit.CHANGED or e.old.opcode not in _PRECISION_OPS or e.new.opcode != e.old.opcode:
            continue
        old_operands = sides.old.operands(e.old, e.old_computation)
        new_operands = sides.new.operands(e.new, e.new_computation)
        if not _same_dot(e.old, old_operands, e.new, new_operands, e.aspects == _TRANSPOSED):
            continue
        if _precision_key(e.old, old_operands) != _precision_key(e.new, new_operands):
            seeds.append((e, type_signature(e.old, old_operands), type_signature(e.new, new_operands), ()))
            continue
        rounded = (_roundings(sides.old, e.old, e.old_computation), _roundings(sides.new, e.new, e.new_computation))
        old_types, new_types = ([r.type for r in side] for side in rounded)
        if sorted(map(str, old_types)) != sorted(map(str, new_types)):
            seeds.append((e, type_signature(e.old, old_operands, old_types),
                          type_signature(e.new, new_operands, new_types), rounded))
    return seeds


def _claim_rounding(rounded: tuple, edits: Sequence[InstructionEdit], claimed: set[int]) -> int:
    """The instructions a dot's operands passed through that came (or went) with their rounding, claimed: the
    converts among them (+ added, - removed)."""
    inserted = {id(e.new): e for e in edits if e.edit is Edit.INSERTED}
    deleted = {id(e.old): e for e in edits if e.edit is Edit.DELETED}
    converts = 0
    for side, alone, sign in ((rounded[0], deleted, -1), (rounded[1], inserted, 1)):
        for walked in (r.walked for r in side):
            for instr, _ in walked:
                edit = alone.get(id(instr))
                if edit is not None and id(edit) not in claimed:
                    claimed.add(id(edit))
                    converts += sign * (instr.opcode == "convert")
    return converts


def precision(edits: Sequence[InstructionEdit], sides: Sides, claimed: set[int]) -> list[Change]:
    """Dots and convolutions paired whose precision changed (module doc); with each, the instructions around it
    whose only change is to follow its dtype, the converts added or removed among them and among what rounds its
    operands; the FLOPs that moved. A dot the program places nowhere (a compiled dot without metadata) is placed
    at the converts that round its operands."""
    transposed = _transposed(edits, sides, claimed)
    seeds = _seeds([*edits, *(pair for pair, _ in transposed.values())], sides)
    if not seeds:
        return []
    claimed.update(id(e) for seed, *_ in seeds if id(seed) in transposed for e in transposed[id(seed)][1])
    changed_new = {id(e.new): e for e in edits if e.edit is Edit.CHANGED}
    changed_old = {id(e.old): e for e in edits if e.edit is Edit.CHANGED}
    inserted = {id(e.new): e for e in edits if e.edit is Edit.INSERTED}
    deleted = {id(e.old): e for e in edits if e.edit is Edit.DELETED}
    claimed.update(id(e) for e, *_ in seeds)
    groups = Groups()
    for e, before, after, rounded in seeds:
        rounding = _claim_rounding(rounded, edits, claimed) if rounded else 0
        followers, converts = _follow_dtype(e, sides, claimed, changed_new, changed_old, inserted, deleted)
        operands = sides.new.operands(e.new, e.new_computation)
        runs = sides.new.executions(e.new_computation)
        place = sides.new.place(e.new, e.new_computation)
        if rounded:
            place = _rounding_place(place, sides, rounded)
        groups.add((e.new.opcode, before, after, place.computation), place, runs, sides.layers(e),
                   flops=flops(e.new, operands) * runs, converts=converts + rounding, **followers)
    changes = []
    for (opcode, before, after, _), g, place in groups.items():
        sums = g["sums"]
        follow = tuple(sorted(((op, n) for op, n in sums.items() if op not in ("flops", "converts") and n),
                              key=lambda kv: (-kv[1], kv[0])))
        changes.append(Change(ChangeKind.PRECISION, Action.CHANGED, opcode, place, count=g["count"],
                              per_step=g["runs"], before=before, after=after, flops=sums["flops"],
                              instructions=sums["converts"], groups=follow, layers=layer_count(g["layers"])))
    return changes


def _rounding_place(place: Place, sides: Sides, rounded: tuple) -> Place:
    """``place`` with the state its operands read before their rounding (a fusion's operands, which the dot's own
    reads do not pass), and where it has no source, the op_name and source of the first convert that rounds them
    (the new side's, else the old side's) that has one."""
    views = ((sides.new, rounded[1]), (sides.old, rounded[0]))
    paths = {p for view, side in views for r in side for instr, comp in r.walked[:1]
             for p in view.place(instr, comp).paths}
    place = replace(place, paths=tuple(sorted(paths | set(place.paths))))
    for view, side in views if not place.source or place.near else ():
        for instr, computation in (n for r in side for n in r.narrowing):
            rounding = view.place(instr, computation)
            if rounding.source and not rounding.near:
                return replace(place, op_name=rounding.op_name, source=rounding.source, near=False)
    return place


def _follow_dtype(seed: InstructionEdit, sides: Sides, claimed: set[int], changed_new: dict, changed_old: dict,
                  inserted: dict, deleted: dict) -> tuple[Counter, int]:
    """From a dot whose precision changed, the edits connected to it that only follow its dtype (by opcode), the
    converts added (+) or removed (-) among and beside them, and the instructions that only read from those
    (rewired: a loop's initial tuple reading the value a removed convert made)."""
    followers: Counter = Counter()
    converts = 0
    region: set[int] = {id(seed)}
    for module, start, computation, changed, alone, sign in (
            (sides.new, seed.new, seed.new_computation, changed_new, inserted, 1),
            (sides.old, seed.old, seed.old_computation, changed_old, deleted, -1)):
        # Through fusions (``ModuleView.inputs``): compiled, a dot's converts and the values that follow its dtype
        # are fusions of their own, their parameters the fusions' operands.
        stack = [(start, computation)]
        seen = {id(start)}
        while stack:
            instr, where = stack.pop()
            for neighbour in (*module.inputs(instr, where), *module.consumers(instr, where), *_carried(module, instr)):
                key = id(neighbour)
                if key in seen:
                    continue
                seen.add(key)
                edit = changed.get(key)
                at = module.computation_of(neighbour)
                if edit is not None and id(edit) in region:
                    stack.append((neighbour, at))  # met from the other side already
                elif edit is not None and id(edit) not in claimed and edit.old.opcode not in _PRECISION_OPS and \
                        (_follows(edit) or seed.aspects == _TRANSPOSED and _reversed(edit)):
                    claimed.add(id(edit))
                    region.add(id(edit))
                    typed = not set(edit.aspects) <= {"operands", "literal"}
                    followers[edit.new.opcode if typed else "rewired"] += 1
                    if typed:
                        stack.append((neighbour, at))
                elif (edit := alone.get(key)) is not None and id(edit) not in claimed and \
                        _converts(module, neighbour):
                    claimed.add(id(edit))
                    region.add(id(edit))
                    converts += sign * (neighbour.opcode == "convert")
                    stack.append((neighbour, at))
    return followers, converts


def _carried(module: ModuleView, instr: Instruction) -> list[Instruction]:
    """A loop body's parameter: the tuple its loop starts from (a value the loop carries in another type, converted
    before it)."""
    if instr.opcode != "parameter":
        return []
    computation = module.computation_of(instr)
    return [operand for comp in module.module.computations.values() for w in comp.instructions
            if w.opcode == "while" and computation in w.called_computations()
            for operand in module.operands(w, comp.name)]


def _follows(edit: InstructionEdit) -> bool:
    """An instruction whose only change is to follow a dtype: its own, or (a loop carrying the value, a tuple of
    it) its tuple's elements' types (the same elements' dims, XLA free to reorder them), the element it takes
    renumbered with them."""
    aspects = set(edit.aspects)
    if aspects <= _FOLLOWS_DTYPE:
        return True
    if "shape" in aspects:
        old, new = edit.old.shape.leaves(), edit.new.shape.leaves()
        return aspects <= _FOLLOWS_DTYPE | {"shape"} and sorted(a.dims for a in old) == sorted(b.dims for b in new)
    return "dtype" in aspects and aspects <= _FOLLOWS_DTYPE | {"index"}


def _reversed(edit: InstructionEdit) -> bool:
    """An instruction of a transposed dot's (``_transposed``) values, transposed with it: its 2-d dims reversed."""
    old, new = tuple(edit.old.shape.dims), tuple(edit.new.shape.dims)
    return set(edit.aspects) <= {"dims", "operands"} and len(old) == 2 and old == new[::-1]


def _converts(module: ModuleView, instr: Instruction) -> bool:
    """A convert, a fusion of converts (compiled: ``wrapped_convert``), or a fused body's parameter: what passes a
    value on in another type."""
    if instr.opcode == "fusion":
        body = module.module.computations.get(next(iter(instr.called_computations()), ""))
        return body is not None and all(i.opcode in ("parameter", "convert", "bitcast") for i in body.instructions)
    return instr.opcode in ("convert", "parameter", "bitcast", "transpose", "copy")
