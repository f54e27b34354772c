"""RNG state in a module: which values only keep the books on it, and the module without them.

An NNX Rngs stream is a (key u32[2], count u32[]) pair of entry parameters. A step pays for it whether it draws
or not: the key flows through sharding custom calls to the outputs, the count is incremented and returned, and
where the step draws, the key is folded with the count into the bits a mask or a quantizer reads.
``strip_rng_state`` removes exactly that: the RNG parameters and every value computed from RNG state (and
constants) alone, wherever it goes. Where such a value enters a computation that is not RNG state (the bits into
a ``select``, the state into TE's quantizer), the operand reads ``RNG_VALUE``. Two modules whose stripped forms
normalize to the same text differ by RNG state only: the seed-000 review statement ("the only difference is the
dropped u32 RNG arrays and the renumbering that follows") as a check, and seed 001's (one shared stream instead of
one per quantizer: other keys, the same program).

RNG state goes through tuples on its way: every construct that passes values through unchanged or into a called
computation holds it beside the program's data. Measured on MaxText 0.2.5 llama3-8b te_nvfp4_no_rht, unrolled:
every layer is rematerialized, so its backward pass reads the layer's inputs back from an ``opt-barrier`` tuple,
seven streams' keys and counts among them (seed 001 leaves one). So values are followed per tuple element, through
``tuple`` / ``get-tuple-element``, ``opt-barrier``, ``while`` loop state (to a fixed point over the body),
``conditional`` branch operands and results, ``call`` parameters and results, asynchronous ``*-start`` / ``*-done``
pairs and pass-through custom calls; each of those loses its RNG elements, and a called computation loses the
parameters and results that carry them. A computation called where its arguments differ in what is RNG state is
stripped once per way (a copy each). Computations that only RNG state called go with it.

Each array value is one of three kinds: computed from constants only (``CONST``: the literals, iotas, a loop's
counter), from RNG state and constants (``RNG``), or from the program's other inputs (``DATA``). Control does not
count: a stream's count advanced in a branch or a data-dependent loop is still RNG state only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from hlo_audit.hlo.effects import has_side_effect
from hlo_audit.hlo.header import KeptPositions, drop_positions
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.rng_flow import IDENTITY_OPCODES, PASS_THROUGH_CUSTOM_CALLS
from hlo_audit.hlo.shapes import Shape, split_top_level, tuple_shape
from hlo_audit.hlo.text import COMPUTATION_ATTRS, Computation, HloModule, Instruction, split_name_list

# Stands in for an operand computed from RNG state alone (a drawn key, say) once that is stripped.
RNG_VALUE = "rng_value"

_MESH_DECLARATION = re.compile(r"(\w+) = #sdy\.mesh<")

CONST, RNG, DATA = 0, 1, 2  # what a value is computed from; joining two takes the larger
# Values that depend on no input at all.
_CONSTANT_SOURCES = frozenset({"constant", "iota", "partition-id", "replica-id", "after-all"})
# Values the program reads from outside its parameters (a device's RNG state, a host's feed).
_DATA_SOURCES = frozenset({"rng-get-and-update-state", "rng", "infeed", "recv", "recv-done"})

# A value's kinds: an int (CONST, RNG, DATA) for an array, a tuple of them for a tuple.
Kinds = int | tuple


def _fill(shape: Shape, kind: int) -> Kinds:
    return tuple(_fill(e, kind) for e in shape.elements) if shape.is_tuple else kind


def _joined(kinds: Kinds) -> int:
    """The largest kind of any element (CONST for an empty tuple)."""
    if isinstance(kinds, tuple):
        return max(map(_joined, kinds), default=CONST)
    return kinds


def _join(a: Kinds, b: Kinds) -> Kinds:
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return tuple(_join(x, y) for x, y in zip(a, b))
    if isinstance(a, tuple) or isinstance(b, tuple):  # shapes disagree: everything joins
        return _settle(_fill_like(a if isinstance(a, tuple) else b, max(_joined(a), _joined(b))))
    return max(a, b)


def _fill_like(kinds: Kinds, kind: int) -> Kinds:
    return tuple(_fill_like(e, kind) for e in kinds) if isinstance(kinds, tuple) else kind


def _settle(kinds: Kinds) -> Kinds:
    """A tuple that holds RNG state and constants only is RNG state as a whole (its loop counter with it)."""
    if not isinstance(kinds, tuple):
        return kinds
    settled = tuple(_settle(e) for e in kinds)
    return _fill_like(settled, RNG) if _joined(settled) == RNG else settled


def is_rng_state(kinds: Kinds) -> bool:
    """Whether a value is RNG state: computed from RNG state and constants, and from RNG state at all."""
    return _joined(kinds) == RNG


def _kept(kinds: tuple) -> list[int]:
    """The elements of a tuple value that stay when RNG state goes."""
    return [i for i, e in enumerate(kinds) if not is_rng_state(e)]


def _stripped_shape(shape: Shape, kinds: Kinds) -> Shape:
    if not shape.is_tuple or not isinstance(kinds, tuple) or not any(map(_has_rng_state, kinds)):
        return shape
    return tuple_shape([_stripped_shape(shape.elements[i], kinds[i]) for i in _kept(kinds)])


def _has_rng_state(kinds: Kinds) -> bool:
    if isinstance(kinds, tuple):
        return any(map(_has_rng_state, kinds))
    return kinds == RNG


def _kept_leaves(shape: Shape, kinds: Kinds) -> list[bool]:
    """Per leaf of ``shape``: whether it stays."""
    if not shape.is_tuple or not isinstance(kinds, tuple):
        return [True] * len(shape.leaves())
    kept = set(_kept(kinds))
    return [leaf for i, e in enumerate(shape.elements)
            for leaf in (_kept_leaves(e, kinds[i]) if i in kept else [False] * len(e.leaves()))]


@dataclass
class _Analysed:
    """One computation in one calling context: each instruction's kinds, and those of its callees' contexts."""

    comp: Computation
    inputs: tuple | None  # its parameters' kinds (None: the entry's, from the RNG parameters)
    kinds: dict[str, Kinds]
    callees: dict[str, list["_Analysed"]] = field(default_factory=dict)  # instruction -> contexts it calls


class _RngState:
    """Kinds of every value of a module, then the module rewritten without its RNG state."""

    def __init__(self, module: HloModule, rng_parameters: set[int]):
        self.module = module
        self.rng_parameters = rng_parameters  # entry parameter numbers that are RNG state
        self.analysed: dict[tuple, _Analysed] = {}
        # (computation, inputs, result kinds, keep_arity) -> the computation without RNG state
        self.rewritten: dict[tuple, Computation] = {}
        self.taken = set(module.computations)

    # -- analysis ---------------------------------------------------------------------------------------------

    def analyse(self, comp: Computation, inputs: tuple | None) -> _Analysed:
        """``comp`` with its parameters of ``inputs`` kinds (None: the entry, whose RNG parameters are known)."""
        key = (comp.name, inputs)
        hit = self.analysed.get(key)
        if hit is not None:
            return hit
        result = _Analysed(comp, inputs, {})
        for instr in comp.instructions:
            result.kinds[instr.name] = _settle(self.kinds(instr, result, inputs))
        self.analysed[key] = result
        return result

    def kinds(self, instr: Instruction, analysed: _Analysed, inputs: tuple | None) -> Kinds:
        op = instr.opcode
        operands = [analysed.kinds[ref] for ref in instr.operands]
        if op == "parameter":
            n = instr.parameter_number
            if inputs is None:
                return _fill(instr.shape, RNG if n in self.rng_parameters else DATA)
            return inputs[n] if n < len(inputs) else _fill(instr.shape, DATA)
        if op in _CONSTANT_SOURCES:
            return _fill(instr.shape, CONST)
        if op in _DATA_SOURCES:
            return _fill(instr.shape, DATA)
        if op == "tuple":
            return tuple(operands)
        if op == "get-tuple-element":
            return operands[0][int(instr.attrs["index"])]
        if op in IDENTITY_OPCODES or (
                op == "custom-call" and instr.custom_call_target in PASS_THROUGH_CUSTOM_CALLS and len(operands) == 1):
            return operands[0]
        if op == "copy-start":  # (destination, source, context)
            return (operands[0], operands[0], *(_fill(e, CONST) for e in instr.shape.elements[2:]))
        if op in ("copy-done", "async-done") and operands and isinstance(operands[0], tuple):
            return operands[0][0 if op == "copy-done" else 1]
        called = instr.called_computations()
        if op in ("call", "async-start") and len(called) == 1:
            callee = self.analyse(self.module.computations[called[0]], tuple(operands))
            analysed.callees[instr.name] = [callee]
            root = callee.kinds[callee.comp.root.name]
            if op == "call":
                return root
            # ((operands), result, context): async-done reads the result element back.
            return (tuple(operands), root, *(_fill(e, CONST) for e in instr.shape.elements[2:]))
        if op == "while":
            return self.while_loop(instr, operands[0], analysed)
        if op == "conditional":
            branches = [self.analyse(self.module.computations[name], (argument,))
                        for name, argument in zip(_branches(instr), operands[1:])]
            analysed.callees[instr.name] = branches
            result = None
            for branch in branches:
                out = branch.kinds[branch.comp.root.name]
                result = out if result is None else _join(result, out)
            return result if result is not None else _fill(instr.shape, DATA)
        # Anything else computes its result from all its operands (a fusion, a reduce and their bodies too).
        return _fill(instr.shape, max(map(_joined, operands), default=DATA))

    def while_loop(self, instr: Instruction, init: Kinds, analysed: _Analysed) -> Kinds:
        body = self.module.computations[_name(instr.attrs["body"])]
        condition = self.module.computations[_name(instr.attrs["condition"])]
        state = init
        while True:  # the loop state's kinds: the smallest that the body maps into itself
            out = self.analyse(body, (state,))
            joined = _settle(_join(state, out.kinds[body.root.name]))
            if joined == state:
                break
            state = joined
        analysed.callees[instr.name] = [out, self.analyse(condition, (state,))]
        init_tuple = analysed.comp.by_name[instr.operands[0]]
        if init_tuple.opcode == "tuple" and state != init:
            # An element the body makes RNG state is RNG state from the start (a scan's buffer for the counts it
            # returns starts as a constant): the initial tuple loses it as the loop state does.
            analysed.kinds[init_tuple.name] = state
        return state

    def result_kinds(self, instr: Instruction, analysed: _Analysed) -> list[Kinds | None]:
        """Per computation ``instr`` calls: the kinds its root must have, as ``instr`` passes its result on (a loop
        body's are the loop state's, a branch's the conditional's: an element RNG state in one branch only is
        kept in all); None where the callee's own are."""
        if instr.opcode == "while":
            return [analysed.kinds[instr.name], None]
        if instr.opcode == "conditional":
            return [analysed.kinds[instr.name]] * len(analysed.callees[instr.name])
        return [None]

    # -- rewriting --------------------------------------------------------------------------------------------

    def computation(self, analysed: _Analysed, keep_arity: bool, result: Kinds | None = None) -> Computation:
        """``analysed``'s computation without its RNG state (the same object where it holds none).

        Parameters that are RNG state go, the rest renumbered, except where the caller needs the parameter count
        (``keep_arity``: a loop's body and condition, a branch), where such a parameter becomes ``()``. ``result``:
        the kinds the root must have (default: its own).
        """
        comp = analysed.comp
        key = (comp.name, analysed.inputs, result, keep_arity)
        done = self.rewritten.get(key)
        if done is not None:
            return done
        kinds = analysed.kinds
        removed: set[str] = set()
        kept: list[Instruction] = []
        root = comp.root
        for instr in comp.instructions:
            own = result if instr is root and result is not None else kinds[instr.name]
            if not comp.is_entry and instr.opcode == "parameter" and is_rng_state(own):
                if keep_arity:
                    kept.append(replace(instr, shape=tuple_shape([]), attrs=_without_sharding(instr.attrs)))
                else:
                    removed.add(instr.name)
                continue
            # An instruction with a side effect stays whatever it reads (a host callback printing a key).
            if is_rng_state(own) and instr is not root and not has_side_effect(instr):
                removed.add(instr.name)
                continue
            kept.append(self.instruction(instr, analysed, own, removed))
        if not comp.is_entry and not keep_arity:  # the parameters that remain, numbered in order
            numbers = {n: i for i, n in enumerate(sorted(i.parameter_number for i in kept if i.opcode == "parameter"))}
            kept = [replace(i, literal=str(numbers[i.parameter_number]))
                    if i.opcode == "parameter" and numbers[i.parameter_number] != i.parameter_number else i
                    for i in kept]
        kept = _live(kept)
        if len(kept) == len(comp.instructions) and all(a is b for a, b in zip(kept, comp.instructions)):
            stripped = comp
        else:
            name = comp.name if comp.is_entry else self.fresh_name(comp.name)
            stripped = Computation(name=name, is_entry=comp.is_entry, line=comp.line, instructions=kept,
                                   by_name={i.name: i for i in kept}, attrs=comp.attrs)
        self.rewritten[key] = stripped
        return stripped

    def fresh_name(self, name: str) -> str:
        """A new computation name for a stripped copy (normalization names computations by their body)."""
        n = 1
        while f"{name}.{n}" in self.taken:
            n += 1
        self.taken.add(f"{name}.{n}")
        return f"{name}.{n}"

    def instruction(self, instr: Instruction, analysed: _Analysed, own: Kinds, removed: set[str]) -> Instruction:
        """``instr`` without the RNG state it holds, produces or reads (``own``: the kinds of its result)."""
        kinds = analysed.kinds
        op = instr.opcode
        attrs = instr.attrs
        shape = _stripped_shape(instr.shape, own)
        if shape is not instr.shape and "sharding" in attrs:
            attrs = {**attrs, "sharding": _strip_tuple_sharding(instr, own)}
        if op == "tuple":  # the elements that are RNG state go; one kept that was computed from it reads RNG_VALUE
            operands = tuple(RNG_VALUE if instr.operands[i] in removed else instr.operands[i] for i in _kept(own))
        elif op in ("call", "async-start") and instr.name in analysed.callees:
            # The callee loses the parameters that are RNG state (computation()), so the call loses their operands.
            operands = tuple(ref for ref in instr.operands if not is_rng_state(kinds[ref]))
        else:
            operands = tuple(RNG_VALUE if ref in removed else ref for ref in instr.operands)
        if op == "get-tuple-element":
            index = int(attrs["index"])
            positions = _kept(kinds[instr.operands[0]])
            if index in positions and positions.index(index) != index:
                attrs = {**attrs, "index": str(positions.index(index))}
            elif index not in positions:  # the element went: only a root reads it (as RNG_VALUE)
                operands = (RNG_VALUE,)
        callees = analysed.callees.get(instr.name)
        if callees is not None:
            keep_arity = op in ("while", "conditional")
            names = [self.computation(a, keep_arity, r).name
                     for a, r in zip(callees, self.result_kinds(instr, analysed))]
            attrs = _calling(instr, attrs, names)
        if "control-predecessors" in attrs:
            predecessors = [p for p in split_name_list(attrs["control-predecessors"]) if p not in removed]
            attrs = {k: v for k, v in attrs.items() if k != "control-predecessors"}
            if predecessors:
                attrs["control-predecessors"] = "{" + ", ".join(f"%{p}" for p in predecessors) + "}"
        if shape is instr.shape and operands == instr.operands and attrs is instr.attrs:
            return instr
        return replace(instr, shape=shape, operands=operands, attrs=attrs)


def _calling(instr: Instruction, attrs: dict[str, str], names: list[str]) -> dict[str, str]:
    """``attrs`` naming ``names`` as the computations ``instr`` calls (in the order called_computations gives)."""
    if names == instr.called_computations():
        return attrs
    attrs = dict(attrs)
    if instr.opcode == "while":
        attrs["body"], attrs["condition"] = f"%{names[0]}", f"%{names[1]}"
    elif instr.opcode == "conditional" and "branch_computations" in attrs:
        attrs["branch_computations"] = "{" + ", ".join(f"%{n}" for n in names) + "}"
    elif instr.opcode == "conditional":
        attrs["true_computation"], attrs["false_computation"] = f"%{names[0]}", f"%{names[1]}"
    else:
        attrs["to_apply" if "to_apply" in attrs else "calls"] = f"%{names[0]}"
    return attrs


def _name(value: str) -> str:
    return value.strip().lstrip("%")


def _branches(instr: Instruction) -> list[str]:
    if "branch_computations" in instr.attrs:
        return split_name_list(instr.attrs["branch_computations"])
    return [_name(instr.attrs["true_computation"]), _name(instr.attrs["false_computation"])]


def _without_sharding(attrs: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in attrs.items() if k not in ("sharding", "frontend_attributes")}


def strip_rng_state(module: HloModule, params: Sequence[EntryParam]) -> tuple[HloModule, list[EntryParam]]:
    """The module without its RNG state, and the entry parameters that remain."""
    state = _RngState(module, {p.index for p in params if p.is_rng})
    entry = module.entry
    analysed = state.analyse(entry, None)
    stripped_entry = state.computation(analysed, keep_arity=True)
    computations = _reachable(module, stripped_entry, state.rewritten.values())
    # The header enumerates parameter and output positions, RNG ones included: those go, the rest renumber.
    root_kinds = analysed.kinds[entry.root.name]
    outputs = _kept(root_kinds) if entry.root.shape.is_tuple and isinstance(root_kinds, tuple) else None
    kept_positions = KeptPositions(
        params=tuple(sorted(p.index for p in params if not p.is_rng)), n_params=len(params),
        outputs=None if outputs is None or len(outputs) == len(root_kinds) else tuple(outputs),
        output_shape=entry.root.shape)
    header = drop_positions(module.header_attrs, kept_positions)
    if _declares_only_unused_meshes(header.get("frontend_attributes", ""), computations.values()):
        # jax declares the (empty) mesh only because some value, here an RNG key, was sharded.
        del header["frontend_attributes"]
    stripped = replace(module, computations=computations, entry=stripped_entry, header_attrs=header)
    return stripped, [p for p in params if not p.is_rng]


def _reachable(module: HloModule, entry: Computation, stripped: Iterable[Computation]) -> dict[str, Computation]:
    """The stripped entry and what it still calls, and the computations the module never called (as they were).
    A computation that only RNG state called (jax's threefry, say, for a key nobody draws from any more) goes."""
    called_before = _called_closure(module.entry, module.computations)
    known = {**module.computations, **{c.name: c for c in stripped}, entry.name: entry}
    kept = _called_closure(entry, known)
    # A computation the module never called stays, with what it calls; a rewritten copy nothing calls any more
    # (a threefry whose key went) goes with its while bodies, instead of staying behind and naming them.
    for name, comp in module.computations.items():
        if name not in called_before and name not in kept:
            kept |= _called_closure(comp, known)
    return {name: comp for name, comp in known.items() if name in kept}


def _called_closure(start: Computation, computations: dict[str, Computation]) -> set[str]:
    """Names of ``start`` and every computation it calls, directly or not."""
    seen = {start.name}
    stack = [start]
    while stack:
        for instr in stack.pop().instructions:
            if COMPUTATION_ATTRS.isdisjoint(instr.attrs):
                continue
            for callee in instr.called_computations():
                if callee not in seen and callee in computations:
                    seen.add(callee)
                    stack.append(computations[callee])
    return seen


def _strip_tuple_sharding(instr: Instruction, kinds: Kinds) -> str:
    """A tuple's per-leaf sharding list (``{{replicated}, {devices=...}, ...}``) without the removed leaves'."""
    sharding = instr.attrs["sharding"]
    entries = split_top_level(sharding.strip()[1:-1]) if sharding.strip().startswith("{{") else []
    kept = _kept_leaves(instr.shape, kinds)
    if len(entries) != len(kept):  # one sharding for the whole tuple: it still applies
        return sharding
    return "{" + ", ".join(e.strip() for e, keep in zip(entries, kept) if keep) + "}"


def _declares_only_unused_meshes(frontend_attributes: str, computations) -> bool:
    meshes = _MESH_DECLARATION.findall(frontend_attributes)
    if not meshes or frontend_attributes.count("=") != len(meshes) + 1:
        return False
    for comp in computations:
        for instr in comp.instructions:
            values = " ".join(instr.attrs.values())
            if any(f"@{mesh}" in values for mesh in meshes):
                return False
    return True


def _live(instructions: list[Instruction]) -> list[Instruction]:
    """Drop what nothing live reads any more (constants that only fed a removed count increment). What has a side
    effect is live whether or not anything reads it: ``jax.debug.print``'s callback has no users."""
    by_name = {i.name: i for i in instructions}
    live: set[str] = set()
    stack = [i.name for i in instructions if i.is_root or i.opcode == "parameter" or has_side_effect(i)]
    while stack:
        name = stack.pop()
        if name in live or name not in by_name:
            continue
        live.add(name)
        stack.extend(by_name[name].operands)
        if "control-predecessors" in by_name[name].attrs:
            stack.extend(split_name_list(by_name[name].attrs["control-predecessors"]))
    return [i for i in instructions if i.name in live]
