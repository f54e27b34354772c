"""Which instruction of one HLO module is which of another: a structural match, not a text diff.

Text diffs of two lowerings drown in renames: XLA numbers instructions from one module-wide counter, and even the
canonical text (normalize.py) names a value by a digest of what it computes, so a dot whose operand changed dtype
renames every value downstream of it. Matching the two programs as graphs (as XLA's own ``hlo_diff`` does) finds
what really differs: each instruction of one module is paired with at most one of the other, and what is left is
inserted, deleted or changed. Downstream instructions whose operands are each other's partners are unchanged,
whatever their names.

The steps, each narrowing what the next must look at:

1. **Entry parameters**, by state path first, then by a rename (paths that differ in one component the same way
   as others of the same shape do: ``encoderdecoderblock_0`` -> ``block_0``), then by position with the same shape,
   then by shape in order among the rest (so a renamed weight is the same parameter under another name);
2. **exact subgraphs**: every instruction gets a structural fingerprint (opcode, shape, semantic attributes, the
   fingerprints of its operands and of the computations it calls: a Merkle hash, so two instructions with one
   fingerprint compute the same thing from the same parameters). A fingerprint found once on each side pairs its
   two instructions and, through their operands, their whole subgraphs, tallest first;
3. **top-down from matched users**: the operands of a pair at the same position are paired when they have the same
   opcode (or the same arity and dims: an opcode changed in place), looking through a convert, bitcast or copy
   inserted or removed between them;
4. **bottom-up from matched operands**: an instruction is paired with the unpaired user of its operands' partners
   that has its opcode and agrees on the most operand positions;
5. what is still unpaired with the same fingerprint is paired in order (identical values, constants mostly).

Computations are matched with their callers: the entries; then the computations a pair of instructions calls
(while bodies and conditions, fusions, reducers, branches, called functions), position by position; identical
computations (same fingerprint) pair whatever calls them (a golden's canonical text prints each once, a lowering
repeats them). A computation no pair reaches is inserted or deleted with its instructions. A fused computation (a
compiled module's) is its fusion's operands by another name: its parameters pair through the partners of the
fusions' operands, not by number (an operand taken in or left out shifts every number after it), and what reads
them pairs before the roots do; two fusions are alike only where their bodies end in the same op (a dot's fusion
is no convert's), and a fusion of one convert is looked through as a convert is.

jax-free, and linear in the size of the modules but for the bottom-up step's look at users (bounded per operand):
two 32-layer unrolled llama3-8b modules (~100k instructions each) match in seconds (``scripts/bench_hlo.py``).

Here: what a match is, the entry parameters' pairs (step 1) and the edits read off the instruction pairs; the
fingerprints and steps 2 to 5 that make those pairs are match_passes.py.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from hlo_audit.hlo.kernels import is_kernel_call
from hlo_audit.hlo.match_passes import Matcher, MatchSide, canonical_shape, counted_instructions
from hlo_audit.hlo.normalize import COMMUTATIVE
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.text import Computation, HloModule, Instruction


class Edit(StrEnum):
    """What happened to an instruction between two modules."""

    INSERTED = "inserted"
    DELETED = "deleted"
    CHANGED = "changed"


class ParamMatch(StrEnum):
    """How two entry parameters were found to be the same one."""

    PATH = "path"
    RENAME = "rename"  # paths one rename apart (match_params)
    POSITION = "position"
    SHAPE = "shape"
    GRAPH = "graph"  # neither: their users were matched


@dataclass(frozen=True, slots=True)
class ParamPair:
    """An entry parameter of each side that are the same (``how``), or one side's alone (the other None)."""

    old: EntryParam | None
    new: EntryParam | None
    how: ParamMatch | None = None

    @property
    def renamed(self) -> bool:
        return self.old is not None and self.new is not None and self.old.path != self.new.path

    @property
    def reshaped(self) -> bool:
        """The same parameter with another dtype, dims or layout."""
        return self.old is not None and self.new is not None and \
            canonical_shape(self.old.shape) != canonical_shape(self.new.shape)


@dataclass(frozen=True, slots=True, eq=False)
class InstructionEdit:
    """One instruction inserted, deleted or changed; ``aspects`` say what changed: ``opcode``, ``dtype``, ``dims``,
    ``layout``, ``shape`` (a tuple's), ``literal``, ``operands`` (another value in some position), ``calls``
    (another computation), ``kernel`` (a kernel's content), or the name of an attribute that differs."""

    edit: Edit
    old: Instruction | None
    new: Instruction | None
    old_computation: str | None
    new_computation: str | None
    aspects: tuple[str, ...] = ()

    @property
    def instruction(self) -> Instruction:
        """The new side's instruction, the old one's for a deletion."""
        return self.new if self.new is not None else self.old

    @property
    def computation(self) -> str:
        return self.new_computation if self.new_computation is not None else self.old_computation


@dataclass(frozen=True, eq=False)
class ModuleMatch:
    """Two modules matched: parameter pairs, computation pairs, and every instruction that differs."""

    old: HloModule
    new: HloModule
    params: tuple[ParamPair, ...]
    computations: tuple[tuple[str | None, str | None], ...]  # (old, new); None on the side that lacks it
    edits: tuple[InstructionEdit, ...]
    instructions: tuple[int, int]  # instructions of each module, entry parameters aside
    matched: int  # instructions paired (identical computations' included), entry parameters excluded
    _partners: dict[int, Instruction] = field(default_factory=dict, repr=False)  # id(old) -> new, id(new) -> old

    def partner(self, instr: Instruction) -> Instruction | None:
        """The other side's instruction paired with ``instr`` (in computations matched instruction by instruction)."""
        return self._partners.get(id(instr))

    @property
    def computations_inserted(self) -> list[str]:
        return [new for old, new in self.computations if old is None]

    @property
    def computations_deleted(self) -> list[str]:
        return [old for old, new in self.computations if new is None]

    @property
    def unchanged(self) -> bool:
        """Nothing differs: every instruction and computation paired and the same, no parameter renamed, added,
        removed or reshaped."""
        return not self.edits and not self.computations_inserted and not self.computations_deleted and all(
            p.old is not None and p.new is not None and not p.renamed and not p.reshaped for p in self.params)

    def counts(self) -> dict[str, int]:
        counts = {edit.value: 0 for edit in Edit}
        for e in self.edits:
            counts[e.edit.value] += 1
        return counts



def match_params(old: Sequence[EntryParam], new: Sequence[EntryParam]) -> list[ParamPair]:
    """Entry parameters paired by state path, then by a rename (``_renames``), then by position with the same shape,
    then by shape in order among those left when both sides have as many of that shape; the rest alone."""
    pairs: dict[int, tuple[EntryParam, ParamMatch]] = {}  # old index -> (new, how)
    taken: set[int] = set()

    def join(p: EntryParam, q: EntryParam, how: ParamMatch) -> None:
        pairs[p.index] = (q, how)
        taken.add(q.index)

    by_path: dict[str, list[EntryParam]] = defaultdict(list)
    for p in new:
        by_path[p.path].append(p)
    for p in old:
        candidates = by_path.get(p.path)
        if candidates:
            join(p, candidates.pop(0), ParamMatch.PATH)
    for p, q in _renames([p for p in old if p.index not in pairs], [q for q in new if q.index not in taken]):
        join(p, q, ParamMatch.RENAME)
    new_at = {q.index: q for q in new}
    for p in old:
        q = new_at.get(p.index)
        if p.index not in pairs and q is not None and q.index not in taken and \
                canonical_shape(p.shape) == canonical_shape(q.shape):
            join(p, q, ParamMatch.POSITION)
    left_old: dict[str, list[EntryParam]] = defaultdict(list)
    left_new: dict[str, list[EntryParam]] = defaultdict(list)
    for p in old:
        if p.index not in pairs:
            left_old[canonical_shape(p.shape)].append(p)
    for q in new:
        if q.index not in taken:
            left_new[canonical_shape(q.shape)].append(q)
    for shape, olds in left_old.items():
        news = left_new.get(shape, [])
        if len(olds) == len(news):
            for p, q in zip(olds, news):
                join(p, q, ParamMatch.SHAPE)
    result = [ParamPair(p, pairs[p.index][0], pairs[p.index][1]) if p.index in pairs else ParamPair(p, None)
              for p in old]
    result += [ParamPair(None, q) for q in new if q.index not in taken]
    return result


def _renames(old: Sequence[EntryParam], new: Sequence[EntryParam]) -> list[tuple[EntryParam, EntryParam]]:
    """Parameters left unpaired whose paths are one rename apart: of one shape, differing in one component, in the
    way at least one other such pair differs (the text a rename changed in it, ``encoderdecoder`` dropped from
    ``encoderdecoderblock_0`` and from ``encoderdecoderblock_1`` alike), the most common rename first. A rename
    reorders the state's leaves, so by position the renamed weights of one shape pair with each other's neighbours
    (``LayerNorm_0`` with ``LayerNorm_1``, ``key`` with ``query``) and the match reads a program that is not there."""
    by_rest: dict[tuple, list[EntryParam]] = defaultdict(list)
    for q in new:
        parts = tuple(q.path.split("."))
        for k in range(len(parts) if len(parts) > 1 else 0):
            by_rest[(canonical_shape(q.shape), parts[:k], parts[k + 1:])].append(q)
    candidates = []
    for p in old:
        parts = tuple(p.path.split("."))
        for k in range(len(parts) if len(parts) > 1 else 0):
            for q in by_rest.get((canonical_shape(p.shape), parts[:k], parts[k + 1:]), ()):
                candidates.append((p, q, _changed_text(parts[k], q.path.split(".")[k])))
    votes = Counter(rename for _, _, rename in candidates)
    pairs, paired_old, paired_new = [], set(), set()
    for p, q, rename in sorted(candidates, key=lambda c: -votes[c[2]]):  # stable: the state's order among equals
        if votes[rename] > 1 and p.index not in paired_old and q.index not in paired_new:
            pairs.append((p, q))
            paired_old.add(p.index)
            paired_new.add(q.index)
    return pairs


def _changed_text(before: str, after: str) -> tuple[str, str]:
    """``encoderdecoderblock_0``, ``block_0`` -> (``encoderdecoder``, ``""``): what lies between their common prefix and
    suffix."""
    head = len(os.path.commonprefix([before, after]))
    tail = len(os.path.commonprefix([before[head:][::-1], after[head:][::-1]]))
    return before[head:len(before) - tail], after[head:len(after) - tail]


def match_modules(old: HloModule, new: HloModule, old_params: Sequence[EntryParam],
                  new_params: Sequence[EntryParam]) -> ModuleMatch:
    """Match two modules (module doc). ``old_params`` / ``new_params``: each module's entry parameters (those its
    entry computation holds: after RNG-state stripping, the kept ones)."""
    params = match_params(old_params, new_params)
    old_keys: dict[int, object] = {}
    new_keys: dict[int, object] = {}
    for n, pair in enumerate(params):
        if pair.old is not None and pair.new is not None:
            old_keys[pair.old.index] = new_keys[pair.new.index] = ("pair", n)
    old_side, new_side = MatchSide(old, old_keys), MatchSide(new, new_keys)
    matcher = Matcher(old_side, new_side)
    matcher.run()
    params = _params_paired_by_graph(params, matcher)
    sizes = (sum(map(counted_instructions, old.computations.values())),
             sum(map(counted_instructions, new.computations.values())))
    return ModuleMatch(old=old, new=new, params=tuple(params), computations=tuple(matcher.computation_pairs()),
                       edits=tuple(_edits(matcher)), instructions=sizes, matched=matcher.matched(),
                       _partners={**matcher.o2n, **matcher.n2o})


def _params_paired_by_graph(params: list[ParamPair], matcher: Matcher) -> list[ParamPair]:
    """Entry parameters left alone by match_params that the graph paired (their users matched)."""
    alone_old = {p.old.index: p for p in params if p.new is None}
    alone_new = {p.new.index: p for p in params if p.old is None}
    if not alone_old or not alone_new:
        return params
    entry_old, entry_new = matcher.old.module.entry, matcher.new.module.entry
    numbers_new = {id(q): q.parameter_number for q in entry_new.parameters}
    joined: dict[int, int] = {}
    for p in entry_old.parameters:
        q = matcher.o2n.get(id(p))
        if p.parameter_number in alone_old and q is not None and numbers_new.get(id(q)) in alone_new:
            joined[p.parameter_number] = numbers_new[id(q)]
    if not joined:
        return params
    taken = set(joined.values())
    result = []
    for pair in params:
        if pair.new is None and pair.old.index in joined:
            result.append(ParamPair(pair.old, alone_new[joined[pair.old.index]].new, ParamMatch.GRAPH))
        elif pair.old is None and pair.new.index in taken:
            continue
        else:
            result.append(pair)
    return result


def _edits(matcher: Matcher) -> list[InstructionEdit]:
    """Every instruction inserted, deleted or changed, from the pairs ``matcher`` made."""
    old, new = matcher.old, matcher.new
    edits: list[InstructionEdit] = []
    for a_name, b_name in matcher.comp_pairs.items():
        a, b = old.module.computations[a_name], new.module.computations[b_name]
        for x in a.instructions:
            if a.is_entry and x.opcode == "parameter":
                continue  # entry parameters are the parameter pairs' business
            y = matcher.o2n.get(id(x))
            if y is None:
                edits.append(InstructionEdit(Edit.DELETED, x, None, a_name, None))
                continue
            if old.fp[id(x)] == new.fp[id(y)] or _only_renamed(matcher, x, y, a, b):
                continue
            aspects = _aspects(matcher, x, y, a, b)
            if aspects:
                edits.append(InstructionEdit(Edit.CHANGED, x, y, a_name, b_name, aspects))
        for y in b.instructions:
            if id(y) not in matcher.n2o and not (b.is_entry and y.opcode == "parameter"):
                edits.append(InstructionEdit(Edit.INSERTED, None, y, None, b_name))
    for comp in old.module.computations.values():
        if not matcher.covered_old(comp.name):
            edits += [InstructionEdit(Edit.DELETED, x, None, comp.name, None) for x in comp.instructions]
    for comp in new.module.computations.values():
        if not matcher.covered_new(comp.name):
            edits += [InstructionEdit(Edit.INSERTED, None, y, None, comp.name) for y in comp.instructions]
    return edits


def _aspects(matcher: Matcher, x: Instruction, y: Instruction, a: Computation, b: Computation) -> tuple[str, ...]:
    """What differs between two paired instructions (InstructionEdit.aspects); empty when only operand names
    do (each operand is the other's partner)."""
    old, new = matcher.old, matcher.new
    aspects = []
    if x.opcode != y.opcode:
        aspects.append("opcode")
    xs, ys = x.shape, y.shape
    if canonical_shape(xs) != canonical_shape(ys):
        if xs.is_tuple or ys.is_tuple:
            aspects.append("shape")
        else:
            if xs.dtype != ys.dtype:
                aspects.append("dtype")
            if xs.dims != ys.dims:
                aspects.append("dims")
            if xs.dtype == ys.dtype and xs.dims == ys.dims:
                aspects.append("layout")
    if x.opcode == y.opcode and x.literal != y.literal and x.opcode != "parameter":
        aspects.append("literal")
    ox, oy = old.own[id(x)][2], new.own[id(y)][2]
    if ox != oy:
        dx, dy = dict(ox), dict(oy)
        for k in sorted(dx.keys() | dy.keys()):
            if dx.get(k) != dy.get(k):
                aspects.append("kernel" if k == "backend_config" and is_kernel_call(y) else k)
    if not matcher.same_callees(x.called_computations(), y.called_computations()):
        aspects.append("calls")
    partners = [matcher.o2n.get(id(u)) if u is not None else None for u in old.operands(x, a)]
    operands = new.operands(y, b)
    if x.opcode in COMMUTATIVE:
        same = sorted(map(id, partners)) == sorted(map(id, operands))
    else:
        same = len(partners) == len(operands) and all(p is o for p, o in zip(partners, operands))
    if not same:
        aspects.append("operands")
    return tuple(aspects)


def _only_renamed(matcher: Matcher, x: Instruction, y: Instruction, a: Computation, b: Computation) -> bool:
    """The common case of a pair whose fingerprints differ: the same instruction reading its partner's
    operands (something upstream changed), which is no change of its own."""
    if matcher.old.own[id(x)] != matcher.new.own[id(y)] or len(x.operands) != len(y.operands):
        return False
    if x.opcode in COMMUTATIVE or not matcher.same_callees(x.called_computations(), y.called_computations()):
        return False
    o2n, by_name = matcher.o2n, b.by_name
    for u, v in zip(x.operands, y.operands):
        operand = a.by_name.get(u)
        if operand is None or o2n.get(id(operand)) is not by_name.get(v):
            return False
    return True
