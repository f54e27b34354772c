"""How match.py pairs the instructions and computations of two HLO modules: structural fingerprints, then the
passes that narrow what is left (match.py's doc, steps 2 to 5).

Every instruction gets a fingerprint (opcode, shape, semantic attributes, the fingerprints of its operands and of
the computations it calls: a Merkle hash, so two instructions with one fingerprint compute the same thing from the
same parameters; an entry parameter fingerprints as its pair's key, so a renamed one fingerprints as its partner).
``Matcher`` pairs computations from the entries down, and within each pair of computations runs the passes: exact
subgraphs, top-down from matched users, bottom-up from matched operands, identical leftovers in order. Reading the
differences off the pairs is match.py's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from hlo_audit.hlo.json_attrs import canonical_attr_value
from hlo_audit.hlo.kernels import is_kernel_call, kernel_digest
from hlo_audit.hlo.normalize import COMMUTATIVE, VOLATILE_ATTRS, call_graph_postorder
from hlo_audit.hlo.shapes import Shape, with_default_layout
from hlo_audit.hlo.text import COMPUTATION_ATTRS, Computation, HloModule, Instruction, strip_number_suffix

# Ops that pass one value on in another form: a top-down match looks through one inserted or removed between a
# pair and the operand it wraps (a convert added before a dot, a copy XLA dropped).
WRAPPERS = frozenset({"convert", "bitcast", "bitcast-convert", "copy", "reshape", "transpose", "broadcast",
                      "reduce-precision", "opt-barrier"})
# Elementwise ops: one may become another in place (tanh -> sine, add -> subtract) and still be the same value's
# instruction; any other opcode changed is an instruction removed and another added.
ELEMENTWISE = frozenset({
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "compare", "complex", "cosine", "count-leading-zeros",
    "divide", "erf", "exponential", "exponential-minus-one", "floor", "imag", "is-finite", "log", "log-plus-one",
    "logistic", "maximum", "minimum", "multiply", "negate", "not", "or", "popcnt", "power", "real", "remainder",
    "round-nearest-afz", "round-nearest-even", "rsqrt", "select", "shift-left", "shift-right-arithmetic",
    "shift-right-logical", "sign", "sine", "sqrt", "subtract", "tan", "tanh", "xor",
})
# Attributes that order instructions or say where they came from, not what they compute (a collective's
# ``channel_id`` numbers it among the module's collectives: one added renumbers every one after it).
_NOT_SEMANTIC = VOLATILE_ATTRS | {"control-predecessors", "channel_id"}
_MISSING = hash("<no operand>")  # an operand RNG-state stripping replaced (rng.RNG_VALUE)
# A value used by more than this many instructions (a shared constant, an input) says little about which of its
# users is which: the bottom-up step does not look at all of them.
_MAX_USERS_SEEN = 64
_ROUNDS = 4

_CANONICAL_SHAPES: dict[str, str] = {}


def canonical_shape(shape: Shape) -> str:
    """The shape with XLA's default layout where it has none (``f32[4]`` and ``f32[4]{0}`` are one shape)."""
    text = _CANONICAL_SHAPES.get(shape.text)
    if text is None:
        text = _CANONICAL_SHAPES[shape.text] = with_default_layout(shape)
    return text


class MatchSide:
    """One module as the matcher reads it: fingerprints, heights, users, each instruction's computation."""

    def __init__(self, module: HloModule, param_keys: dict[int, object]):
        self.module = module
        self.param_keys = param_keys  # entry parameter number -> a key both sides share for a pair
        self.fp: dict[int, int] = {}
        self.own: dict[int, tuple] = {}
        self.comp_fp: dict[str, int] = {}
        self._attrs: dict[int, tuple] = {}
        self._owns: dict[tuple, tuple] = {}
        # What only a computation matched instruction by instruction needs, made when it is (``prepare``,
        # ``users_of``).
        self.order: dict[int, int] = {}
        self.users: dict[int, list[tuple[Instruction, int]]] = {}
        self._prepared: set[str] = set()
        self._users_made: set[str] = set()
        for comp in call_graph_postorder(module):
            self._fingerprint(comp)

    @staticmethod
    def operands(instr: Instruction, comp: Computation) -> list[Instruction | None]:
        by_name = comp.by_name
        return [by_name.get(ref) for ref in instr.operands]

    def _fingerprint(self, comp: Computation) -> None:
        fp, own_of, comp_fp = self.fp, self.own, self.comp_fp
        by_name = comp.by_name
        read: set[str] = set()
        owns = self._owns
        for instr in comp.instructions:  # operands come first (the parser checks it)
            key = id(instr)  # one int object for both tables (a module of 400,000 instructions: 13 MB a side)
            own = self._own(instr, comp.is_entry)
            own = own_of[key] = owns.setdefault(own, own)  # equal descriptions shared (most are repeats)
            operand_fps = [fp[id(by_name[ref])] if ref in by_name else _MISSING for ref in instr.operands]
            read.update(instr.operands)
            if instr.opcode in COMMUTATIVE:
                operand_fps.sort()
            callees = tuple(comp_fp.get(c, 0) for c in instr.called_computations()) \
                if not COMPUTATION_ATTRS.isdisjoint(instr.attrs) else ()
            fp[key] = hash((own, callees, tuple(operand_fps)))
        # The root's subgraph, and what nothing reads (a host callback, a send: side effects hang off no user).
        root = comp.root
        unread = sorted(fp[id(i)] for i in comp.instructions if i is not root and i.name not in read)
        comp_fp[comp.name] = hash((fp[id(root)], tuple(unread),
                                   tuple(canonical_shape(p.shape) for p in comp.parameters),
                                   tuple(sorted(comp.attrs.items()))))

    def prepare(self, comp: Computation) -> None:
        """Positions of one computation's instructions (for tallest first: an operand comes before its users, so the
        later an instruction, the more it holds below it; and for ties)."""
        if comp.name in self._prepared:
            return
        self._prepared.add(comp.name)
        order = self.order
        for position, instr in enumerate(comp.instructions):
            order[id(instr)] = position

    def users_of(self, instr: Instruction, comp: Computation) -> list[tuple[Instruction, int]]:
        """The instructions of ``comp`` reading ``instr``, with the operand position (made for ``comp`` at first
        use: only the bottom-up step asks)."""
        if comp.name not in self._users_made:
            self._users_made.add(comp.name)
            users, by_name = self.users, comp.by_name
            for user in comp.instructions:
                for pos, ref in enumerate(user.operands):
                    operand = by_name.get(ref)
                    if operand is not None:
                        users.setdefault(id(operand), []).append((user, pos))
        return self.users.get(id(instr), [])

    def fused_root(self, fusion: Instruction) -> str:
        """The opcode a fusion's body ends in: what it computes (a dot, a convert, a reduce), its own opcode aside."""
        body = self.module.computations.get(next(iter(fusion.called_computations()), ""))
        return body.root.opcode if body is not None else ""

    def _own(self, instr: Instruction, in_entry: bool) -> tuple:
        """What an instruction is apart from its operands and callees: opcode, shape, attributes, literal (an entry
        parameter: its pair's key, so that a renamed parameter fingerprints as its partner)."""
        literal = instr.literal
        if instr.opcode == "parameter" and in_entry:
            literal = self.param_keys.get(instr.parameter_number, ("unpaired", instr.parameter_number))
        return instr.opcode, canonical_shape(instr.shape), self._semantic_attrs(instr), literal

    def _semantic_attrs(self, instr: Instruction) -> tuple:
        attrs = instr.attrs
        if not attrs:
            return ()
        key = id(attrs)  # the parser shares one dict among instructions with the same attribute text
        cached = self._attrs.get(key)
        if cached is None:
            kernel = is_kernel_call(instr)
            cached = self._attrs[key] = tuple(sorted(
                (k, f"<kernel {kernel_digest(instr)}>" if kernel and k == "backend_config" else canonical_attr_value(v))
                for k, v in attrs.items() if k not in _NOT_SEMANTIC and k not in COMPUTATION_ATTRS))
        return cached


class Matcher:
    """Pairs two modules' computations and, within each pair, their instructions (module doc)."""

    def __init__(self, old: MatchSide, new: MatchSide):
        self.old, self.new = old, new
        self.o2n: dict[int, Instruction] = {}
        self.n2o: dict[int, Instruction] = {}
        self.pending: list[tuple[Instruction, Instruction]] = []  # pairs whose operands are still to be paired
        self.comp_pairs: dict[str, str] = {}  # old -> new, matched instruction by instruction
        self.comp_pairs_new: dict[str, str] = {}
        self.identical_old: set[str] = set()  # computations with an identical partner
        self.identical_new: set[str] = set()
        self.queue: list[tuple[Computation, Computation]] = []
        # A fused computation's pair -> the two fusions that call it, with their computations: whose operands say
        # which parameter is which (``pair_fused_parameters``).
        self.fusions: dict[str, tuple[Instruction, Instruction, Computation, Computation]] = {}

    # -- pairs -------------------------------------------------------------------------------------------------

    def pair(self, a: Instruction, b: Instruction, exact: bool) -> None:
        self.o2n[id(a)] = b
        self.n2o[id(b)] = a
        if exact:
            self.descend(a, b)
        else:
            self.pending.append((a, b))

    def descend(self, a: Instruction, b: Instruction) -> None:
        """Pair the subgraphs under two instructions of one fingerprint, operand by operand."""
        old, new = self.old, self.new
        stack = [(a, b)]
        while stack:
            x, y = stack.pop()
            xs = old.operands(x, self.a)
            ys = new.operands(y, self.b)
            if x.opcode in COMMUTATIVE:
                xs = sorted(xs, key=lambda i: old.fp[id(i)] if i is not None else _MISSING)
                ys = sorted(ys, key=lambda i: new.fp[id(i)] if i is not None else _MISSING)
            for u, v in zip(xs, ys):
                if u is None or v is None or id(u) in self.o2n or id(v) in self.n2o:
                    continue
                if old.fp[id(u)] == new.fp[id(v)]:
                    self.o2n[id(u)] = v
                    self.n2o[id(v)] = u
                    stack.append((u, v))

    # -- computations ------------------------------------------------------------------------------------------

    def pair_computations(self, a: Computation, b: Computation) -> None:
        if self.old.comp_fp[a.name] == self.new.comp_fp[b.name]:
            self.identical_old.add(a.name)
            self.identical_new.add(b.name)
            return
        if a.name in self.comp_pairs or b.name in self.comp_pairs_new:
            return
        self.comp_pairs[a.name] = b.name
        self.comp_pairs_new[b.name] = a.name
        self.queue.append((a, b))

    def run(self) -> None:
        old_module, new_module = self.old.module, self.new.module
        self.pair_computations(old_module.entry, new_module.entry)
        while True:
            while self.queue:
                self.match_computation(*self.queue.pop())
            if not self.pair_leftover_computations():
                break

    def pair_leftover_computations(self) -> bool:
        """Computations no pair reached: identical ones pair; then one of a kind (the name's words) each side."""
        old_left = [c for c in self.old.module.computations.values() if not self.covered_old(c.name)]
        new_left = [c for c in self.new.module.computations.values() if not self.covered_new(c.name)]
        if not old_left or not new_left:
            return False
        # Identical ones, a group of one fingerprint at a time (jax repeats one reducer thousands of times).
        old_by_fp: dict[int, list[Computation]] = defaultdict(list)
        new_by_fp: dict[int, list[Computation]] = defaultdict(list)
        for c in old_left:
            old_by_fp[self.old.comp_fp[c.name]].append(c)
        for c in new_left:
            new_by_fp[self.new.comp_fp[c.name]].append(c)
        progress = False
        for fp in old_by_fp.keys() & new_by_fp.keys():
            self.identical_old.update(c.name for c in old_by_fp[fp])
            self.identical_new.update(c.name for c in new_by_fp[fp])
            progress = True
        old_kinds: dict[tuple, list[Computation]] = defaultdict(list)
        new_kinds: dict[tuple, list[Computation]] = defaultdict(list)
        for c in old_left:
            if not self.covered_old(c.name):
                old_kinds[_kind(c)].append(c)
        for c in new_left:
            if not self.covered_new(c.name):
                new_kinds[_kind(c)].append(c)
        for kind, olds in old_kinds.items():
            news = new_kinds.get(kind, [])
            if len(olds) == 1 and len(news) == 1:
                self.pair_computations(olds[0], news[0])
                progress = True
        return progress and bool(self.queue)

    def covered_old(self, name: str) -> bool:
        return name in self.comp_pairs or name in self.identical_old

    def covered_new(self, name: str) -> bool:
        return name in self.comp_pairs_new or name in self.identical_new

    # -- instructions ------------------------------------------------------------------------------------------

    def match_computation(self, a: Computation, b: Computation) -> None:
        old, new = self.old, self.new
        self.a, self.b = a, b  # the computations every pair made below belongs to
        old.prepare(a)
        new.prepare(b)
        # Parameters of called computations by number; the entry's by their pairs (match_params), through their keys.
        if a.is_entry and b.is_entry:
            new_params = {new.own[id(p)][3]: p for p in b.parameters}
            for p in a.parameters:
                q = new_params.get(old.own[id(p)][3])
                if q is not None and id(q) not in self.n2o:
                    self.pair(p, q, exact=False)
        elif a.name in self.fusions:
            self.pair_fused_parameters(a, b, *self.fusions[a.name])
            # What reads the parameters pairs before the roots do: a root is no anchor where the fusion took in or
            # left out work (the loss's sum fused with a term it no longer adds: that add is gone, not the multiply
            # that is the root now).
            self.exact_unique(a, b)
            self.bottom_up(a, b)
        else:
            for p, q in zip(a.parameters, b.parameters):
                self.pair(p, q, exact=old.fp[id(p)] == new.fp[id(q)])
        if id(a.root) not in self.o2n and id(b.root) not in self.n2o:
            self.pair(a.root, b.root, exact=old.fp[id(a.root)] == new.fp[id(b.root)])
        self.exact_unique(a, b)
        for _ in range(_ROUNDS):
            before = len(self.o2n)
            self.top_down()
            self.bottom_up(a, b)
            self.top_down()
            self.exact_in_order(a, b)
            if len(self.o2n) == before:
                break
        for x in a.instructions:
            y = self.o2n.get(id(x))
            if y is not None and not COMPUTATION_ATTRS.isdisjoint(x.attrs) and \
                    not COMPUTATION_ATTRS.isdisjoint(y.attrs):
                self.pair_callees(x, y)

    def pair_callees(self, x: Instruction, y: Instruction) -> None:
        xs, ys = x.called_computations(), y.called_computations()
        old_comps, new_comps = self.old.module.computations, self.new.module.computations
        if len(xs) == len(ys):
            for u, v in zip(xs, ys):
                if u in old_comps and v in new_comps:
                    if x.opcode == y.opcode == "fusion" and u not in self.comp_pairs and v not in self.comp_pairs_new:
                        self.fusions[u] = (x, y, self.a, self.b)
                    self.pair_computations(old_comps[u], new_comps[v])
            return
        by_fp = {self.new.comp_fp[v]: v for v in ys if v in new_comps}
        for u in xs:
            v = by_fp.get(self.old.comp_fp.get(u))
            if v is not None:
                self.pair_computations(old_comps[u], new_comps[v])

    def pair_fused_parameters(self, a: Computation, b: Computation, x: Instruction, y: Instruction,
                              caller_a: Computation, caller_b: Computation) -> None:
        """A fused computation's parameters are its fusion's operands: parameter i of ``a`` is parameter j of ``b``
        where the fusions' operands i and j are partners. By number, an operand the fusion took in or left out
        shifts every parameter after it, and the match pairs a gradient's value with another's. Those whose
        operands have no partner pair by number among the rest, where their shapes agree."""
        old, new = self.old, self.new
        xs, ys = old.operands(x, caller_a), new.operands(y, caller_b)
        at = {id(v): j for j, v in enumerate(ys) if v is not None}
        by_number_b = {q.parameter_number: q for q in b.parameters}
        left = []
        for p in a.parameters:
            n = p.parameter_number
            u = xs[n] if n is not None and n < len(xs) else None
            j = at.get(id(self.o2n.get(id(u)))) if u is not None else None
            q = by_number_b.get(j) if j is not None else None
            if q is not None and id(q) not in self.n2o:
                self.pair(p, q, exact=False)
            else:
                left.append(p)
        for p in left:
            q = by_number_b.get(p.parameter_number)
            if q is not None and id(q) not in self.n2o and canonical_shape(p.shape) == canonical_shape(q.shape):
                self.pair(p, q, exact=False)

    def exact_unique(self, a: Computation, b: Computation) -> None:
        """Fingerprints found once on each side: pair them and their subgraphs, tallest first."""
        old, new = self.old, self.new
        old_by_fp = _group(a.instructions, old.fp)
        new_by_fp = _group(b.instructions, new.fp)
        unique = [(old.order[id(xs[0])], xs[0], new_by_fp[f][0]) for f, xs in old_by_fp.items()
                  if len(xs) == 1 and len(new_by_fp.get(f, ())) == 1]
        unique.sort(key=lambda t: -t[0])
        for _, x, y in unique:
            if id(x) not in self.o2n and id(y) not in self.n2o:
                self.pair(x, y, exact=True)

    def exact_in_order(self, a: Computation, b: Computation) -> None:
        """What is left with one fingerprint on both sides pairs in order (identical values: they compute the same
        thing from the same inputs, so any pairing of them is as good)."""
        old, new = self.old, self.new
        new_by_fp = _group((y for y in b.instructions if id(y) not in self.n2o), new.fp)
        for x in a.instructions:
            if id(x) in self.o2n:
                continue
            ys = new_by_fp.get(old.fp[id(x)])
            while ys and id(ys[0]) in self.n2o:
                ys.pop(0)
            if ys:
                self.pair(x, ys.pop(0), exact=True)

    def top_down(self) -> None:
        """Operands of paired instructions at the same position, where they are alike (module doc, step 3)."""
        old, new = self.old, self.new
        while self.pending:
            x, y = self.pending.pop()
            xs = old.operands(x, self.a)
            ys = new.operands(y, self.b)
            for u, v in self.aligned(x, xs, ys):
                if u is None or v is None or id(u) in self.o2n:
                    continue
                if id(v) not in self.n2o:
                    if old.fp[id(u)] == new.fp[id(v)]:
                        self.pair(u, v, exact=True)
                        continue
                    if self.alike(u, v):
                        self.pair(u, v, exact=False)
                        continue
                # One side wraps the other's value (a convert inserted before a dot, a copy removed).
                inner = self.unwrap(self.new, self.b, v)
                if inner is not None and id(inner) not in self.n2o and self.alike_or_same(u, inner):
                    self.pair(u, inner, exact=old.fp[id(u)] == new.fp[id(inner)])
                    continue
                inner = self.unwrap(self.old, self.a, u)
                if inner is not None and id(inner) not in self.o2n and id(v) not in self.n2o and \
                        self.alike_or_same(inner, v):
                    self.pair(inner, v, exact=old.fp[id(inner)] == new.fp[id(v)])

    def aligned(self, x: Instruction, xs: list, ys: list) -> Iterator[tuple]:
        """Operand pairs by position; a commutative op's, or a tuple's of another arity (a parameter added shifts
        the state's outputs), by what they are: partners first, then fingerprint, then opcode."""
        by_position = x.opcode not in COMMUTATIVE and not (x.opcode == "tuple" and len(xs) != len(ys))
        if by_position or len(xs) < 2:
            return zip(xs, ys)
        # Indices of ``ys`` still free, by identity and by fingerprint, in order (a root tuple has thousands).
        by_identity: dict[int, list[int]] = defaultdict(list)
        by_fp: dict[int, list[int]] = defaultdict(list)
        by_opcode: dict[str, list[int]] = defaultdict(list)
        for j, v in enumerate(ys):
            if v is not None:
                by_identity[id(v)].append(j)
                by_fp[self.new.fp[id(v)]].append(j)
                by_opcode[v.opcode].append(j)
        free = [v is not None for v in ys]

        def take(candidates: list[int] | None) -> int | None:
            while candidates:
                j = candidates.pop(0)
                if free[j]:
                    free[j] = False
                    return j
            return None

        pairs = []
        rest = []
        for u in xs:
            if u is None:
                continue
            partner = self.o2n.get(id(u))
            hit = take(by_identity.get(id(partner))) if partner is not None else None
            if hit is None:
                hit = take(by_fp.get(self.old.fp[id(u)]))
            if hit is None:
                rest.append(u)
            else:
                pairs.append((u, ys[hit]))
        for u in rest:
            hit = take(by_opcode.get(u.opcode))
            if hit is None and len(xs) == len(ys):
                hit = take([j for j, f in enumerate(free) if f][:1])
            if hit is not None:
                pairs.append((u, ys[hit]))
        return iter(pairs)

    @staticmethod
    def unwrap(side: MatchSide, comp: Computation, instr: Instruction) -> Instruction | None:
        """The value ``instr`` passes on in another form (a convert, a copy; compiled, a fusion of one of those)."""
        if len(instr.operands) != 1 or (side.fused_root(instr) if instr.opcode == "fusion" else instr.opcode) \
                not in WRAPPERS:
            return None
        return comp.by_name.get(instr.operands[0])

    def alike(self, u: Instruction, v: Instruction) -> bool:
        """The same kind of instruction in the same place: the same opcode and dims (a parameter: the same number;
        a tuple: the same arity), or an elementwise opcode changed into another in place (also the same number of
        operands). Another dims is left to the bottom-up step, which has the operands' word for it: by position
        alone, a value of the optimizer's state pairs with its neighbour's once a parameter is added."""
        if u.shape.dims != v.shape.dims or u.shape.is_tuple != v.shape.is_tuple or \
                len(u.shape.elements) != len(v.shape.elements):
            return False
        if u.opcode == v.opcode:
            return (u.opcode != "parameter" or u.literal == v.literal) and self.same_fused(u, v)
        return u.opcode in ELEMENTWISE and v.opcode in ELEMENTWISE and len(u.operands) == len(v.operands)

    def alike_or_same(self, u: Instruction, v: Instruction) -> bool:
        return self.old.fp[id(u)] == self.new.fp[id(v)] or (
            u.opcode == v.opcode and u.opcode != "parameter" and u.shape.dims == v.shape.dims and self.same_fused(u, v))

    def same_fused(self, u: Instruction, v: Instruction) -> bool:
        """Two fusions whose bodies end in the same op (a dot's fusion is no convert's), or any other two."""
        return u.opcode != "fusion" or self.old.fused_root(u) == self.new.fused_root(v)

    def bottom_up(self, a: Computation, b: Computation) -> None:
        """Each unpaired instruction whose operands are paired: the unpaired user of their partners with its
        opcode that agrees on the most operand positions (module doc, step 4)."""
        old, new = self.old, self.new
        for x in a.instructions:
            if id(x) in self.o2n or not x.operands:
                continue
            commutative = x.opcode in COMMUTATIVE
            # A fusion is whatever XLA fused: its opcode says little, but a fusion of several results (an argmax's
            # value and index) is not one of a single result.
            votes: dict[int, list] = {}
            for pos, u in enumerate(old.operands(x, a)):
                v = self.o2n.get(id(u)) if u is not None else None
                if v is None:
                    continue
                users = new.users_of(v, b)
                if len(users) > _MAX_USERS_SEEN:
                    continue
                for user, at in users:  # users of b's instructions are b's
                    if (at == pos or commutative) and user.opcode == x.opcode and id(user) not in self.n2o and \
                            not (x.opcode == "fusion" and user.shape.is_tuple != x.shape.is_tuple):
                        entry = votes.setdefault(id(user), [0, user])
                        entry[0] += 1
            if not votes:
                continue
            fp, own, order = old.fp[id(x)], old.own[id(x)], old.order[id(x)]
            _, best = max(votes.values(), key=lambda e: (e[0], new.fp[id(e[1])] == fp, new.own[id(e[1])] == own,
                                                         -abs(new.order[id(e[1])] - order)))
            self.pair(x, best, exact=new.fp[id(best)] == fp)

    # -- what the pairs add up to ------------------------------------------------------------------------------

    def same_callees(self, xs: list[str], ys: list[str]) -> bool:
        """Whether two instructions call each other's computations: paired, or identical."""
        old_fp, new_fp = self.old.comp_fp, self.new.comp_fp
        return len(xs) == len(ys) and all(self.comp_pairs.get(u) == v or old_fp.get(u) == new_fp.get(v)
                                          for u, v in zip(xs, ys))

    def matched(self) -> int:
        """Instructions paired, entry parameters aside: in computations matched instruction by instruction, and
        every one of the identical computations."""
        old = self.old
        paired = 0
        for name in self.comp_pairs:
            comp = old.module.computations[name]
            paired += sum(1 for x in comp.instructions
                          if id(x) in self.o2n and not (comp.is_entry and x.opcode == "parameter"))
        return paired + sum(counted_instructions(old.module.computations[name]) for name in self.identical_old
                            if name not in self.comp_pairs)

    def computation_pairs(self) -> list[tuple[str | None, str | None]]:
        pairs: list[tuple[str | None, str | None]] = list(self.comp_pairs.items())
        pairs += [(name, None) for name in self.old.module.computations if not self.covered_old(name)]
        pairs += [(None, name) for name in self.new.module.computations if not self.covered_new(name)]
        return pairs


def counted_instructions(comp: Computation) -> int:
    """A computation's instructions as the match counts them: the entry's parameters are parameter pairs."""
    return len(comp.instructions) - (len(comp.parameters) if comp.is_entry else 0)


def _group(instructions, fps: dict[int, int]) -> dict[int, list[Instruction]]:
    groups: dict[int, list[Instruction]] = defaultdict(list)
    for instr in instructions:
        groups[fps[id(instr)]].append(instr)
    return groups


def _kind(comp: Computation) -> tuple:
    """A computation's kind for pairing leftovers: its name's words (counters dropped) and its parameter count."""
    words = "".join(ch for ch in strip_number_suffix(comp.name) if not ch.isdigit()).strip("._-")
    return words, len(comp.parameters), comp.is_entry


