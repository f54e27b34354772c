"""A value as a linear combination of others, for reorder.py's judgement that two programs differ only by the order of
their state's leaves.

A *linear region* is what a run of ``add``, ``subtract`` and ``negate``, and of ``multiply`` and ``divide`` by a scalar
literal (floats only: an integer divide truncates), computes, each op but the last read by nothing else and of the
last one's shape: a weight per value it combines (its *terms*, the operands it does not look into) and a constant it
adds (its *offset*). A reduction over a pytree's leaves in leaf order is one. A global norm sums ``((a + b) + c)``;
nanodo's metrics take a running (Welford) mean over the leaves, ``m_k = m_(k-1) * (S_(k-1) / S_k) + sum(x_k) / S_k``
(``S_k`` the sizes so far), whose literals Python computes for the order jax gives it. Leaves in another order make
another chain of other literals, and the same combination: every leaf's sum weighted ``1 / S_n``.

Weights are the exact products of the literals the region multiplies and divides by. Each literal is the rounding of
what the frontend meant (``528 / 592`` as an f32), so two chains that mean one combination can give weights that differ
by that rounding: two weights are *alike* where they differ by no more than the literals multiplied into them can make
them differ, twice the dtype's unit roundoff per literal (``2 * (k + k') * 2^-p`` relative: ``k`` and ``k'`` literals,
``p`` the significand's bits; twice: the text prints a literal in the fewest digits that read back as it, ``0.969697``,
another half unit off). Weights made of no literal (a sum's ones) are alike only when equal. Over many literals that is
a wide margin: nanodo's means at its default size (35M parameters, up to 51 literals a weight) take weights within
1.2e-5 of each other as alike, so a change of a weight smaller than that inside such a chain (a leaf counted one element
larger: 3e-8, below an f32 unit) is not seen.

``WeightIds`` numbers the weights of two modules together, alike ones as one, so that a region is the multiset of its
(term, weight number) and its offset's number, hashable. A region is also its ops, counted: leaves in another order
make another chain of the same ops, and an op more that computes the same (``x * 2 * 0.5``) is a change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from hlo_audit.hlo.shape_inference import significand_bits
from hlo_audit.hlo.text import Computation, HloModule, Instruction

_SUMS = frozenset({"add", "subtract", "negate"})
_ZERO = Fraction(0)


@dataclass(frozen=True, slots=True)
class Weight:
    """A term's weight in a region: its exact value and how many rounded literals were multiplied into it."""

    value: Fraction
    literals: int


@dataclass(frozen=True, slots=True)
class Region:
    """What one instruction computes as a linear combination: its terms (instructions of its computation, by name)
    with their weights, the constant it adds, the significand bits of its dtype (0: not a float, weights exact), and
    its ops counted by opcode (so that an op more is a change though it computes the same: ``(a + b) * 2`` is not
    ``a * 2 + b * 2``; leaves in another order make another chain of the same ops)."""

    terms: tuple[tuple[str, Weight], ...]
    offset: Weight
    precision: int
    ops: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Regions:
    """A module's linear regions: each by the instruction it ends in (its id), and the instructions inside one (their
    ids), which nothing else reads."""

    by_root: Mapping[int, Region]
    inside: frozenset[int]


def linear_regions(module: HloModule) -> Regions:
    """Every linear region of ``module`` (module doc), each by the linear op it ends in: one that no linear op of its
    shape looks into."""
    by_root: dict[int, Region] = {}
    inside: set[int] = set()
    for comp in module.computations.values():
        folded = _folded(comp)
        inside.update(id(comp.by_name[name]) for name in folded)
        for instr in comp.instructions:
            if _linear(comp, instr) and instr.name not in folded:
                by_root[id(instr)] = _region(comp, instr, folded)
    return Regions(by_root, frozenset(inside))


class WeightIds:
    """The weights of the regions of two modules numbered together (module doc): one number for a run of weights alike,
    of one precision (``_clusters``)."""

    def __init__(self, sides: Iterable[Regions]):
        found: dict[int, dict[Fraction, int]] = {}
        for regions in sides:
            for region in regions.by_root.values():
                seen = found.setdefault(region.precision, {})
                for weight in (region.offset, *(w for _, w in region.terms)):
                    seen[weight.value] = max(seen.get(weight.value, 0), weight.literals)
        clusters = [(precision, cluster) for precision, literals in found.items()
                    for cluster in _clusters(sorted(literals.items()), precision)]
        self._ids = {(precision, value): number for number, (precision, cluster) in enumerate(clusters)
                     for value in cluster}

    def __call__(self, weight: Weight, precision: int) -> int:
        return self._ids[(precision, weight.value)]


def _clusters(weights: list[tuple[Fraction, int]], precision: int) -> list[list[Fraction]]:
    """Sorted weights (value, literals) in runs, each as long as its last weight is alike its first (by the most
    literals any of them has): no two weights of a run are further apart than their literals explain, however close
    a weight is to the next (a chain of small steps makes no far weights one)."""
    runs: list[list[Fraction]] = []
    first, most = _ZERO, 0
    for value, literals in weights:
        if runs and _alike((first, max(most, literals)), (value, max(most, literals)), precision):
            runs[-1].append(value)
            most = max(most, literals)
        else:
            runs.append([value])
            first, most = value, literals
    return runs


def _alike(a: tuple[Fraction, int], b: tuple[Fraction, int], precision: int) -> bool:
    (x, k), (y, m) = a, b
    if x == y:
        return True
    if not precision or not k + m:
        return False
    return abs(x - y) <= Fraction(2 * (k + m), 2 ** precision) * max(abs(x), abs(y))


def _linear(comp: Computation, instr: Instruction) -> bool:
    """Whether ``instr`` is a linear op of an array (module doc): a sum, or a float times or over a literal."""
    if instr.shape.is_tuple or not instr.shape.dtype:
        return False
    if instr.opcode in _SUMS:
        return True
    if not significand_bits(instr.shape.dtype) or len(instr.operands) != 2:
        return False
    if instr.opcode == "multiply":
        return any(_factor(comp, ref) is not None for ref in instr.operands)
    return instr.opcode == "divide" and _factor(comp, instr.operands[1]) is not None


def _combined(comp: Computation, instr: Instruction) -> list[tuple[str, int, Fraction | None]]:
    """What a linear op combines: each operand it looks into (name), its sign, and the literal it is multiplied by
    (divided by: its inverse; None: no literal)."""
    a = instr.operands[0]
    if instr.opcode == "add":
        return [(a, 1, None), (instr.operands[1], 1, None)]
    if instr.opcode == "subtract":
        return [(a, 1, None), (instr.operands[1], -1, None)]
    if instr.opcode == "negate":
        return [(a, -1, None)]
    if instr.opcode == "divide":
        return [(a, 1, 1 / _factor(comp, instr.operands[1]))]
    factor = _factor(comp, instr.operands[1])
    if factor is not None:
        return [(a, 1, factor)]
    return [(instr.operands[1], 1, _factor(comp, a))]


def _folded(comp: Computation) -> set[str]:
    """The linear ops looked into by the one linear op that reads them, of their shape (not the root: it is read as
    what the computation gives)."""
    users = Counter(ref for instr in comp.instructions for ref in instr.operands)
    folded = set()
    for instr in comp.instructions:
        if not _linear(comp, instr):
            continue
        for ref, _, _ in _combined(comp, instr):
            operand = comp.by_name.get(ref)
            if operand is not None and users[ref] == 1 and operand is not comp.root and \
                    operand.shape.text == instr.shape.text and _linear(comp, operand):
                folded.add(ref)
    return folded


def _region(comp: Computation, root: Instruction, folded: set[str]) -> Region:
    """The terms, weights and offset of the region ``root`` ends (module doc), walked down from it."""
    terms: dict[str, list] = {}
    offset = [_ZERO, 0]
    ops: Counter[str] = Counter()
    stack: list[tuple[str, Fraction, int]] = [(root.name, Fraction(1), 0)]
    while stack:
        name, weight, literals = stack.pop()
        instr = comp.by_name.get(name)
        if instr is not None and (instr is root or name in folded):
            ops[instr.opcode] += 1
            for ref, sign, factor in _combined(comp, instr):
                stack.append((ref, sign * weight * (factor if factor is not None else 1),
                              literals + (factor is not None)))
            continue
        value = _literal(comp, instr) if instr is not None else None
        into = offset if value is not None else terms.setdefault(name, [_ZERO, 0])
        into[0] += weight * (value if value is not None else 1)
        into[1] = max(into[1], literals + (value is not None))
    return Region(tuple((name, Weight(w, k)) for name, (w, k) in terms.items()), Weight(offset[0], offset[1]),
                  significand_bits(root.shape.dtype or ""), tuple(sorted(ops.items())))


def _factor(comp: Computation, ref: str) -> Fraction | None:
    """The literal an operand is, where it is a finite one other than zero (a multiply by it is linear)."""
    instr = comp.by_name.get(ref)
    value = _literal(comp, instr) if instr is not None else None
    return value if value else None


def _literal(comp: Computation, instr: Instruction) -> Fraction | None:
    """The value of a scalar literal or of a broadcast of one, exact as the text writes it; None where ``instr`` is
    neither, or no finite number (``inf``, ``nan``, ``true``)."""
    if instr.opcode == "broadcast" and len(instr.operands) == 1:
        instr = comp.by_name.get(instr.operands[0])
        if instr is None:
            return None
    if instr.opcode != "constant" or instr.shape.dims:
        return None
    try:
        return Fraction(instr.literal.strip())
    except (ValueError, ZeroDivisionError):
        return None
