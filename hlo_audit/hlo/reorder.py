"""Whether two matched modules are one program but for their parameters' names and the order of their state's leaves:
what ``renamed-only`` means.

Renaming a weight (``attn_out_proj`` -> ``out_proj``) or reordering a dataclass's fields moves leaves in the state
pytree's order, and jax lowers the step in tree order: the entry parameters, the outputs (and ``input_output_alias``,
``entry_computation_layout``), the state a scanned stack's loop carries, and every sum over all leaves (a global
gradient norm: ``((a + b) + c) + ...``) come in another order, and so do the computations the canonical text prints.
Nothing is computed differently but for the order of one associative sum. ``same_program`` holds two modules to that
on a canonical form that no leaf order reaches: a value-numbering of each side's entry (match_passes.py's
fingerprints, an entry parameter numbering as its pair in the match), where

* routing is followed, not numbered: tuples, their elements, barriers, called and fused computations' parameters and
  roots, conditional branches;
* a ``while`` loop's state is numbered element by element from what each element starts as and what the body makes
  of it (the other elements read by number, refined until the numbering is stable: Weisfeiler-Lehman), never by its
  position in the loop's tuple;
* a linear region (a run of adds, subtracts, negations, multiplies and divides by a literal: linear_forms.py) is the
  multiset of the values it combines, each with its weight: a sum over the leaves (a global norm) or a running mean
  over them (nanodo's metrics: ``m * (S / S') + sum(x) / S'``, literals computed for the order of the leaves) in
  another order is the same combination, its weights alike as far as the literals' rounding explains;
* the entry's outputs are keyed by the parameter each aliases (its pair), the others counted as a multiset.

RNG derivation is part of the program (issue 37 item 5): every ``fold_in``, split and draw numbers as what it is.
Only the literal data folded into a key by jax's ``fold_in`` (a *salt*) may differ, and only as a rename explains
it: linen folds a hash of each module's path into the key each ``Dropout`` draws from, so a renamed module folds
other literals. Salts are then compared by what each one reaches (the entry numbered with that salt alone told
apart): the old and new salts must correspond one to one. Two salts that become one (two layers now drawing one
mask: ``11, 22 -> 11, 11``), or one that splits, is an RNG change (``Sameness.RNG``), not a rename.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from hlo_audit.hlo.changes import RNG_DERIVATION, Action, Change, ChangeKind
from hlo_audit.hlo.header import output_aliases, position_entries
from hlo_audit.hlo.linear_forms import Region, Regions, WeightIds, linear_regions
from hlo_audit.hlo.match import ModuleMatch, ParamPair
from hlo_audit.hlo.match_passes import MatchSide, canonical_shape
from hlo_audit.hlo.rng_flow import is_fold_in, random_computations
from hlo_audit.hlo.text import Computation, HloModule, Instruction

# A value as the numbering follows it: one array's number, or a tuple of values (what routing ops carry).
Value = int | tuple
# A salt: the literal's dtype and text.
Salt = tuple[str, str]
# How salts number: one function of the salt (all alike, each by its value, one told apart, by a label).
SaltNumbers = Callable[[Salt], int]

# A while loop's state is renumbered at most this many times (each round tells apart what the last one could).
_LOOP_ROUNDS = 6
_SALT = hash("fold_in salt")
# What separates the words and numbers of a header attribute that enumerates positions.
_POSITION_TOKENS = re.compile(r"[\s,;:{}()\[\]=\"]+")


class Sameness(StrEnum):
    """Two modules, their parameters paired: the same program, the same but for salts a rename does not explain,
    or different."""

    SAME = "same"
    RNG = "rng"  # the same once RNG derivation is set aside: salts that a rename does not explain, RNG ops moved
    DIFFERENT = "different"


def same_program(old: HloModule, new: HloModule, pairs: Sequence[tuple[int, int]],
                 salts_may_differ: bool) -> Sameness:
    """Whether ``old`` and ``new`` are one program when the entry parameters numbered ``pairs`` (old, new) are the
    same one, whatever the order of leaves (module doc). ``salts_may_differ``: whether the salts folded into keys
    may differ as a one-to-one correspondence (parameters were renamed); else they must be the same."""
    old_regions, new_regions = linear_regions(old), linear_regions(new)
    weights = WeightIds((old_regions, new_regions))
    old_side = _Side(MatchSide(old, {o: ("pair", n) for n, (o, _) in enumerate(pairs)}), old_regions, weights)
    new_side = _Side(MatchSide(new, {q: ("pair", n) for n, (_, q) in enumerate(pairs)}), new_regions, weights)

    def prints(salt: SaltNumbers | tuple[SaltNumbers, SaltNumbers]) -> tuple[tuple, tuple]:
        a, b = salt if isinstance(salt, tuple) else (salt, salt)
        return _entry_print(old_side, a), _entry_print(new_side, b)

    before, after = prints(lambda s: _SALT)
    if before != after:
        return Sameness.DIFFERENT
    before, after = prints(lambda s: hash(("salt", s)))
    if before == after:
        return Sameness.SAME
    if not salts_may_differ:
        return Sameness.RNG
    old_labels, new_labels = _salt_labels(old_side), _salt_labels(new_side)
    if old_labels is None or new_labels is None or sorted(old_labels.values()) != sorted(new_labels.values()):
        return Sameness.RNG
    before, after = prints((lambda s: old_labels[s], lambda s: new_labels[s]))
    return Sameness.SAME if before == after else Sameness.RNG


def fold_in_salts(module: HloModule) -> list[Salt]:
    """The salts a module folds into keys, one per ``fold_in`` call reading a literal, in the text's order."""
    found = []
    for comp in module.computations.values():
        for instr in comp.instructions:
            if _calls_fold_in(module, instr):
                found += [s for s in (_salt(comp, ref) for ref in instr.operands) if s is not None]
    return found


def rng_derivation(old: HloModule, new: HloModule) -> Change:
    """The RNG derivation that differs where the rest is a rename (``Sameness.RNG``), in numbers: ``fold_in`` calls
    and the salts they fold, and the other calls of jax.random's functions (splits, draws)."""
    return Change(ChangeKind.INSTRUCTIONS, Action.CHANGED, RNG_DERIVATION, count=_random_calls(new)[0],
                  before=_derivation(old), after=_derivation(new))


def reordered(pairs: Sequence[ParamPair]) -> list[ParamPair]:
    """The paired entry parameters whose place among the pairs differs between the sides (numbers with gaps, as
    RNG-state stripping leaves them, are places all the same)."""
    both = [p for p in pairs if p.old is not None and p.new is not None]
    old_rank = {p.old.index: n for n, p in enumerate(sorted(both, key=lambda p: p.old.index))}
    new_rank = {p.new.index: n for n, p in enumerate(sorted(both, key=lambda p: p.new.index))}
    return [p for p in both if old_rank[p.old.index] != new_rank[p.new.index]]


def reorders(match: ModuleMatch) -> list[Change]:
    """Entry parameters paired at another place, none renamed (a field reorder): one change, by path pattern."""
    moved = Counter(p.new.pattern for p in reordered(match.params))
    if not moved:
        return []
    return [Change(ChangeKind.RENAME, Action.CHANGED, "order", count=sum(moved.values()), before="leaf order",
                   after="another order", groups=tuple(moved.most_common()))]


_SALTS_SHOWN = 8


def _derivation(module: HloModule) -> str:
    """``fold_in x4 (salts 11, 11, 22, 22), other jax.random calls 6``"""
    calls, others = _random_calls(module)
    salts = sorted(literal for _, literal in fold_in_salts(module))
    shown = ", ".join(salts[:_SALTS_SHOWN]) + (f" (+{len(salts) - _SALTS_SHOWN} more)" if len(salts) > _SALTS_SHOWN
                                                else "")
    text = f"fold_in x{calls - others}" + (f" (salts {shown}; {len(set(salts))} distinct)" if salts else "")
    return f"{text}, other jax.random calls {others}"


def _random_calls(module: HloModule) -> tuple[int, int]:
    """Calls of jax.random's functions from outside them, and how many of those are not ``fold_in``."""
    inside = random_computations(module)
    calls = others = 0
    for comp in module.computations.values():
        if comp.name in inside:
            continue
        for instr in comp.instructions:
            called = [c for c in instr.called_computations() if c in inside]
            if instr.opcode in ("call", "fusion") and called:
                calls += 1
                others += not is_fold_in(called[0])
    return calls, others


@dataclass(frozen=True)
class _Side:
    """One module as the numbering reads it: the match's view of it (fingerprints, its parameters' pairs) and its
    linear regions, their weights numbered with the other module's."""

    match: MatchSide
    regions: Regions
    weights: WeightIds

    @property
    def module(self) -> HloModule:
        return self.match.module


def _salt_labels(side: _Side) -> dict[Salt, int] | None:
    """Each salt's label: the entry numbered with that salt alone told apart from the others (what it reaches), or
    None where two salts reach alike (they could not be told apart on the other side either)."""
    salts = sorted(set(fold_in_salts(side.module)))
    labels = {s: hash(_entry_print(side, lambda t, s=s: hash(("marked",)) if t == s else _SALT))
              for s in salts}
    return labels if len(set(labels.values())) == len(labels) else None


def _calls_fold_in(module: HloModule, instr: Instruction) -> bool:
    if instr.opcode not in ("call", "fusion"):
        return False
    called = instr.called_computations()
    return len(called) == 1 and called[0] in module.computations and is_fold_in(called[0])


def _salt(comp: Computation, ref: str) -> Salt | None:
    operand = comp.by_name.get(ref)
    if operand is None or operand.opcode != "constant" or operand.shape.dims:
        return None
    return operand.shape.dtype or "", operand.literal or ""


class _Values:
    """Each instruction's value number (module doc): what it computes, routing followed rather than numbered, so
    that leaves carried in another order are the same values."""

    def __init__(self, side: _Side, salts: SaltNumbers):
        self.module = side.module
        self.side = side.match
        self.regions = side.regions
        self.weights = side.weights
        self.keys = side.match.param_keys
        self.salts = salts

    def computation(self, comp: Computation, params: list[Value] | None) -> dict[str, Value]:
        values: dict[str, Value] = {}
        for instr in comp.instructions:
            operands = [values.get(ref, 0) for ref in instr.operands]
            values[instr.name] = self.instruction(comp, instr, operands, params, values)
        return values

    def called(self, name: str | None, args: list[Value]) -> Value | None:
        callee = self.module.computations.get(name) if name else None
        return None if callee is None else self.computation(callee, args)[callee.root.name]

    def instruction(self, comp: Computation, instr: Instruction, operands: list[Value], params: list[Value] | None,
                    values: dict[str, Value]) -> Value:
        op = instr.opcode
        if op == "parameter":
            number = instr.parameter_number
            if params is None:  # the entry's: its pair in the match
                return hash(repr(self.keys.get(number, ("unpaired", number))))
            return params[number] if number is not None and number < len(params) else 0
        if op == "tuple":
            return tuple(operands)
        if op in ("opt-barrier", "optimization-barrier") and len(operands) == 1:
            return _wrapped(operands[0])
        if op == "get-tuple-element" and operands and isinstance(operands[0], tuple):
            index = int(instr.attrs.get("index", -1))
            return operands[0][index] if 0 <= index < len(operands[0]) else 0
        if op in ("call", "fusion") and len(instr.called_computations()) == 1:
            if _calls_fold_in(self.module, instr):
                operands = [self._salted(comp, ref, v) for ref, v in zip(instr.operands, operands)]
            value = self.called(instr.called_computations()[0], operands)
            if value is not None:
                return value
        if op == "while" and len(operands) == 1:
            value = self._loop(instr, operands[0])
            if value is not None:
                return value
        if op == "conditional" and len(operands) >= 2:
            value = self._branches(instr, operands)
            if value is not None:
                return value
        region = self.regions.by_root.get(id(instr))
        if region is not None:
            return self._combination(instr, region, values)
        if id(instr) in self.regions.inside:  # read only by its region's last op, which looks into it
            return hash(("inside a linear region", self.side.own[id(instr)]))
        callees = tuple(self.side.comp_fp.get(c, 0) for c in instr.called_computations())
        return hash((self.side.own[id(instr)], callees, tuple(_flat(v) for v in operands)))

    def _combination(self, instr: Instruction, region: Region, values: dict[str, Value]) -> int:
        """A linear region's value (module doc): its ops, the multiset of its terms' values with their weights'
        numbers, and its offset's."""
        weight = self.weights
        terms = sorted((_flat(values.get(name, 0)), weight(w, region.precision)) for name, w in region.terms)
        return hash(("linear", canonical_shape(instr.shape), region.ops, tuple(terms),
                     weight(region.offset, region.precision)))

    def _salted(self, comp: Computation, ref: str, value: Value) -> Value:
        salt = _salt(comp, ref)
        return value if salt is None else self.salts(salt)

    def _loop(self, instr: Instruction, state: Value) -> Value | None:
        """A while loop's results, element by element (module doc); None where its state is no tuple."""
        body, condition = instr.attrs.get("body", "").lstrip("%"), instr.attrs.get("condition", "").lstrip("%")
        if not isinstance(state, tuple) or body not in self.module.computations:
            return None
        starts = [_flat(v) for v in state]
        labels = [hash(("loop state", s)) for s in starts]
        for _ in range(_LOOP_ROUNDS):
            out = self.called(body, [tuple(labels)])
            if not isinstance(out, tuple) or len(out) != len(labels):
                return None
            refined = [hash(("loop state", s, _flat(o))) for s, o in zip(starts, out)]
            stable = len(set(refined)) == len(set(labels))
            labels = refined
            if stable:
                break
        test = self.called(condition, [tuple(labels)])
        loop = (self.side.own[id(instr)][2], _flat(test) if test is not None else 0)
        return tuple(hash(("while", loop, label)) for label in labels)

    def _branches(self, instr: Instruction, operands: list[Value]) -> Value | None:
        """A conditional's results: each branch run on its operand, element by element where they are tuples."""
        names = instr.called_computations()
        if len(names) != len(operands) - 1:
            return None
        results = [self.called(name, [arg]) for name, arg in zip(names, operands[1:])]
        if any(r is None for r in results):
            return None
        selector = (self.side.own[id(instr)][2], _flat(operands[0]))
        if all(isinstance(r, tuple) and len(r) == len(results[0]) for r in results):
            return tuple(hash(("branches", selector, tuple(_flat(e) for e in column))) for column in zip(*results))
        return hash(("branches", selector, tuple(_flat(r) for r in results)))


def _wrapped(value: Value) -> Value:
    if isinstance(value, tuple):
        return tuple(_wrapped(v) for v in value)
    return hash(("barrier", value))


def _flat(value: Value) -> int:
    return hash(tuple(_flat(v) for v in value)) if isinstance(value, tuple) else value


def _entry_print(side: _Side, salts: SaltNumbers) -> tuple:
    """The entry numbered (``_Values``): its outputs keyed by the parameter each aliases, and what nothing reads."""
    module, keys = side.module, side.match.param_keys
    entry = module.entry
    values = _Values(side, salts).computation(entry, None)
    root = entry.root
    outputs: list[tuple] = []
    if root.opcode == "tuple":
        # The header numbers parameters among those the entry has (RNG-state stripping keeps the others' numbers).
        numbers = sorted(p.parameter_number for p in entry.parameters)
        aliased = {output[0]: numbers[param] for output, param in output_aliases(module.header_attrs)
                   if len(output) == 1 and param < len(numbers)}
        for position, ref in enumerate(root.operands):
            key = keys.get(aliased[position], ("unpaired", aliased[position])) if position in aliased else "output"
            outputs.append((repr(key), _flat(values.get(ref, 0))))
        outputs.sort()
    read = {ref for instr in entry.instructions for ref in instr.operands}
    unread = sorted(_flat(values[i.name]) for i in entry.instructions if i is not root and i.name not in read)
    return tuple(outputs) or _flat(values[root.name]), tuple(unread), _header_print(module.header_attrs)


def _header_print(header: Mapping[str, str]) -> tuple:
    """The module's attributes as no order of parameters and outputs reaches them: one that enumerates positions
    (aliases, layouts, per-argument flags) as the multiset of its words and numbers (a position moved keeps them; an
    alias made ``must-alias``, a flag turned, a layout changed does not), any other as it is."""
    printed = []
    for key, value in sorted(header.items()):
        if position_entries(key, value) is None:
            printed.append((key, value))
        else:
            printed.append((key, tuple(sorted(t for t in _POSITION_TOKENS.split(value) if t))))
    return tuple(printed)
