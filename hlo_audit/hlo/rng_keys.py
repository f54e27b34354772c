"""Keys by value: where a step draws random bits from a literal key, or from one key twice (``key_report``).

jax's own key-reuse checker (``jax.experimental.key_reuse``, the ``jax_debug_key_reuse`` flag) is the reference:
``random_bits`` and ``split`` consume a key, ``fold_in`` does not (it makes a new key of the old one and its data),
and a key consumed twice draws the same bits twice: two dropouts given one key drop the same units. Two hazards
follow, each a regression of its own in the gate (``rng_keys``):

* a **literal key**: random bits drawn from a key computed from constants alone (``PRNGKey(0)`` inside the step,
  a key the jitted function closes over): no entry parameter upstream, so every call draws the same bits;
* a **reused key**: one key value consumed by two draws (two ``bernoulli`` calls on it, a ``split`` and a draw, or a
  draw inside a loop from a key the loop carries unchanged: every iteration draws the same bits).

"The same key value" is global value numbering over the whole module: every value is a token, interned from its
opcode, its attributes and its operands' tokens, so two instructions that compute the same thing from the same
inputs are the same token whatever their names (one key read through two sharding annotations, sliced the same way
twice). The module's entry parameters, loop-varying state and values from outside the program (infeed) are tokens
of their own. A key a draw reads is the last key-shaped value (``u32[..., 2]``, ``u32[..., 4]``) on the chain of
slices and reshapes into its ``threefry2x32`` halves, so ``split``'s two halves are two keys.

What is not reuse, by construction:

* jax's own computations are opaque where they must be: ``threefry2x32`` (its rounds loop, its rotation constants)
  and ``fold_in`` are black boxes; the draws one call of jax.random's functions makes (``_bernoulli`` through
  ``_uniform``, ``_threefry_split``) count as one draw of that call, placed at it;
* a draw in a loop from a key that varies per iteration (a scanned stack's per-layer key, ``fold_in(key, i)``) is one
  draw per iteration of a different key; only a key the loop leaves unchanged is drawn ``trips`` times;
* the branches of a ``conditional`` are alternatives (their draws count as the most any branch makes);
* an ``opt-barrier``'s results are values of their own: a rematerialized layer's backward pass draws the bits its
  forward pass drew, from the key read back through its barrier, by design.

One mistake is one hazard: a key computed from another hazard's key of the same kind (the keys split from a key drawn
twice are drawn twice because it is; those split from a literal key are literal because it is) is its consequence,
not listed. jax's functions are known by name whatever specialization MLIR renamed (``threefry2x32_1``,
``_bernoulli_11``: ``rng_flow.function_name``).

Where jax's random computations are not calls (an optimized dump inlines and fuses them) no draw is seen: nothing is
reported there, never a false alarm. Stages optimized and compiled therefore read the keys of the module jax hands
XLA (``stages.program.keys_before_xla``), kept beside XLA's text.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from hlo_audit.hlo.changes import LITERAL_KEY, LOOP_KEY, REUSED_KEY, Action, Change, ChangeKind, Place
from hlo_audit.hlo.locations import Locations, Places
from hlo_audit.hlo.loops import trip_count
from hlo_audit.hlo.normalize import computation_words
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.rng_flow import (
    PASS_THROUGH_CUSTOM_CALLS,
    called_closure,
    function_name,
    is_fold_in,
    key_shaped,
    random_computations,
)
from hlo_audit.hlo.shapes import Shape
from hlo_audit.hlo.text import Computation, HloModule, Instruction, split_name_list

LITERAL, REUSED = "literal", "reused"

# A random-bit generator whose first two operands are the key's halves (jax's threefry2x32 as a call of its own, named
# as ``function_name`` reads it, or the GPU kernel's custom call); rng-bit-generator reads its key (state) as operand 0.
_THREEFRY = re.compile(r"_*(threefry2x32|philox\w*)", re.IGNORECASE)
_THREEFRY_CUSTOM_CALL = re.compile(r"threefry2x32|philox", re.IGNORECASE)
# jax.random's samplers beyond the ones rng_flow names (its list serves other readers): each a call of its own whose
# draws are one draw of the sampler's, placed where the model calls it. Whole names only (``_normal``, not a model's
# ``_normalize``).
_SAMPLERS = re.compile(r"_*(normal|normal_real|normal_complex|exponential|gamma\w*|beta|poisson\w*|dirichlet|laplace"
                       r"|logistic|cauchy|pareto|weibull_min|rademacher|maxwell|double_sided_maxwell|choice|permutation"
                       r"|shuffle|chisquare|generalized_normal|loggamma|lognormal|binomial|geometric|multinomial"
                       r"|multivariate_normal|orthogonal|ball|triangular)", re.IGNORECASE)
# Values from outside the program's inputs: each a value of its own, never a literal.
_OUTSIDE = frozenset({"rng-get-and-update-state", "rng", "infeed", "recv", "recv-done"})
_FORWARD = frozenset({"copy", "domain", "add-dependency", "async-update"})
# Ops through which a value is a view of its key (``key[0]`` as threefry reads it): the key stays the last
# key-shaped value before them.
_KEY_VIEWS = frozenset({"slice", "reshape", "bitcast", "convert", "bitcast-convert", "dynamic-slice", "transpose"})
# Attributes that say nothing of what a value is.
_NOT_SEMANTIC = frozenset({"metadata", "sharding", "frontend_attributes", "control-predecessors", "statistics",
                           "origin", "result_accuracy"})

Site = tuple[str, str]  # (computation, instruction) of a draw: jax.random's call where the draw is inside one


@dataclass(frozen=True)
class KeyHazard:
    """A literal key drawn from, or a key drawn from more than once (module doc)."""

    kind: str  # LITERAL | REUSED
    sites: tuple[Site, ...]  # the draws from the key, in module order (a site twice: a loop's or a called twice)
    draws: int  # draws per step from the key (a loop's trips counted)
    in_loop: bool  # drawn again on every iteration of a loop that carries it unchanged
    paths: tuple[int, ...]  # entry parameter numbers the key is computed from (none: a literal)
    # What the draws are whatever the module's names: each draw's computation and jax.random function (``main``,
    # ``bernoulli``): how two modules' hazards pair where renumbering or a digest renamed the instructions.
    signature: tuple[tuple[str, str], ...] = ()

    @property
    def site(self) -> Site:
        return self.sites[0]

    def to_record(self) -> dict:
        return {"kind": self.kind, "sites": [list(s) for s in self.sites], "draws": self.draws,
                "in_loop": self.in_loop, "params": list(self.paths)}


@dataclass(frozen=True)
class KeyReport:
    hazards: tuple[KeyHazard, ...] = ()
    complete: bool = True  # False where the module nests calls deeper than the analysis follows

    def of_kind(self, kind: str) -> tuple[KeyHazard, ...]:
        return tuple(h for h in self.hazards if h.kind == kind)

    @property
    def literal(self) -> tuple[KeyHazard, ...]:
        return self.of_kind(LITERAL)

    @property
    def reused(self) -> tuple[KeyHazard, ...]:
        return self.of_kind(REUSED)


# ---------------------------------------------------------------------------------------------------------------
# Value numbering
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Tokens:
    """Interned values and what each depends on: ``deps`` a bit per entry parameter (and one for outside data),
    ``loops`` the loop-varying state it is computed from, ``key`` the key it is a view of (or None)."""

    ids: dict[tuple, int] = field(default_factory=dict)
    deps: list[int] = field(default_factory=list)
    loops: list[frozenset[int]] = field(default_factory=list)
    key: list[int | None] = field(default_factory=list)

    def new(self, deps: int, loops: frozenset[int], keyed: bool, view_of: int | None = None) -> int:
        token = len(self.deps)
        self.deps.append(deps)
        self.loops.append(loops)
        self.key.append(token if keyed else view_of)
        return token

    def intern(self, what: tuple, operands: Sequence[int], keyed: bool, view: bool = False) -> int:
        ident = (what, tuple(operands))
        token = self.ids.get(ident)
        if token is None:
            deps, loops = 0, frozenset()
            for o in operands:
                deps |= self.deps[o]
                loops = loops | self.loops[o] if self.loops[o] else loops
            view_of = self.key[operands[0]] if view and operands else None
            token = self.ids[ident] = self.new(deps, loops, keyed, view_of)
        return token


def _leaves(value) -> list[int]:
    if isinstance(value, int):
        return [value]
    out: list[int] = []
    stack = [iter(value)]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif isinstance(item, int):
            out.append(item)
        else:
            stack.append(iter(item))
    return out


def _shaped(shape: Shape, leaf):
    """``leaf(index, array shape)`` at every array of ``shape``, in its tuple structure."""
    counter = iter(range(1 << 30))

    def build(s: Shape):
        return tuple(build(e) for e in s.elements) if s.is_tuple else leaf(next(counter), s)
    return build(shape)


def _descriptor(instr: Instruction, index: int = 0) -> tuple:
    shape = instr.shape.leaves()[index] if instr.shape.is_tuple else instr.shape
    attrs = tuple(sorted((k, v) for k, v in instr.attrs.items() if k not in _NOT_SEMANTIC))
    return (instr.opcode, shape.dtype, shape.dims, instr.literal, attrs, index)


# ---------------------------------------------------------------------------------------------------------------
# Draws
# ---------------------------------------------------------------------------------------------------------------

# token of the key drawn from -> [(site, draws)]; draws at one site, in one call, in order.
Draws = dict[int, list[tuple[Site, int]]]


def _add(into: Draws, more: Draws, times: int = 1) -> None:
    for token, sites in more.items():
        into.setdefault(token, []).extend((site, n * times) for site, n in sites)


def _most(branches: Sequence[Draws]) -> Draws:
    """The draws of alternatives: per key, the branch that draws from it most."""
    out: Draws = {}
    for token in {t for b in branches for t in b}:
        out[token] = max((b.get(token, []) for b in branches), key=lambda sites: sum(n for _, n in sites))
    return out


def _random(module: HloModule) -> frozenset[str]:
    """jax.random's computations (``rng_flow.random_computations``), its samplers (``_SAMPLERS``) and all they call."""
    samplers = [n for n in module.computations if _SAMPLERS.fullmatch(function_name(n))]
    return random_computations(module) | called_closure(module, samplers)


class _Keys:
    def __init__(self, module: HloModule):
        self.module = module
        self.tokens = _Tokens()
        self.random = _random(module)
        self.memo: dict[tuple, tuple[object, Draws]] = {}
        self.loop_memo: dict[tuple, tuple[object, Draws]] = {}  # (id of a while, its initial state) -> once
        self.loop_ids: dict[int, int] = {}  # id of a while -> the token marking what varies across its passes
        self.descriptors: dict[tuple, int] = {}
        self.by_instruction: dict[tuple[int, int], int] = {}  # (id of an instruction, leaf) -> its descriptor
        self.in_loop: set[int] = set()  # keys drawn again on every iteration of a loop
        self.outside_bit = 1 << max((p.parameter_number for p in module.entry.parameters), default=-1) + 1

    def entry(self) -> tuple[object, Draws]:
        inputs = []
        for instr in self.module.entry.parameters:
            n = instr.parameter_number
            inputs.append(_shaped(instr.shape, lambda i, s, n=n: self._param(n, i, s)))
        return self.run(self.module.entry, tuple(inputs))

    def _param(self, number: int, leaf: int, shape: Shape) -> int:
        ident = (("param", number, leaf), ())
        token = self.tokens.ids.get(ident)
        if token is None:
            token = self.tokens.ids[ident] = self.tokens.new(1 << number, frozenset(), key_shaped(shape))
        return token

    def run(self, comp: Computation, inputs: tuple) -> tuple[object, Draws]:
        memo_key = (comp.name, inputs)
        hit = self.memo.get(memo_key)
        if hit is not None:
            return hit
        values: dict[str, object] = {}
        draws: Draws = {}
        for instr in comp.instructions:
            values[instr.name] = self.instruction(comp, instr, values, inputs, draws)
        result = (values[comp.root.name], draws)
        self.memo[memo_key] = result
        return result

    def instruction(self, comp: Computation, instr: Instruction, values: dict, inputs: tuple, draws: Draws):
        op = instr.opcode
        if op == "parameter":
            n = instr.parameter_number
            return inputs[n] if n < len(inputs) else self.fresh(instr)
        operands = [values[ref] for ref in instr.operands]
        if op == "tuple":
            return tuple(operands)
        if op == "get-tuple-element":
            whole = operands[0]
            return whole[int(instr.attrs["index"])] if isinstance(whole, tuple) else self.fresh(instr)
        if op in _FORWARD or (op == "custom-call" and instr.custom_call_target in PASS_THROUGH_CUSTOM_CALLS
                              and len(operands) == 1):
            return operands[0]
        if op in _OUTSIDE:
            return _shaped(instr.shape, lambda i, s: self.tokens.new(self.outside_bit, frozenset(), key_shaped(s)))
        if op == "opt-barrier":  # a value of its own (module doc): remat reads its keys back through one
            return self.barrier(operands[0])
        site = (comp.name, instr.name)
        key_operands = self.key_operands(instr)
        if key_operands is not None:
            self.draw(operands, key_operands, site, draws)
            return self.generic(instr, operands)
        called = instr.called_computations()
        if op in ("call", "fusion") and len(called) == 1 and called[0] in self.module.computations:
            return self.call(comp, instr, called[0], operands, draws)
        if op == "while":
            return self.while_loop(comp, instr, operands[0], draws)
        if op == "conditional":
            return self.conditional(instr, operands, draws)
        return self.generic(instr, operands)

    def key_operands(self, instr: Instruction) -> tuple[int, ...] | None:
        """The operands holding the key of a random-bit generation (module doc); None for anything else."""
        if instr.opcode == "rng-bit-generator":
            return (0,)
        if instr.opcode == "custom-call" and _THREEFRY_CUSTOM_CALL.search(instr.custom_call_target):
            return (0, 1)
        if instr.opcode in ("call", "fusion"):
            called = instr.called_computations()
            if len(called) == 1 and _THREEFRY.fullmatch(function_name(called[0])) \
                    and len(instr.operands) == 4:
                return (0, 1)
        return None

    def draw(self, operands: list, key_operands: tuple[int, ...], site: Site, draws: Draws) -> None:
        keys = set()
        for i in key_operands:
            if i >= len(operands):
                return
            for leaf in _leaves(operands[i]):
                keys.add(self.tokens.key[leaf])
        if len(keys) == 1 and None not in keys:  # both halves of one key: anything else is no key jax draws from
            draws.setdefault(keys.pop(), []).append((site, 1))

    def fresh(self, instr: Instruction):
        return _shaped(instr.shape, lambda i, s: self.tokens.new(0, frozenset(), key_shaped(s)))

    def generic(self, instr: Instruction, operands: list):
        flat: list[int] = []
        for o in operands:
            if isinstance(o, int):
                flat.append(o)
            else:
                flat.extend(_leaves(o))
        view = instr.opcode in _KEY_VIEWS
        if not instr.shape.is_tuple:  # most values: no tuple to build
            return self.tokens.intern(self.descriptor(instr, 0), flat, key_shaped(instr.shape), view=view)
        return _shaped(instr.shape, lambda i, s: self.tokens.intern(self.descriptor(instr, i), flat, key_shaped(s),
                                                                    view=view))

    def descriptor(self, instr: Instruction, index: int) -> int:
        """What an instruction computes (``_descriptor``) as a number, once per instruction: equal descriptors of
        two instructions are one number, and interning hashes a small tuple."""
        ident = (id(instr), index)
        number = self.by_instruction.get(ident)
        if number is None:
            number = self.by_instruction[ident] = self.descriptors.setdefault(_descriptor(instr, index),
                                                                              len(self.descriptors))
        return number

    def barrier(self, value):
        def own(token: int) -> int:
            t = self.tokens
            return t.new(t.deps[token], t.loops[token], t.key[token] == token)
        if isinstance(value, int):
            return own(value)
        return tuple(self.barrier(v) for v in value)

    def call(self, comp: Computation, instr: Instruction, callee: str, operands: list, draws: Draws):
        if is_fold_in(callee):  # a new key of the key and the data: no draw (module doc)
            return self.generic(instr, operands)
        result, inner = self.run(self.module.computations[callee], tuple(operands))
        if callee in self.random and comp.name not in self.random:
            # One call of jax.random's functions: however many draws it makes inside, one draw of each key it
            # reads, placed at the call.
            site = (comp.name, instr.name)
            inner = {token: [(site, 1)] for token in inner}
        _add(draws, inner)
        return result

    def while_loop(self, comp: Computation, instr: Instruction, init, draws: Draws):
        """The loop's result and draws, once per loop and initial state: a loop nested in another's body is reached
        on each of the outer loop's passes (its fixed point and its last pass), and without this memo 300 nested
        loops cost 2**300 passes. The loop's identity and the values it leaves are functions of the instruction and
        its initial state, so equal inputs give equal tokens and the outer body's memo hits."""
        memo_key = (id(instr), init)
        hit = self.loop_memo.get(memo_key)
        if hit is None:
            mine: Draws = {}
            hit = self.loop_memo[memo_key] = (self._loop(comp, instr, init, mine), mine)
        result, mine = hit
        _add(draws, mine)
        return result

    def _loop(self, comp: Computation, instr: Instruction, init, draws: Draws):
        body = self.module.computations[instr.attrs["body"].strip().lstrip("%")]
        condition = self.module.computations[instr.attrs["condition"].strip().lstrip("%")]
        loop_id = self.loop_ids.get(id(instr))
        if loop_id is None:
            loop_id = self.loop_ids[id(instr)] = self.tokens.new(0, frozenset(), False)
        init_leaves = _leaves(init)
        deps = [self.tokens.deps[t] for t in init_leaves]
        for _ in range(4):  # the loop-varying state's dependencies, to a fixed point
            state = self.loop_state(init, init_leaves, deps, loop_id, invariant=set())
            out, _ = self.run(body, (state,))
            grown = [d | self.tokens.deps[t] for d, t in zip(deps, _leaves(out))]
            if grown == deps:
                break
            deps = grown
        invariant = {i for i, (s, o) in enumerate(zip(_leaves(state), _leaves(out))) if s == o}
        state = self.loop_state(init, init_leaves, deps, loop_id, invariant)
        out, inner = self.run(body, (state,))
        _, in_condition = self.run(condition, (state,))
        trips = trip_count(self.module, comp, instr)
        for token, sites in (*inner.items(), *in_condition.items()):
            if loop_id in self.tokens.loops[token]:
                _add(draws, {token: sites})  # a key of this iteration's
            else:  # a key the loop leaves unchanged: drawn again every iteration
                times = trips if trips is not None else 1
                if times > 1:
                    self.in_loop.add(token)
                _add(draws, {token: sites}, times)
        exits = iter(range(len(init_leaves)))
        whole = tuple(init_leaves)

        def leaf(token: int) -> int:  # what the loop leaves in a varying element: a value of its own
            i = next(exits)
            if i in invariant:
                return token
            t = self.tokens
            ident = (("loop exit", loop_id, i, whole), ())
            if ident not in t.ids:
                t.ids[ident] = t.new(deps[i], t.loops[token], t.key[token] == token)
            return t.ids[ident]
        return self.rebuild(init, leaf)

    def loop_state(self, init, init_leaves: list[int], deps: list[int], loop_id: int, invariant: set[int]):
        position = iter(range(len(init_leaves)))

        def leaf(token: int) -> int:
            i = next(position)
            if i in invariant:
                return token
            t = self.tokens
            return self._varying(loop_id, i, deps[i], t.key[token] == token, t.loops[token])
        return self.rebuild(init, leaf)

    def _varying(self, loop_id: int, position: int, deps: int, keyed: bool, outer: frozenset[int]) -> int:
        ident = (("loop state", loop_id, position, deps), ())
        token = self.tokens.ids.get(ident)
        if token is None:
            token = self.tokens.ids[ident] = self.tokens.new(deps, outer | {loop_id}, keyed)
        return token

    @staticmethod
    def rebuild(value, leaf):
        if isinstance(value, int):
            return leaf(value)
        return tuple(_Keys.rebuild(v, leaf) for v in value)

    def conditional(self, instr: Instruction, operands: list, draws: Draws):
        if "branch_computations" in instr.attrs:
            branches = split_name_list(instr.attrs["branch_computations"])
        else:
            branches = [instr.attrs["true_computation"].strip().lstrip("%"),
                        instr.attrs["false_computation"].strip().lstrip("%")]
        results, alternatives = [], []
        for name, argument in zip(branches, operands[1:]):
            out, inner = self.run(self.module.computations[name], (argument,))
            results.append(out)
            alternatives.append(inner)
        _add(draws, _most(alternatives))
        if results and all(r == results[0] for r in results):
            return results[0]
        flat = [t for o in (operands[0], *results) for t in _leaves(o)]
        return _shaped(instr.shape, lambda i, s: self.tokens.intern(("branches", instr.name, i), flat,
                                                                    key_shaped(s)))


def _site_words(module: HloModule, site: Site) -> tuple[str, str]:
    """A draw's computation and what it calls (``("main", "bernoulli")``), counters and digests dropped."""
    computation, name = site
    comp = module.computations.get(computation)
    instr = comp.by_name.get(name) if comp is not None else None
    called = instr.called_computations() if instr is not None else []
    what = computation_words(called[0]).lstrip("_") if called else instr.opcode if instr is not None else ""
    return ("main" if comp is not None and comp.is_entry else computation_words(computation), what)


def key_report(module: HloModule) -> KeyReport:
    """The literal keys a module draws from and the keys it draws from twice (module doc)."""
    keys = _Keys(module)
    try:
        _, draws = keys.entry()
    except RecursionError:  # calls nested past Python's recursion: say so rather than guess
        return KeyReport(complete=False)
    order = {name: i for i, name in enumerate(module.computations)}
    literal = {token for token in draws if not keys.tokens.deps[token]}
    reused = {token for token, sites in draws.items() if sum(n for _, n in sites) > 1}
    consequences = {LITERAL: _derived_from_another(keys.tokens, literal),
                    REUSED: _derived_from_another(keys.tokens, reused)}
    hazards = []
    for token, sites in draws.items():
        ordered = tuple(sorted({s for s, _ in sites}, key=lambda s: (order.get(s[0], 0), s[1])))
        total = sum(n for _, n in sites)
        deps = keys.tokens.deps[token]
        params = tuple(n for n in range(deps.bit_length()) if deps >> n & 1 and 1 << n != keys.outside_bit)
        signature = tuple(_site_words(module, site) for site in ordered)
        if token in literal and token not in consequences[LITERAL]:
            hazards.append(KeyHazard(LITERAL, ordered, total, token in keys.in_loop, (), signature))
        if token in reused and token not in consequences[REUSED]:
            hazards.append(KeyHazard(REUSED, ordered, total, token in keys.in_loop, params, signature))
    hazards.sort(key=lambda h: (h.kind, order.get(h.site[0], 0), h.site[1]))
    return KeyReport(tuple(hazards))


def _derived_from_another(tokens: _Tokens, hazardous: set[int]) -> set[int]:
    """The keys of ``hazardous`` (all literal, or all reused) computed from another of them: the consequences of one
    mistake. A key consumed twice gives the same keys twice (two layers handed one key split it alike, and every key
    split from it is drawn again), so only the key first consumed twice is the mistake, as jax's checker names only
    the first key consumed again; the keys split from a literal key are literal because it is. Followed through the
    operands value numbering interned; a loop's state and a barrier's results are values of their own, so a hazard
    across them is never folded into another's."""
    if len(hazardous) < 2:
        return set()
    operands: dict[int, tuple[int, ...]] = {token: ident[1] for ident, token in tokens.ids.items() if ident[1]}
    derived = set()
    for token in hazardous:
        seen, stack = {token}, list(operands.get(token, ()))
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            if t in hazardous:
                derived.add(token)
                break
            seen.add(t)
            stack.extend(operands.get(t, ()))
    return derived


# ---------------------------------------------------------------------------------------------------------------
# Placed, and against another module
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlacedHazard:
    """A hazard with its draws placed (computation, jax's op_name, source ``file:line``) and the state paths its key
    comes from: what the report and the gate say."""

    hazard: KeyHazard
    places: tuple[Place, ...]
    paths: tuple[str, ...]

    @property
    def subject(self) -> str:
        if self.hazard.kind == LITERAL:
            return LITERAL_KEY
        return LOOP_KEY if self.hazard.in_loop and len(self.places) == 1 else REUSED_KEY

    def to_record(self) -> dict:
        """JSON, all of it: a stage keeps it beside a text that cannot say it (``stages.program.keys_before_xla``) and a
        golden keeps it to compare with (``key_changes``)."""
        h = self.hazard
        return {**h.to_record(), "signature": [list(s) for s in h.signature],
                "places": [p.to_record() for p in self.places], "paths": list(self.paths)}

    @classmethod
    def from_record(cls, r: Mapping) -> PlacedHazard:
        hazard = KeyHazard(r["kind"], tuple(tuple(s) for s in r["sites"]), r["draws"], r["in_loop"],
                           tuple(r["params"]), tuple(tuple(s) for s in r["signature"]))
        return cls(hazard, tuple(Place.from_record(p) for p in r["places"]), tuple(r["paths"]))


def hazard_record_problem(record) -> str | None:
    """Why ``record`` is not a ``PlacedHazard.to_record`` (a golden's claim, checked before it is read), or None."""
    def pairs(v) -> bool:
        return isinstance(v, list) and all(isinstance(s, list) and len(s) == 2 and all(isinstance(x, str) for x in s)
                                           for s in v)

    def strings(v) -> bool:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)

    def place(v) -> bool:
        return isinstance(v, dict) and all(isinstance(v.get(k), str) for k in ("computation", "op_name", "source")) \
            and strings(v.get("paths"))

    checks = {"kind": lambda v: v in (LITERAL, REUSED), "sites": pairs, "signature": pairs,
              "draws": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
              "in_loop": lambda v: isinstance(v, bool),
              "params": lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                                              for x in v),
              "places": lambda v: isinstance(v, list) and all(place(p) for p in v), "paths": strings}
    if not isinstance(record, dict):
        return "not an object"
    unknown = next((k for k in record if k not in checks), None)
    if unknown is not None:
        return f"unknown key {unknown!r}"
    return next((f"{k!r} is missing or malformed" for k, ok in checks.items() if k not in record or not ok(record[k])),
                None)


def placed(report: KeyReport, module: HloModule, params: Sequence[EntryParam],
           places: Places | None = None) -> tuple[PlacedHazard, ...]:
    """``report``'s hazards placed in ``module``: from each draw's metadata, else from ``places`` (a canonical text's
    names -> op_name and source, as a stage kept them)."""
    locations = Locations(module)
    by_index = {p.index: p for p in params}
    out = []
    for h in report.hazards:
        where = []
        for computation, name in h.sites:
            comp = module.computations.get(computation)
            instr = comp.by_name.get(name) if comp is not None else None
            op_name, source = (instr.op_name, locations.of(instr)) if instr is not None else ("", "")
            if not (op_name or source) and places and (computation, name) in places:
                op_name, source = places[computation, name][:2]
            words = "main" if comp is not None and comp.is_entry else computation_words(computation)
            where.append(Place(words, op_name, source))
        paths = tuple(sorted({by_index[n].folded_path for n in h.paths if n in by_index}))
        out.append(PlacedHazard(h, tuple(where), paths))
    return tuple(out)


def same_draws(old: KeyReport, new: KeyReport) -> bool:
    """Whether two modules' draws are alike in what the bits they see are: both reports complete, and the same
    literal and reused keys (by kind, draws, and what draws where: ``KeyHazard.signature``). A module that strips to
    another's program is RNG bookkeeping beside it only then: a key handed on unsplit, or a literal key, strips to the
    program of a split per-step key."""
    def hazards(report: KeyReport) -> Counter:
        return Counter((h.kind, h.draws, h.in_loop, h.signature) for h in report.hazards)
    return old.complete and new.complete and hazards(old) == hazards(new)


def key_changes(old: KeyReport, new: tuple[PlacedHazard, ...]) -> list[Change]:
    """The hazards ``new`` has beyond ``old``'s, per kind, each a change placed at its draws (new ones first: those
    whose draws ``old`` has no hazard at, by the canonical names both texts give them); fewer, one change per kind."""
    changes = []
    for kind in (LITERAL, REUSED):
        before = old.of_kind(kind)
        after = [p for p in new if p.hazard.kind == kind]
        grown = len(after) - len(before)
        if grown > 0:
            for p in _fresh(before, after)[:grown]:
                changes.append(_added(p, len(before), len(after)))
        elif grown < 0:
            changes.append(Change(ChangeKind.RNG_KEYS, Action.REMOVED, LITERAL_KEY if kind == LITERAL else REUSED_KEY,
                                  count=-grown, before=str(len(before)), after=str(len(after))))
    return changes


def _fresh(before: Sequence[KeyHazard], after: Sequence[PlacedHazard]) -> list[PlacedHazard]:
    """``after``'s hazards, those ``before`` has no counterpart of first: by the draws' names, else by what they draw
    with where (``KeyHazard.signature``: a change elsewhere renames instructions in a canonical text)."""
    by_sites = {h.sites for h in before}
    by_signature = Counter(h.signature for h in before)
    fresh, known = [], []
    for p in after:
        if p.hazard.sites in by_sites:
            known.append(p)
        elif by_signature[p.hazard.signature] > 0:
            by_signature[p.hazard.signature] -= 1
            known.append(p)
        else:
            fresh.append(p)
    return fresh + known


def _added(p: PlacedHazard, before: int, after: int) -> Change:
    """A hazard the other module lacks: placed at its first draw (with the state its key comes from); the other
    draws' places are its groups (``file:line``, else op_name, else computation)."""
    first = p.places[0]
    others = tuple((place.source or place.op_name or place.computation, 1) for place in p.places[1:])
    return Change(ChangeKind.RNG_KEYS, Action.ADDED, p.subject, replace(first, paths=p.paths), count=1,
                  per_step=p.hazard.draws, before=str(before), after=str(after), groups=others)
