"""Where each RNG stream's key goes: drawn, carried, or unknown.

An NNX ``Rngs`` stream is a (key, count) pair of entry parameters under one path. Seed 000's finding was
that three places held streams they never drew from: the key only flowed back to the outputs and the
count was only incremented, yet both cost a parameter per step and a counter kernel per layer. This
module reads that from the HLO by following every RNG parameter through the entry computation's dataflow.

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
or branch index that depends on RNG state adds its bits to every result (control dependence).

At the entry ROOT, *s*'s own state (the returned key, the incremented count) is the output leaves that reuse
the buffers of *s*'s key and count parameters (``input_output_alias``: jax aliases a donated train state's new
value to the old, as MaxText's and NNX's steps donate it). An output aliased to no parameter is *s*'s own state
if it depends only on *s*'s own key and count, not through random bits. (Aliases say it where dataflow cannot: a
count advanced in one branch of a ``conditional`` on the data depends on every stream the data drew from.) Any
other output that depends on *s* decides its verdict: through random bits, ``drawn``; through something not
understood, ``unknown``; without random bits at all (the key used as plain data), ``unknown`` too, saying where. A
stream that reaches no other output is ``carried``: dead state.

This is what the numerical oracle in the tests checks: change one stream's key, run the step, compare
every output but the stream's own state.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hlo_audit.hlo import custom_calls
from hlo_audit.hlo.header import output_aliases
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.shapes import Shape
from hlo_audit.hlo.text import Computation, HloModule, Instruction, split_name_list, strip_number_suffix

VERDICTS = ("drawn", "carried", "unknown")

# jax lowers jax.random through these functions, each a called computation in pre-optimization HLO.
_RBG_COMPUTATION = re.compile(r"^_*(threefry|philox)", re.IGNORECASE)
# In optimized dumps the calls are inlined; the op_name metadata still names the primitive.
_RBG_OP_NAME = re.compile(r"threefry2x32|random_bits|rng_bit_generator|philox", re.IGNORECASE)
_RBG_CUSTOM_CALL = re.compile(r"threefry|philox|rng|random", re.IGNORECASE)
RBG_OPCODES = frozenset({"rng-bit-generator", "rng"})

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
_INTEGRAL = re.compile(r"^[us]\d+$")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_DIRECTION = re.compile(r"direction=(\w+)")

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
class _Events:
    """What one analysed computation did with RNG bits (sites are "computation/instruction")."""

    draws: list[tuple[int, str]] = field(default_factory=list)     # (bits, site) that entered random bits
    opaque: list[tuple[int, str]] = field(default_factory=list)    # (bits, site) that went somewhere unknown
    increments: dict[int, float] = field(default_factory=dict)    # count bit -> elements incremented
    unknown_trips: bool = False  # some loop's trip count could not be read: increments are per iteration

    def merge(self, other: "_Events", times: float = 1) -> None:
        self.draws.extend(other.draws)
        self.opaque.extend(other.opaque)
        for bit, n in other.increments.items():
            self.increments[bit] = self.increments.get(bit, 0) + n * times
        self.unknown_trips |= other.unknown_trips


def _first_site(sites: Iterable[tuple[int, str]], bits: int) -> str | None:
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
    def __init__(self, module: HloModule, count_bits: int, constant_bits: dict[tuple[str, str], int] | None = None):
        self.module = module
        self.count_bits = count_bits
        self.constant_bits = constant_bits or {}  # (computation, constant) -> its bit, when constants are followed
        self.memo: dict[tuple[str, tuple], tuple[object, _Events]] = {}
        self.depth = 0  # runs in progress, nested

    # -- computations ---------------------------------------------------------------------------------------

    def analyse(self, comp: Computation, inputs: Sequence) -> tuple[object, _Events]:
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

    def run(self, comp: Computation, inputs: Sequence) -> tuple[object, _Events]:
        key = (comp.name, tuple(inputs))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        if self.depth >= _NESTED_RUNS:
            raise _Deferred(comp, inputs)
        self.depth += 1
        try:
            events = _Events()
            values: dict[str, object] = {}
            for instr in comp.instructions:
                values[instr.name] = self.instruction(comp, instr, values, inputs, events)
        finally:
            self.depth -= 1
        result = (values[comp.root.name], events)
        self.memo[key] = result
        return result

    def instruction(self, comp: Computation, instr: Instruction, values: dict, inputs: Sequence,
                    events: _Events):
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
            return operands[0][int(instr.attrs["index"])]
        if self.is_random_bits(instr):
            k, b, u = _collapse(Tup(operands))
            if k:
                events.draws.append((k, site))
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
                          events: _Events):
        """A custom call whose semantics custom_calls.py states: data and random-bit seeds, result by result."""
        leaves = [_collapse(o) for o in operands]
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

    def count_increment(self, instr: Instruction, operands: list, events: _Events) -> None:
        """``count + 1``: one operand depends on exactly one count parameter, the other on nothing RNG."""
        if len(operands) != 2 or not _INTEGRAL.match(instr.shape.dtype or ""):
            return
        (ak, ab, _), (bk, bb, _) = _collapse(operands[0]), _collapse(operands[1])
        k = ak | bk
        if ab or bb or (ak and bk) or not k or k & (k - 1) or not k & self.count_bits:
            return
        events.increments[k] = events.increments.get(k, 0) + instr.shape.num_elements

    def while_loop(self, comp: Computation, instr: Instruction, init, events: _Events):
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
        trips = trip_count(comp, instr, condition)
        if trips is None:
            events.unknown_trips = True
        events.merge(body_events, trips if trips is not None else 1)
        events.merge(cond_events)
        return _add_control(state, _collapse(predicate))

    def conditional(self, instr: Instruction, operands: list, events: _Events):
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
        return _add_control(result, _collapse(operands[0]))


def trip_count(comp: Computation, loop: Instruction, condition: Computation) -> int | None:
    """Iterations of a while loop: XLA's known_trip_count, or jax's ``i < N`` with ``i`` starting at 0."""
    m = _TRIP_COUNT.search(loop.attrs.get("backend_config", ""))
    if m:
        return int(m.group(1))
    root = condition.root
    if root.opcode != "compare" or len(root.operands) != 2:
        return None
    direction = _DIRECTION.search("direction=" + root.attrs.get("direction", ""))
    if not direction or direction.group(1) != "LT":
        return None
    counter, bound = (condition.by_name[r] for r in root.operands)
    if counter.opcode != "get-tuple-element" or bound.opcode != "constant":
        return None
    index = int(counter.attrs["index"])
    init = comp.by_name.get(loop.operands[0])
    if init is None or init.opcode != "tuple" or index >= len(init.operands):
        return None
    start = comp.by_name.get(init.operands[index])
    try:
        if start is None or start.opcode != "constant" or int(start.literal) != 0:
            return None
        return int(bound.literal)
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """One RNG stream of the module and what its key does."""

    path: str  # state path of the stream: the key's path without ``.key``
    pattern: str  # the path with layer indices collapsed: ``decoder.layers_*.mlp.wi_0...to_nnx__rngs.aqt``
    key: EntryParam | None
    count: EntryParam | None
    verdict: str  # drawn | carried | unknown
    where: str  # drawn: the random-bit site first reached; unknown: where the flow left the analysis
    # Count elements incremented per step: every increment the step executes, loop trip counts included. Each is a
    # scalar kernel (seed 000's 673 per step), so one that a rematerialized layer's backward pass recomputes counts
    # twice.
    increments: float

    @property
    def params(self) -> int:
        return (self.key is not None) + (self.count is not None)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in (self.key, self.count) if p is not None)

    def to_record(self) -> dict:
        return {"path": self.path, "pattern": self.pattern, "verdict": self.verdict, "where": self.where,
                "key": self.key.index if self.key else None, "count": self.count.index if self.count else None,
                "params": self.params, "bytes": self.bytes, "increments": _number(self.increments)}


@dataclass(frozen=True)
class RngReport:
    streams: list[Stream]
    increments_exact: bool  # False when a loop's trip count was unknown (increments then count one iteration)

    def counts(self) -> dict[str, int]:
        return {v: len(self.by_verdict(v)) for v in VERDICTS}

    def to_record(self, with_streams: bool = True) -> dict:
        """What results, the cache and ``--format json`` keep: totals, per pattern, and (optionally) per stream.

        Counter increments per step are given by verdict, in total (``dead_increments`` for the carried streams,
        ``drawn_increments``, ``unknown_increments``) and per pattern with the paths of its streams: what a ratchet
        on them compares, and what a finding names when they grow (seed 000's throughput loss was 672 dead ones at
        32 layers, with no entry parameter added where a stream was forced onto a shared one).
        """
        record = {"streams": len(self.streams), **self.counts(), "dead_params": self.dead_params,
                  "dead_bytes": sum(s.bytes for s in self.dead),
                  "dead_increments": _number(self.dead_increments),
                  "drawn_increments": _number(self.increments_of("drawn")),
                  "unknown_increments": _number(self.increments_of("unknown")),
                  "increments_exact": self.increments_exact,
                  "patterns": [p.to_record() for p in self.patterns()]}
        if with_streams:
            record["stream_list"] = [s.to_record() for s in self.streams]
        return record

    def by_verdict(self, verdict: str) -> list[Stream]:
        return [s for s in self.streams if s.verdict == verdict]

    @property
    def dead(self) -> list[Stream]:
        return self.by_verdict("carried")

    @property
    def dead_params(self) -> int:
        return sum(s.params for s in self.dead)

    @property
    def dead_increments(self) -> float:
        return self.increments_of("carried")

    def increments_of(self, verdict: str) -> float:
        """Counter increments per step of the streams with ``verdict``."""
        return sum(s.increments for s in self.by_verdict(verdict))

    def patterns(self) -> list["PatternCount"]:
        """Per stream pattern: streams by verdict and what the carried ones cost, most dead state first."""
        grouped: dict[str, PatternCount] = {}
        for s in self.streams:
            p = grouped.setdefault(s.pattern, PatternCount(s.pattern))
            p.add(s)
        return sorted(grouped.values(), key=lambda p: (-p.dead_params, -p.streams, p.pattern))


@dataclass
class PatternCount:
    pattern: str
    drawn: int = 0
    carried: int = 0
    unknown: int = 0
    dead_params: int = 0
    dead_increments: float = 0
    drawn_increments: float = 0
    unknown_increments: float = 0
    where: str = ""  # for unknown streams, the first place the analysis lost them
    paths: dict[str, list[str]] = field(default_factory=lambda: {v: [] for v in VERDICTS})  # verdict -> streams

    @property
    def streams(self) -> int:
        return self.drawn + self.carried + self.unknown

    def add(self, s: Stream) -> None:
        setattr(self, s.verdict, getattr(self, s.verdict) + 1)
        self.paths[s.verdict].append(s.path)
        if s.verdict == "carried":
            self.dead_params += s.params
            self.dead_increments += s.increments
        elif s.verdict == "drawn":
            self.drawn_increments += s.increments
        else:
            self.unknown_increments += s.increments
            self.where = self.where or s.where

    def to_record(self) -> dict:
        return {"pattern": self.pattern, "streams": self.streams, "drawn": self.drawn, "carried": self.carried,
                "unknown": self.unknown, "dead_params": self.dead_params,
                "dead_increments": _number(self.dead_increments), "drawn_increments": _number(self.drawn_increments),
                "unknown_increments": _number(self.unknown_increments), "where": self.where,
                "paths": {v: list(paths) for v, paths in self.paths.items()}}


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


def stream_path(param: EntryParam) -> str:
    """``state.layers_0.dropout.rngs.key`` -> ``state.layers_0.dropout.rngs``."""
    return param.path.rsplit(".", 1)[0] if "." in param.path else param.path


def pair_streams(params: Sequence[EntryParam]) -> list[tuple[str, EntryParam | None, EntryParam | None]]:
    """(path, key, count) for every stream, in entry parameter order of the first of the pair."""
    streams: dict[str, list] = {}
    for p in params:
        if p.role in ("rng_key", "rng_count"):
            pair = streams.setdefault(stream_path(p), [None, None])
            pair[0 if p.role == "rng_key" else 1] = p
    return [(path, key, count) for path, (key, count) in streams.items()]


def classify_streams(module: HloModule, params: Sequence[EntryParam]) -> RngReport:
    """Classify every RNG stream of ``module`` (``params`` are its entry parameters, as ``entry_params`` gives)."""
    streams = pair_streams(params)
    bit_of: dict[int, int] = {}  # parameter number -> its bit: stream i's key is bit 2i, its count bit 2i+1
    for i, (_, key, count) in enumerate(streams):
        for bit, param in ((1 << 2 * i, key), (1 << 2 * i + 1, count)):
            if param is not None:
                bit_of[param.index] = bit
    count_bits = sum(1 << (2 * i + 1) for i, (_, _, count) in enumerate(streams) if count is not None)
    entry_params = module.entry.parameters
    inputs = [ZERO] * (max((p.parameter_number for p in entry_params), default=-1) + 1)  # by parameter number
    for instr in entry_params:
        inputs[instr.parameter_number] = _fill(instr.shape, (bit_of.get(instr.parameter_number, 0), 0, 0))
    flow = _Dataflow(module, count_bits)
    root, events = flow.analyse(module.entry, inputs)
    outputs = list(zip(_leaves(root), module.entry.root.shape.leaves()))
    aliased = _aliased_leaves(module)  # output leaf -> the parameter number whose new value it is
    result = []
    for i, (path, key, count) in enumerate(streams):
        key_bit, count_bit = 1 << (2 * i), 1 << (2 * i + 1)
        own = (key_bit if key is not None else 0) | (count_bit if count is not None else 0)
        own_params = {p.index for p in (key, count) if p is not None}
        own_shapes = {p.shape.text.split("{")[0] for p in (key, count) if p is not None}
        verdict, where = _verdict(outputs, own, own_params, own_shapes, aliased,
                                  key_bit if key is not None else count_bit, events)
        pattern = (key or count).folded_path.rsplit(".", 1)[0].removeprefix("state.")
        result.append(Stream(path=path, pattern=pattern, key=key, count=count, verdict=verdict, where=where,
                             increments=events.increments.get(count_bit, 0) if count is not None else 0))
    return RngReport(streams=result, increments_exact=not events.unknown_trips)


def _aliased_leaves(module: HloModule) -> dict[int, int]:
    """Leaf of the root's shape (in ``Shape.leaves`` order) -> the entry parameter number it is aliased to."""
    root_shape = module.entry.root.shape
    leaves = {}
    for output, parameter in output_aliases(module.header_attrs):
        shape, first = root_shape, 0
        try:
            for i in output:
                first += sum(len(e.leaves()) for e in shape.elements[:i])
                shape = shape.elements[i]
        except IndexError:
            continue
        if not shape.is_tuple:
            leaves[first] = parameter
    return leaves


def _verdict(outputs: list[tuple[tuple[int, int, int], Shape]], own: int, own_params: set[int], own_shapes: set[str],
             aliased: dict[int, int], key_bit: int, events: _Events) -> tuple[str, str]:
    influenced = []  # (output index, leaf) of outputs that are not this stream's own state
    for index, ((k, b, u), shape) in enumerate(outputs):
        if not k & own:
            continue
        if index in aliased:
            if aliased[index] in own_params:
                continue  # the stream's new key or count, in the old one's buffer
        elif not k & ~own and not b & own and not u & own and shape.text.split("{")[0] in own_shapes:
            continue  # the stream's own key or count, handed back
        influenced.append((index, (k, b, u)))
    if not influenced:
        return "carried", ""
    if any(b & key_bit for _, (_, b, _) in influenced):
        return "drawn", _first_site(events.draws, key_bit) or ""
    if any(u & own for _, (_, _, u) in influenced):
        return "unknown", f"passes through {_first_site(events.opaque, own) or 'an operation not understood'}"
    index, (k, b, _) = influenced[0]
    what = "key" if k & key_bit else "count"
    return "unknown", f"the {what} reaches output {index} without random-bit generation"


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
        site = _first_site(events.draws, 1 << i)
        if site is not None:
            keys.append({"name": instr.name, "dims": list(instr.shape.dims), "site": site, "used": bool(used >> i & 1)})
    return keys


def _key_shaped_literal(instr: Instruction) -> bool:
    dims = instr.shape.dims
    return instr.opcode == "constant" and instr.shape.dtype == "u32" and bool(dims) and dims[-1] in (2, 4)


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
