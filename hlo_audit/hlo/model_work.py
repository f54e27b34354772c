"""Whether a step computes any of its model: its contractions, and which of them reach the step's outputs.

A gate compares what a step computes. A step that computes none of its model passes every comparison whatever the
model's code becomes: MaxText trains DeepSeek 3.2 in "dense warm-up" by default, where the main loss is 0 and the
lowered train step holds no dot at all, and a step whose loss is multiplied by 0 still lowers every dot of the
model, forward and backward, while none of them can move an output (issue 46). So this module counts, in one
module:

* its **contractions**: ``dot`` and ``convolution`` instructions, and custom calls that run a kernel (any target
  but the annotations XLA, jax and Shardy write for sharding, layouts and memory placement), in every computation;
* those that **reach** an output of the entry computation: walked back from its root through every operand and
  every computation an instruction calls (a loop's body and condition, a fusion, a reduction's function), stopping
  at values known to be zero. A value is known to be zero where it is a literal of zeros, a multiply or a
  contraction with a zero operand, a division of zero, a sum, select or reduction of zeros only, or a broadcast,
  reshape, slice, conversion (or the like) of a zero; what a parameter of a called computation holds is not known.
  A zero cuts its operands off: what feeds it cannot move the outputs.

A model that contracts nothing (weights applied elementwise: a scale, a bias) computes it all the same; what such a
step computes of its model is a value that reads both a weight and the step's data (an entry parameter of role
``input``) reaching an output (``mixes``): a step whose loss is a constant, its weights passed through an update of
zero, reads its weights and its data apart.

The cuts where the model is lost are kept (``zeroed``: the multiplies by a literal zero of a value that is not one),
so a finding can say where the loss was multiplied by 0. The analysis is conservative, so that a step it says computes
none of its model computes none: a zero carried through a loop's state is not followed (a scanned model multiplied by
0 inside its loop is not found), and a called computation reads every operand it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.text import Computation, HloModule, Instruction

# Custom calls that annotate rather than compute: sharding and its SPMD shape changes (Shardy's ``xla.sdy.*``: a
# MaxText step holds one ``xla.sdy.FuncResultSharding`` per output), layouts, host offloading.
ANNOTATION_PREFIXES = ("xla.sdy.", "SPMD")
ANNOTATIONS = frozenset({
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "LayoutConstraint", "MoveToHost", "MoveToDevice",
    "annotate_device_placement", "AllocateBuffer", "PartitionId", "X64Combine", "X64SplitLow", "X64SplitHigh",
})
CONTRACTIONS = frozenset({"dot", "convolution"})
# A zero in, the same zero out (of the operand named): shape, layout and dtype changes, and functions with f(0) = 0.
_KEEPS_ZERO = frozenset({
    "broadcast", "reshape", "transpose", "convert", "copy", "bitcast", "bitcast-convert", "slice", "dynamic-slice",
    "reverse", "negate", "abs", "sqrt", "tanh", "sine", "sign", "real", "imag", "copy-start", "copy-done",
})
# Zero where any of the first two operands is zero.
_ANY_ZERO = frozenset({"multiply", "dot", "convolution", "and"})
# Zero where every operand is zero.
_ALL_ZERO = frozenset({"add", "subtract", "maximum", "minimum", "concatenate", "reduce", "or", "pad", "clamp"})


@dataclass(frozen=True)
class ModelWork:
    """A module's contractions, those whose value reaches an output of the step, whether a value reading both a weight
    and the step's data reaches one (None: the step takes no data, or no weight), and the multiplies by a literal zero
    that cut values off ((computation, instruction) names of the module, in text order)."""

    contractions: int
    reaching: int
    mixes: bool | None = None
    zeroed: tuple[tuple[str, str], ...] = ()

    @property
    def computes_none(self) -> bool:
        """None of the model reaches the step's outputs: it holds contractions and none reaches one, or it holds
        none and no value reading both a weight and the step's data does."""
        if self.contractions:
            return self.reaching == 0
        return self.mixes is False


def is_contraction(instr: Instruction) -> bool:
    if instr.opcode in CONTRACTIONS:
        return True
    if instr.opcode != "custom-call":
        return False
    target = instr.custom_call_target
    return target not in ANNOTATIONS and not target.startswith(ANNOTATION_PREFIXES)


def model_work(module: HloModule, params: Sequence[EntryParam] = ()) -> ModelWork:
    """What of the model ``module`` computes (module doc); ``params``: its entry parameters with their roles (none
    given: ``mixes`` is not asked)."""
    known = {name: _zeros(comp) for name, comp in module.computations.items()}
    zeros = {name: z for name, (z, _) in known.items()}
    live: set[tuple[str, str]] = set()
    reached: set[str] = set()  # computations whose root is live
    stack = [module.entry.name]
    while stack:
        comp_name = stack.pop()
        if comp_name in reached or comp_name not in module.computations:
            continue
        reached.add(comp_name)
        comp = module.computations[comp_name]
        pending = [comp.root]
        while pending:
            instr = pending.pop()
            if (comp_name, instr.name) in live:
                continue
            live.add((comp_name, instr.name))
            if instr.name in zeros[comp_name]:
                continue  # a zero: nothing that feeds it can move the outputs
            pending += [comp.by_name[o] for o in instr.operands if o in comp.by_name]
            stack += instr.called_computations()
    contractions = [(c.name, i.name) for c in module.computations.values() for i in c.instructions
                    if is_contraction(i)]
    reaching = sum(1 for place in contractions if place in live and place[1] not in zeros[place[0]])
    # Where a zero is written into the program: a multiply by a literal zero of a value that is not one.
    zeroed = tuple((c.name, i.name) for c in module.computations.values() for i in c.instructions
                   if i.opcode == "multiply" and any(o in known[c.name][1] for o in i.operands)
                   and any(o not in zeros[c.name] for o in i.operands))
    return ModelWork(len(contractions), reaching, _mixes(module.entry, params, live, zeros[module.entry.name]), zeroed)


_WEIGHT, _DATA = 1, 2


def _mixes(entry: Computation, params: Sequence[EntryParam], live: set[tuple[str, str]],
           zero: set[str]) -> bool | None:
    """Whether a value of the entry computation that reaches an output (``live``, not a known zero) reads both a
    weight and the step's data; None where the step takes no weight or no data. A tuple is no value of its own, and
    a call reads all it is given (its reads are over-counted, never missed)."""
    kinds = {p.index: _WEIGHT if p.role == "weight" else _DATA if p.role == "input" else 0 for p in params}
    if _WEIGHT not in kinds.values() or _DATA not in kinds.values():
        return None
    reads: dict[str, int] = {}
    for instr in entry.instructions:
        if instr.name in zero:
            reads[instr.name] = 0
        elif instr.opcode == "parameter":
            reads[instr.name] = kinds.get(instr.parameter_number, 0)
        else:
            reads[instr.name] = 0
            for operand in instr.operands:
                reads[instr.name] |= reads.get(operand, 0)
            if (reads[instr.name] == _WEIGHT | _DATA and instr.opcode != "tuple"
                    and (entry.name, instr.name) in live):
                return True
    return False


def _zeros(comp: Computation) -> tuple[set[str], set[str]]:
    """The instructions of ``comp`` whose value is known to be zero (module doc), and of those the literal zeros
    (a constant of zeros, and what keeps it zero: its broadcast, conversion...)."""
    zero: set[str] = set()
    literal: set[str] = set()
    for instr in comp.instructions:  # operands are defined before their users
        ops = instr.operands
        if instr.opcode == "constant":
            known = _zero_literal(instr.literal)
            if known:
                literal.add(instr.name)
        elif instr.opcode in _KEEPS_ZERO:
            known = bool(ops) and ops[0] in zero
            if ops and ops[0] in literal:
                literal.add(instr.name)
        elif instr.opcode in _ANY_ZERO:
            known = any(o in zero for o in ops[:2])
        elif instr.opcode == "divide":
            known = bool(ops) and ops[0] in zero
        elif instr.opcode == "select":
            known = len(ops) == 3 and ops[1] in zero and ops[2] in zero
        elif instr.opcode in _ALL_ZERO:
            known = bool(ops) and all(o in zero for o in ops)
        else:
            known = False
        if known:
            zero.add(instr.name)
    return zero, literal


def _zero_literal(literal: str) -> bool:
    """A constant's literal that is zero throughout (``0``, ``-0``, ``{0, 0}``, ``false``); an elided one (``{...}``)
    is not known."""
    if "..." in literal:
        return False
    tokens = literal.replace("{", " ").replace("}", " ").replace(",", " ").split()
    if not tokens:
        return False
    for token in tokens:
        if token == "false":
            continue
        try:
            if float(token) != 0.0:
                return False
        except ValueError:
            return False
    return True
