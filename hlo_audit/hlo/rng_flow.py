"""Where RNG state goes in a module, followed through its dataflow from the entry parameters (or literal keys) to
the outputs, through every called computation.

The analysis is a forward taint over the whole module. Each RNG parameter (key and count separately) is
one bit; every value carries three bit sets, per tuple leaf:

* ``k``: the RNG parameters the value depends on, by any path;
* ``b``: those that reach it through random-bit generation (a ``threefry2x32`` / ``_threefry_*`` call as
  jax lowers it, ``rng-bit-generator``, ``rng``, or a threefry/philox custom call);
* ``u``: those that passed through an operation the analysis does not understand (an unknown custom call,
  a side effect), with the first such place recorded.

Called computations (calls, fusions, while bodies and conditions, conditional branches) are analysed in
the context of their actual operands, tuple element by tuple element, so one stream's bits never smear
into another's through the loop state of a scan. While loops iterate to a fixed point; a loop condition
or branch index that depends on RNG state adds its bits to every result (control dependence). A counter's
increments in a loop body count once per trip (loops.py).

What that says of each RNG stream (drawn, carried, unknown) is rng_streams.py's; ``literal_keys`` follows RNG keys
written into the program as constants the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hlo_audit.hlo import custom_calls
from hlo_audit.hlo.loops import trip_count
from hlo_audit.hlo.shapes import Shape
from hlo_audit.hlo.text import Computation, HloModule, Instruction, split_name_list, strip_number_suffix

# jax lowers jax.random through these functions, each a called computation in pre-optimization HLO.
_RBG_COMPUTATION = re.compile(r"^_*(threefry|philox)", re.IGNORECASE)
# In optimized dumps the calls are inlined; the op_name metadata still names the primitive.
_RBG_OP_NAME = re.compile(r"threefry2x32|random_bits|rng_bit_generator|philox", re.IGNORECASE)
_RBG_CUSTOM_CALL = re.compile(r"threefry|philox|rng|random", re.IGNORECASE)
RBG_OPCODES = frozenset({"rng-bit-generator", "rng"})
# jax.random's own functions, as each is a called computation in pre-optimization HLO (the whole name: a model's
# `_normalize` or `uniform_init` is not one): the random-bit sources above and the private samplers around them, with
# or without the leading underscore (the canonical text drops it), the `.N` or `.<digest>` suffixes and MLIR's `_N`
# aside (``function_name``).
_RANDOM_COMPUTATION = re.compile(
    r"_*(threefry\w*|philox\w*|rbg\w*|unsafe_rbg\w*|random_bits|bernoulli|uniform|truncated_normal|randint|gumbel"
    r"|categorical)", re.IGNORECASE)
_NAME_SUFFIX = re.compile(r"(\.[0-9a-f]+)+$")
# MLIR's symbol table renames a function whose name is taken by appending ``_N``: jax lowers each other
# specialization of one function (a split of a batched key beside a split of one key) as ``_threefry_split_0``,
# ``threefry2x32_1``, ``_bernoulli_11``.
_MLIR_RENAME = re.compile(r"_\d+$")
# jax's fold_in as it lowers it, per PRNG implementation (a call of its own computation).
_FOLD_IN = re.compile(r"_*(threefry|rbg|unsafe_rbg)_fold_in")


def function_name(computation: str) -> str:
    """``_bernoulli.11.1`` / ``bernoulli.6dbad01b`` / ``_bernoulli_11.37`` -> the jitted function's name as the
    computation carries it (``_bernoulli``, ``bernoulli``)."""
    return _MLIR_RENAME.sub("", _NAME_SUFFIX.sub("", computation.lstrip("%")))


def is_fold_in(computation: str) -> bool:
    """Whether ``computation`` is jax's ``fold_in`` (``fold_in(key, data)``: the data is no key)."""
    return _FOLD_IN.fullmatch(function_name(computation)) is not None


def random_computations(module: HloModule) -> frozenset[str]:
    """The computations of jax.random's own functions (``_RANDOM_COMPUTATION``) and all they call (threefry's
    rounds loop, its bodies): the RNG's implementation, not the model's program."""
    return called_closure(module, (n for n in module.computations if _RANDOM_COMPUTATION.fullmatch(function_name(n))))


def called_closure(module: HloModule, roots: Iterable[str]) -> frozenset[str]:
    """``roots`` and every computation they call, at any depth."""
    found = set(roots)
    stack = list(found)
    while stack:
        for instr in module.computations[stack.pop()].instructions:
            for called in instr.called_computations():
                if called in module.computations and called not in found:
                    found.add(called)
                    stack.append(called)
    return frozenset(found)


# Custom calls that only annotate placement or sharding: the value passes through unchanged.
PASS_THROUGH_CUSTOM_CALLS = frozenset({
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost", "MoveToDevice",
    "LayoutConstraint", "annotate_device_placement", "xla.sdy.FuncResultSharding",
    "xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape", "xla.sdy.ShardingGroup",
})
# Operand 0 passes through unchanged, tuple element by tuple element. Without this an opt-barrier would join every
# element it holds: MaxText's rematerialized layers read their streams' keys back from one, each beside the others.
IDENTITY_OPCODES = frozenset({"opt-barrier", "copy", "domain", "add-dependency", "async-update"})
# Values that leave the program: where RNG state goes through one of these, the analysis cannot follow.
SIDE_EFFECTS = frozenset({"outfeed", "send", "send-done", "infeed", "recv", "recv-done"})
NO_DATA = frozenset({"constant", "iota", "partition-id", "replica-id", "after-all", "rng-get-and-update-state"})
# Operations that move a value's elements without computing with them (their operand 0; dynamic-update-slice's
# update too): a scan slices a stacked leaf per iteration and stacks it back. Their other operands (indices) are read.
_MOVES = {"slice": 1, "dynamic-slice": 1, "reshape": 1, "bitcast": 1, "transpose": 1, "broadcast": 1,
          "concatenate": None, "dynamic-update-slice": 2, "pad": 1}
_INTEGRAL = re.compile(r"^[us]\d+$")

ZERO = (0, 0, 0)  # (k, b, u) of a value that depends on no RNG parameter


class Tup(tuple):
    """A tuple-shaped value: one flow per element (a plain 3-tuple of ints is a leaf)."""


_DONE = object()
# The value helpers below walk a tuple value with explicit stacks: a tuple shape nests as deep as XLA's parser
# reads (500 levels), past what recursion at two frames per level leaves of Python's limit.


def _collapse(value) -> tuple[int, int, int]:
    if not isinstance(value, Tup):
        return value
    k = b = u = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Tup):
            stack.extend(item)
        else:
            k, b, u = k | item[0], b | item[1], u | item[2]
    return (k, b, u)


def _tuple_tree(root, children, leaf_of):
    """A ``Tup`` tree shaped as ``root``: ``children(node)`` gives a tuple node's elements (None for a leaf),
    ``leaf_of(node)`` a leaf's value. Iterative: XLA nests tuples deeper than Python recurses."""
    if children(root) is None:
        return leaf_of(root)
    built: list[list] = [[]]
    stack = [iter(children(root))]
    while stack:
        node = next(stack[-1], _DONE)
        if node is _DONE:
            stack.pop()
            done = Tup(built.pop())
            if not stack:
                return done
            built[-1].append(done)
        elif (elements := children(node)) is not None:
            stack.append(iter(elements))
            built.append([])
        else:
            built[-1].append(leaf_of(node))
    return Tup()


def _rebuild(value, leaf_of):
    """``value`` with each leaf replaced by ``leaf_of(leaf)``, its tuples as they are."""
    return _tuple_tree(value, lambda v: v if isinstance(v, Tup) else None, leaf_of)


def _fill(shape: Shape, leaf):
    """``leaf`` at every array of ``shape``, in its tuple structure."""
    return _tuple_tree(shape, lambda s: s.elements if s.is_tuple else None, lambda _: leaf)


def _join(a, b):
    if not isinstance(a, Tup) and not isinstance(b, Tup):
        return (a[0] | b[0], a[1] | b[1], a[2] | b[2])
    if not (isinstance(a, Tup) and isinstance(b, Tup) and len(a) == len(b)):
        return _join_mismatched(a, b)
    built: list[list] = [[]]
    stack = [zip(a, b)]
    while stack:
        pair = next(stack[-1], None)
        if pair is None:
            stack.pop()
            done = Tup(built.pop())
            if not stack:
                return done
            built[-1].append(done)
            continue
        x, y = pair
        if isinstance(x, Tup) and isinstance(y, Tup) and len(x) == len(y):
            stack.append(zip(x, y))
            built.append([])
        elif isinstance(x, Tup) or isinstance(y, Tup):
            built[-1].append(_join_mismatched(x, y))
        else:
            built[-1].append((x[0] | y[0], x[1] | y[1], x[2] | y[2]))
    return Tup()


def _join_mismatched(a, b):
    """Shapes disagree: fall back to the union of everything."""
    leaf = _join(_collapse(a), _collapse(b))
    return _fill_like(a if isinstance(a, Tup) else b, leaf)


def _fill_like(value, leaf):
    return _rebuild(value, lambda _: leaf) if isinstance(value, Tup) else leaf


def _add_control(value, decider: tuple[int, int, int]):
    """Everything a loop or branch produces depends on what decided it (random bits included)."""
    if not decider[0]:
        return value
    return _rebuild(value, lambda leaf: (leaf[0] | decider[0], leaf[1] | decider[1], leaf[2] | decider[2]))


def _leaves(value) -> list[tuple[int, int, int]]:
    if not isinstance(value, Tup):
        return [value]
    leaves = []
    stack = [iter(value)]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif isinstance(item, Tup):
            stack.append(iter(item))
        else:
            leaves.append(item)
    return leaves


@dataclass
class FlowEvents:
    """What one analysed computation did with RNG bits (sites are "computation/instruction")."""

    draws: list[tuple[int, str]] = field(default_factory=list)     # (bits, site) that entered random bits
    opaque: list[tuple[int, str]] = field(default_factory=list)    # (bits, site) that went somewhere unknown
    increments: dict[int, float] = field(default_factory=dict)    # count bit -> elements incremented
    unknown_trips: bool = False  # some loop's trip count could not be read: increments are per iteration
    keys: int = 0  # bits that entered random-bit generation as its key (_key_operands)
    reads: int = 0  # bits some operation computed with: anything but moving a value whole or in parts (_MOVES)

    def merge(self, other: "FlowEvents", times: float = 1) -> None:
        self.keys |= other.keys
        self.reads |= other.reads
        self.draws.extend(other.draws)
        self.opaque.extend(other.opaque)
        for bit, n in other.increments.items():
            self.increments[bit] = self.increments.get(bit, 0) + n * times
        self.unknown_trips |= other.unknown_trips


def _key_operands(comp: Computation, instr: Instruction) -> range | list[int]:
    """The operands of a random-bit site that are its key: jax's ``threefry2x32(k1, k2, x1, x2)`` takes the key's
    halves first and the counts it hashes after; a call of jax's own (``_threefry_fold_in(key, data)``: the data
    folded into a key is no key) its key-shaped operands; any other site (``rng-bit-generator``, an optimized
    dump's instruction named by its op_name) every operand."""
    everything = range(len(instr.operands))
    if instr.opcode not in ("call", "fusion"):
        return everything
    callee = strip_number_suffix(instr.called_computations()[0]).lstrip("_")
    if callee.startswith("threefry2x32") and len(instr.operands) == 4:
        return [0, 1]
    keyed = [i for i, ref in enumerate(instr.operands) if key_shaped(comp.by_name[ref].shape)]
    return keyed or everything


def _read(op: str, operands: list, bits: int) -> int:
    """The bits an operation computes with: all its operands' (``bits``), or, for one that moves values (``_MOVES``),
    those of the operands past the moved ones (indices); concatenate reads none."""
    moved = _MOVES.get(op, 0)
    if moved == 0:
        return bits
    return _collapse(Tup(operands[moved:]))[0] if moved else 0


def first_site(sites: Iterable[tuple[int, str]], bits: int) -> str | None:
    return next((site for mask, site in sites if mask & bits), None)


class _Deferred(Exception):
    """A run nested too deep to recurse into: analysed on its own first (see _Dataflow.analyse)."""

    def __init__(self, comp: Computation, inputs: Sequence):
        super().__init__(comp.name)
        self.comp, self.inputs = comp, inputs


# Runs nested inside one another before the innermost is deferred: calls nest as deep as a module chains
# computations (XLA's parser reads any chain), and each level is three Python frames (run, instruction, while_loop).
_NESTED_RUNS = 64


class _Dataflow:
    def __init__(self, module: HloModule, count_bits: int, constant_bits: dict[tuple[str, str], int] | None = None,
                 lineage: bool = False):
        """``lineage``: random bits depend on their key alone (``keys_by_dataflow``: data folded into a key, or
        hashed by it, makes no key of what it came from); else on every operand."""
        self.module = module
        self.lineage = lineage
        self.count_bits = count_bits
        self.constant_bits = constant_bits or {}  # (computation, constant) -> its bit, when constants are followed
        self.memo: dict[tuple[str, tuple], tuple[object, FlowEvents]] = {}
        self.depth = 0  # runs in progress, nested

    # -- computations ---------------------------------------------------------------------------------------

    def analyse(self, comp: Computation, inputs: Sequence) -> tuple[object, FlowEvents]:
        """``run`` for a chain of calls of any depth, without deep recursion: a run nested _NESTED_RUNS deep is
        deferred, analysed from here, and the runs above it are repeated, finding its result in the memo."""
        pending = [(comp, inputs)]
        while True:
            try:
                result = self.run(*pending[-1])
            except _Deferred as deferred:
                pending.append((deferred.comp, deferred.inputs))
                continue
            pending.pop()
            if not pending:
                return result

    def run(self, comp: Computation, inputs: Sequence) -> tuple[object, FlowEvents]:
        key = (comp.name, tuple(inputs))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        if self.depth >= _NESTED_RUNS:
            raise _Deferred(comp, inputs)
        self.depth += 1
        try:
            events = FlowEvents()
            values: dict[str, object] = {}
            for instr in comp.instructions:
                values[instr.name] = self.instruction(comp, instr, values, inputs, events)
        finally:
            self.depth -= 1
        result = (values[comp.root.name], events)
        self.memo[key] = result
        return result

    def instruction(self, comp: Computation, instr: Instruction, values: dict, inputs: Sequence,
                    events: FlowEvents):
        op = instr.opcode
        if op == "parameter":
            n = instr.parameter_number
            return inputs[n] if n < len(inputs) else _fill(instr.shape, ZERO)
        if op in NO_DATA:
            bit = self.constant_bits.get((comp.name, instr.name), 0) if op == "constant" else 0
            return _fill(instr.shape, (bit, 0, 0))
        operands = [values[ref] for ref in instr.operands]
        site = f"{comp.name}/{instr.name}"
        if op == "tuple":
            return Tup(operands)
        if op == "get-tuple-element":
            whole = operands[0]
            # A value followed as one leaf (a pass-through custom call whose result is a tuple of its operand:
            # Shardy's xla.sdy.GlobalToLocalShape) has that leaf's flags in every element.
            return whole[int(instr.attrs["index"])] if isinstance(whole, Tup) else _fill(instr.shape, whole)
        if self.is_random_bits(instr):
            k, b, u = _collapse(Tup(operands))
            events.reads |= k
            if k:
                events.draws.append((k, site))
                keyed = _collapse(Tup([operands[i] for i in _key_operands(comp, instr)]))[0]
                events.keys |= keyed
                k = keyed if self.lineage else k
            return _fill(instr.shape, (k, b | k, u))
        called = instr.called_computations()
        if op in ("call", "fusion", "async-start") and len(called) == 1:
            result, inner = self.run(self.module.computations[called[0]], operands)
            events.merge(inner)
            if op != "async-start":
                return result
            # ((operands), result, context): async-done reads the result element back.
            return Tup((Tup(operands), result, *(_fill(e, ZERO) for e in instr.shape.elements[2:])))
        if op in IDENTITY_OPCODES:
            return operands[0]
        if op == "copy-start":  # (destination, source, context): the copy is the source
            return Tup((operands[0], operands[0], *(_fill(e, ZERO) for e in instr.shape.elements[2:])))
        if op in ("async-done", "copy-done") and isinstance(operands[0], Tup):
            return operands[0][1 if op == "async-done" else 0]
        if op == "while":
            return self.while_loop(comp, instr, operands[0], events)
        if op == "conditional":
            return self.conditional(instr, operands, events)
        if op == "custom-call" and instr.custom_call_target in PASS_THROUGH_CUSTOM_CALLS and len(operands) == 1:
            return operands[0]
        if op == "custom-call" and (known := custom_calls.flow(instr)) is not None:
            return self.known_custom_call(instr, operands, known, site, events)
        leaf = _collapse(Tup(operands))
        events.reads |= _read(op, operands, leaf[0])
        if op == "custom-call" or op in SIDE_EFFECTS:
            if leaf[0]:
                events.opaque.append((leaf[0], f"{site} ({instr.custom_call_target or op})"))
                # Random bits that enter a kernel nobody has read may be dropped there: past it, a stream's key
                # is followed as unknown, never as drawn.
                leaf = (leaf[0], 0, leaf[2] | leaf[0])
        elif op == "add":
            self.count_increment(instr, operands, events)
        return _fill(instr.shape, leaf)

    def known_custom_call(self, instr: Instruction, operands: list, known: custom_calls.Flow, site: str,
                          events: FlowEvents):
        """A custom call whose semantics custom_calls.py states: data and random-bit seeds, result by result."""
        leaves = [_collapse(o) for o in operands]
        for k, _, _ in leaves:
            events.reads |= k
        shapes = instr.shape.elements if instr.shape.is_tuple else (instr.shape,)
        results = []
        for index, shape in enumerate(shapes):
            used = known.data(index)
            k = b = u = 0
            for operand in range(len(leaves)) if used is None else used:
                k, b, u = k | leaves[operand][0], b | leaves[operand][1], u | leaves[operand][2]
            for operand, reached in known.seeds:
                if index in reached:  # the kernel draws bits from this operand: it is random-bit generation
                    sk, sb, su = leaves[operand]
                    k, b, u = k | sk, b | sk | sb, u | su
            results.append(_fill(shape, (k, b, u)))
        for operand, _ in known.seeds:
            if leaves[operand][0]:
                events.draws.append((leaves[operand][0], f"{site} ({instr.custom_call_target})"))
                events.keys |= leaves[operand][0]
        return Tup(results) if instr.shape.is_tuple else results[0]

    def is_random_bits(self, instr: Instruction) -> bool:
        op = instr.opcode
        if op in RBG_OPCODES:
            return True
        if op == "custom-call":
            return bool(_RBG_CUSTOM_CALL.search(instr.custom_call_target))
        if op in ("call", "fusion"):
            called = instr.called_computations()
            if called and _RBG_COMPUTATION.match(strip_number_suffix(called[0])):
                return True
        return bool(_RBG_OP_NAME.search(instr.op_name))

    def count_increment(self, instr: Instruction, operands: list, events: FlowEvents) -> None:
        """``count + 1``: one operand depends on exactly one count parameter, the other on nothing RNG."""
        if len(operands) != 2 or not _INTEGRAL.match(instr.shape.dtype or ""):
            return
        (ak, ab, _), (bk, bb, _) = _collapse(operands[0]), _collapse(operands[1])
        k = ak | bk
        if ab or bb or (ak and bk) or not k or k & (k - 1) or not k & self.count_bits:
            return
        events.increments[k] = events.increments.get(k, 0) + instr.shape.num_elements

    def while_loop(self, comp: Computation, instr: Instruction, init, events: FlowEvents):
        body = self.module.computations[instr.attrs["body"].strip().lstrip("%")]
        condition = self.module.computations[instr.attrs["condition"].strip().lstrip("%")]
        state = init
        while True:
            out, body_events = self.run(body, [state])
            joined = _join(state, out)
            if joined == state:
                break
            state = joined
        predicate, cond_events = self.run(condition, [state])
        trips = trip_count(self.module, comp, instr)
        if trips is None:
            events.unknown_trips = True
        events.merge(body_events, trips if trips is not None else 1)
        events.merge(cond_events)
        return _add_control(state, _collapse(predicate))

    def conditional(self, instr: Instruction, operands: list, events: FlowEvents):
        if "branch_computations" in instr.attrs:
            branches = split_name_list(instr.attrs["branch_computations"])
        else:
            branches = [instr.attrs["true_computation"].strip().lstrip("%"),
                        instr.attrs["false_computation"].strip().lstrip("%")]
        result = None
        for name, argument in zip(branches, operands[1:]):
            out, inner = self.run(self.module.computations[name], [argument])
            events.merge(inner)
            result = out if result is None else _join(result, out)
        if result is None:
            result = _fill(instr.shape, ZERO)
        events.reads |= _collapse(operands[0])[0]
        return _add_control(result, _collapse(operands[0]))


def entry_flow(module: HloModule, bit_of: dict[int, int], count_bits: int,
               lineage: bool = False) -> tuple[list[tuple[int, int, int]], FlowEvents]:
    """Follow the entry parameters' bits through ``module`` (``bit_of``: parameter number -> its bit; ``count_bits``:
    the bits of RNG counters, whose ``+ 1`` is an increment; ``lineage``: as ``_Dataflow``'s): the (k, b, u) of each
    leaf of the entry's root, in ``Shape.leaves`` order, and what the step did with the bits."""
    entry_params = module.entry.parameters
    inputs = [ZERO] * (max((p.parameter_number for p in entry_params), default=-1) + 1)  # by parameter number
    for instr in entry_params:
        inputs[instr.parameter_number] = _fill(instr.shape, (bit_of.get(instr.parameter_number, 0), 0, 0))
    root, events = _Dataflow(module, count_bits, lineage=lineage).analyse(module.entry, inputs)
    return _leaves(root), events


# ---------------------------------------------------------------------------------------------------------
# Keys by what the step does with them
# ---------------------------------------------------------------------------------------------------------


def key_shaped(shape: Shape) -> bool:
    """A raw key's shape: ``u32`` with a last dimension of 2 (threefry) or 4 (rbg), leading axes allowed (keys
    split per layer). A typed key (``key<fry>[]``) is its data in HLO: ``u32[2]``."""
    dims = shape.dims
    return not shape.is_tuple and shape.dtype == "u32" and bool(dims) and dims[-1] in (2, 4)


def keys_by_dataflow(module: HloModule, candidates: Iterable[int]) -> frozenset[int]:
    """The entry parameters among ``candidates`` (parameter numbers of key-shaped leaves) that are RNG keys by what
    the step does with them, whatever they are called:

    * drawn from: the value reaches random-bit generation as its key (a threefry call as jax lowers ``split``,
      ``fold_in`` and ``random_bits``; ``rng-bit-generator`` for rbg keys; ``FlowEvents.keys``);
    * carried through unread: the value reaches the step's outputs and nothing computes with it on the way (it is
      only handed back, moved, sliced or stacked: ``FlowEvents.reads``). A key-shaped leaf the step keeps without
      using is the state a never-drawn key is (a per-layer key no layer draws from, under any name): dead state
      the host marshals every call. A leaf computed with (a token counter ``+ 1``, ids folded into a key) is not."""
    bit_of = {number: 1 << i for i, number in enumerate(candidates)}
    if not bit_of:
        return frozenset()
    leaves, events = entry_flow(module, bit_of, count_bits=0, lineage=True)
    returned = 0
    for k, _, _ in leaves:
        returned |= k
    return frozenset(number for number, bit in bit_of.items()
                     if events.keys & bit or (returned & bit and not events.reads & bit))


# ---------------------------------------------------------------------------------------------------------
# Keys that are literals
# ---------------------------------------------------------------------------------------------------------


def literal_keys(module: HloModule) -> list[dict]:
    """Constants that random bits are drawn from: RNG keys written into the program, which never advance.

    A jitted step that closes over a key (MaxEngine's RNG streams) holds it as a ``u32`` literal: every call
    draws the same bits from it. Candidates are ``u32`` constants shaped like raw keys (last dimension 2 for
    threefry, 4 for rbg; a leading layer dimension when scanned) outside jax's random-bit computations (whose
    own constants are rotation tables); each is followed forward, through calls and loops as RNG parameters
    are, to the random-bit sites it reaches. Returns ``{"name", "dims", "site", "used"}`` per literal key, in
    module order; ``used``: its random bits reach an output (else jax draws bits nobody reads, as it does for
    a stream that is carried).
    """
    flow = _Dataflow(module, count_bits=0)
    candidates = [(comp.name, instr) for comp in _outside_random_bits(flow)
                  for instr in comp.instructions if _key_shaped_literal(instr)]
    if not candidates:
        return []
    flow.constant_bits = {(comp, instr.name): 1 << i for i, (comp, instr) in enumerate(candidates)}
    inputs = [_fill(p.shape, ZERO) for p in module.entry.parameters]
    root, events = flow.analyse(module.entry, inputs)
    used = 0  # keys whose random bits reach an output
    for _, b, _ in _leaves(root):
        used |= b
    keys = []
    for i, (_, instr) in enumerate(candidates):
        site = first_site(events.draws, 1 << i)
        if site is not None:
            keys.append({"name": instr.name, "dims": list(instr.shape.dims), "site": site, "used": bool(used >> i & 1)})
    return keys


def _key_shaped_literal(instr: Instruction) -> bool:
    return instr.opcode == "constant" and key_shaped(instr.shape)


def _outside_random_bits(flow: _Dataflow) -> list[Computation]:
    """Computations reachable from the entry without entering a random-bit computation."""
    module = flow.module
    seen = {module.entry.name}
    stack = [module.entry]
    while stack:
        comp = stack.pop()
        for instr in comp.instructions:
            callees = instr.called_computations()  # most instructions call nothing: ask that first
            if not callees or flow.is_random_bits(instr):
                continue
            for callee in callees:
                if callee not in seen:
                    seen.add(callee)
                    stack.append(module.computations[callee])
    return [c for c in module.computations.values() if c.name in seen]
