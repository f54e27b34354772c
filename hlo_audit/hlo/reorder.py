"""Whether two matched modules are one program but for the order of their state's leaves: a rename that reorders.

Renaming a weight (``attn_out_proj`` -> ``out_proj``) moves it in the state pytree's sorted order, and jax lowers the
step in tree order: the entry parameters, the outputs (and ``input_output_alias``, ``entry_computation_layout``)
and every sum over all leaves (a global gradient norm: ``((a + b) + c) + ...``) come in another order, and so do the
computations the canonical text prints. Nothing is computed differently but for the order of one associative sum.
And linen folds a hash of each module's path into the RNG key it draws from (``make_rng``: ``fold_in(key, salt)``
with the salt a literal), so renaming a module with dropout changes those literals and nothing else: the data a call
of jax's ``fold_in`` folds in as a literal fingerprints as a salt, whatever its value.
``same_but_for_order`` holds two modules to that: a Merkle fingerprint of each side's entry (match_passes.py's, an
entry parameter fingerprinting as its pair in the match), where a chain of ``add`` of one shape is the multiset of
what it sums and the entry's root is its outputs keyed by the parameter each aliases (its pair), not by position.
"""

from __future__ import annotations

from collections import Counter

from hlo_audit.hlo.header import output_aliases
from hlo_audit.hlo.match import ModuleMatch
from hlo_audit.hlo.match_passes import MatchSide, canonical_shape
from hlo_audit.hlo.rng_flow import is_fold_in
from hlo_audit.hlo.text import Computation, HloModule


def same_but_for_order(match: ModuleMatch) -> bool:
    """Every entry parameter paired and of the same shape, and each side's entry fingerprints alike (module doc)."""
    if any(p.old is None or p.new is None or p.reshaped for p in match.params):
        return False
    old_keys = {p.old.index: ("pair", n) for n, p in enumerate(match.params)}
    new_keys = {p.new.index: ("pair", n) for n, p in enumerate(match.params)}
    return _entry_print(match.old, old_keys) == _entry_print(match.new, new_keys)


# A value as the fingerprints follow it: one array's fingerprint, or a tuple of values (what routing ops carry).
Value = int | tuple


class _Values:
    """Each instruction's value: a fingerprint of what it computes, routing (tuples, their elements, barriers,
    called and fused computations' parameters and roots) followed rather than fingerprinted, so that leaves carried in
    another order are the same values."""

    def __init__(self, module: HloModule, keys: dict[int, object]):
        self.module = module
        self.side = MatchSide(module, keys)
        self.keys = keys

    def computation(self, comp: Computation, params: list[Value] | None) -> dict[str, Value]:
        users = Counter(ref for instr in comp.instructions for ref in instr.operands)
        values: dict[str, Value] = {}
        for instr in comp.instructions:
            operands = [values.get(ref, 0) for ref in instr.operands]
            values[instr.name] = self.instruction(comp, instr, operands, params, users, values)
        return values

    def instruction(self, comp: Computation, instr, operands: list[Value], params: list[Value] | None,
                    users: Counter, values: dict[str, Value]) -> Value:
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
            callee = self.module.computations.get(instr.called_computations()[0])
            if callee is not None and is_fold_in(callee.name):
                operands = [_SALT if _literal_scalar(comp, ref) else v for ref, v in zip(instr.operands, operands)]
            if callee is not None:
                return self.computation(callee, operands)[callee.root.name]
        if op == "add":
            summed = sorted(_flat(v) for v in _summed(comp, instr, users, values))
            return hash(("add*", canonical_shape(instr.shape), tuple(summed)))
        callees = tuple(self.side.comp_fp.get(c, 0) for c in instr.called_computations())
        return hash((self.side.own[id(instr)], callees, tuple(_flat(v) for v in operands)))


_SALT = hash("fold_in salt")


def _literal_scalar(comp: Computation, ref: str) -> bool:
    operand = comp.by_name.get(ref)
    return operand is not None and operand.opcode == "constant" and not operand.shape.dims


def _wrapped(value: Value) -> Value:
    if isinstance(value, tuple):
        return tuple(_wrapped(v) for v in value)
    return hash(("barrier", value))


def _flat(value: Value) -> int:
    return hash(tuple(_flat(v) for v in value)) if isinstance(value, tuple) else value


def _entry_print(module: HloModule, keys: dict[int, object]) -> tuple:
    entry = module.entry
    values = _Values(module, keys).computation(entry, None)
    root = entry.root
    outputs: list[tuple] = []
    if root.opcode == "tuple":
        aliased = {output[0]: param for output, param in output_aliases(module.header_attrs) if len(output) == 1}
        unaliased = 0
        for position, ref in enumerate(root.operands):
            if position in aliased:
                key = keys.get(aliased[position], ("unpaired", aliased[position]))
            else:
                key, unaliased = ("output", unaliased), unaliased + 1
            outputs.append((repr(key), _flat(values.get(ref, 0))))
        outputs.sort()
    read = {ref for instr in entry.instructions for ref in instr.operands}
    unread = sorted(_flat(values[i.name]) for i in entry.instructions if i is not root and i.name not in read)
    return tuple(outputs) or _flat(values[root.name]), tuple(unread)


def _summed(comp: Computation, instr, users: Counter, values: dict[str, Value]) -> list[Value]:
    """What a chain of ``add`` of one shape sums: the operands of the adds only it reads, flattened."""
    found, stack = [], list(instr.operands)
    while stack:
        ref = stack.pop()
        operand = comp.by_name.get(ref)
        if operand is not None and operand.opcode == "add" and users[ref] == 1 and \
                operand.shape.text == instr.shape.text:
            stack.extend(operand.operands)
        else:
            found.append(values.get(ref, 0))
    return found
