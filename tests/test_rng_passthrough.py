"""RNG state through XLA's pass-through constructs: stripped where it goes, on real jax lowerings.

``strip_rng_state`` (hlo/rng.py) is what makes ``diff`` say ``rng-state-only``. Seed 001's fix on MaxText was judged
``changed (ops, shapes)`` because every rematerialized layer reads its streams back from an ``opt-barrier`` tuple
that the strip did not touch. Each construct here (tests/rng_constructs.py: remat, a hand-written barrier, fori_loop,
scan, cond, nested jit) carries RNG state beside the program's data; two steps that differ by RNG state only (one
stream per dropout or one shared, a never-drawn stream handed through or not) must strip to one canonical text, and
a change of the program inside the construct must not. The stripped module must still be a module: every tuple,
loop, branch and call agrees with what it passes on about its shape.
"""

from __future__ import annotations

import functools

import jax
import pytest

import rng_constructs
from hlo_audit.comparison import Structural
from hlo_audit.hlo.analysis import Analysis, analyze
from hlo_audit.hlo.diff import diff_modules
from hlo_audit.hlo.normalize import normalize
from hlo_audit.hlo.rng import RNG_VALUE, strip_rng_state
from hlo_audit.hlo.shapes import Shape, tuple_shape
from hlo_audit.hlo.text import HloModule
from rng_constructs import CONSTRUCTS, RNG_STATES, StepSpec
from xla_oracle import xla_counts

# The opcode each construct lowers to: the tests below hold only if the lowering really goes through it.
CONSTRUCT_OPCODE = {"remat": "opt-barrier", "barrier": "opt-barrier", "fori_loop": "while", "scan": "while",
                    "cond": "conditional", "call": "call"}
# Instructions that hand values on unchanged or to another computation: none may hold RNG state once stripped.
PASS_THROUGH = frozenset({"tuple", "get-tuple-element", "opt-barrier", "while", "conditional", "call", "parameter"})


@functools.cache
def _analysis(spec: StepSpec) -> Analysis:
    return analyze(rng_constructs.hlo_text(spec), spec.name)


def _stripped(a: Analysis) -> tuple[HloModule, str]:
    module, kept = strip_rng_state(a.module, a.params)
    return module, normalize(module, kept)


def _rng_params(a: Analysis) -> int:
    return sum(p.is_rng for p in a.params)


@pytest.mark.parametrize("construct", CONSTRUCTS)
def test_each_step_goes_through_its_construct_with_its_rng_state(construct):
    """The premise: the lowering holds the construct, and RNG state (u32: keys and counts) goes through it."""
    module = _analysis(StepSpec(construct, "private+idle")).module
    through = [(comp, i) for comp in module.computations.values() for i in comp.instructions
               if i.opcode == CONSTRUCT_OPCODE[construct]]
    assert through
    assert any("u32" in i.shape.text or any("u32" in comp.by_name[o].shape.text for o in i.operands)
               for comp, i in through)


@pytest.mark.parametrize("other", ["shared", "private+idle"])
@pytest.mark.parametrize("construct", CONSTRUCTS)
def test_steps_that_differ_by_rng_state_only_strip_to_one_text(construct, other, request):
    """One stream per dropout against one shared stream (seed 001), or against a never-drawn stream handed through
    beside them (seed 000): other RNG parameters, other keys through the construct, the same program."""
    if construct == "barrier" and jax.__version_info__ < (0, 11):
        # A known gap, strict so that closing it is noticed: jax 0.10 (Python 3.11's newest) hands a pred[] per
        # stream through the optimization barrier beside the stream's key and count, and strip_rng_state removes
        # the u32 state only; the two steps then differ by those pred[] operands ("changed", not
        # "rng-state-only").
        request.applymarker(pytest.mark.xfail(strict=True, reason="jax 0.10: a pred[] per RNG stream through "
                                                                  "opt-barrier is not stripped"))
    private, changed = _analysis(StepSpec(construct)), _analysis(StepSpec(construct, other))
    assert private.normalized != changed.normalized
    assert _stripped(private)[1] == _stripped(changed)[1]
    compared = Structural.of_analyses(private, changed)
    assert (compared.diff.verdict, compared.diff.changes) == ("rng-state-only", [])
    assert compared.params.by_dtype == {"u32": _rng_params(changed) - _rng_params(private)}
    assert diff_modules(changed, private).verdict == "rng-state-only"


@pytest.mark.parametrize("rngs", RNG_STATES)
@pytest.mark.parametrize("construct", CONSTRUCTS)
def test_a_change_inside_the_construct_stays_a_change(construct, rngs):
    """``sin`` for ``tanh`` inside the construct, with the same or other RNG state: changed, ops (and the shapes of
    the values the two derivatives compute), no parameter."""
    a, b = _analysis(StepSpec(construct, rngs)), _analysis(StepSpec(construct, "private", "sin"))
    assert _stripped(a)[1] != _stripped(b)[1]
    d = diff_modules(a, b)
    assert (d.verdict, d.changes) == ("changed", ["ops", "shapes"])


@pytest.mark.parametrize("rngs", RNG_STATES)
@pytest.mark.parametrize("construct", CONSTRUCTS)
def test_the_stripped_construct_holds_no_rng_state_and_still_fits_together(construct, rngs):
    """What the strip leaves: the construct itself (as many as read the step's data before), no u32 value handed
    through anything (keys, counts and random bits are the only u32 values these steps have), and shapes that agree
    across every tuple, loop, branch and call."""
    a = _analysis(StepSpec(construct, rngs))
    stripped, _ = _stripped(a)
    opcode = CONSTRUCT_OPCODE[construct]
    rng_params = {p.index for p in a.params if p.is_rng}
    assert _handing_on_data(stripped, opcode, set()) == _handing_on_data(a.module, opcode, rng_params) > 0
    assert [i.name for _, i in _reachable(stripped) if i.opcode in PASS_THROUGH and "u32" in i.shape.text] == []
    assert _mismatches(stripped) == []


def _handing_on_data(module: HloModule, opcode: str, rng_params: set[int]) -> int:
    """How many ``opcode`` instructions of the entry read the step's data: an entry parameter that is not RNG state,
    directly or not. (jax's threefry calls and loops read keys only: they go with the RNG state.)"""
    entry = module.entry
    data = {i.name for i in entry.parameters if i.parameter_number not in rng_params}
    for instr in entry.instructions:
        if any(o in data for o in instr.operands):
            data.add(instr.name)
    return sum(i.opcode == opcode and i.name in data for i in entry.instructions)


def _reachable(module: HloModule) -> list[tuple]:
    """(computation, instruction) for every instruction of the computations the entry calls, directly or not."""
    seen, stack = {module.entry.name}, [module.entry]
    found = []
    while stack:
        comp = stack.pop()
        found.extend((comp, i) for i in comp.instructions)
        for instr in comp.instructions:
            for callee in instr.called_computations():
                if callee not in seen:
                    seen.add(callee)
                    stack.append(module.computations[callee])
    return found


def _same(a: Shape | None, b: Shape | None) -> bool:
    """The same shape but for layouts (jax's own lowerings hand a transposed ``{0,1}`` to a ``{1,0}`` parameter)."""
    if a is None or b is None or a.is_tuple != b.is_tuple:
        return False
    if a.is_tuple:
        return len(a.elements) == len(b.elements) and all(map(_same, a.elements, b.elements))
    return (a.dtype, a.dims) == (b.dtype, b.dims)


def _mismatches(module: HloModule) -> list[str]:
    """Where a stripped module disagrees with itself about a shape: a tuple and its elements, an element read and
    the tuple it is read from, a call's operands and its callee's parameters, a loop's state, body and condition,
    a conditional's operands, branches and result, an opt-barrier and its operand."""
    wrong = []
    for comp in module.computations.values():
        def shape_of(ref):
            return None if ref == RNG_VALUE else comp.by_name[ref].shape

        for i in comp.instructions:
            operands = [shape_of(r) for r in i.operands]
            here = f"{comp.name}/{i.name}"
            if i.opcode == "tuple":
                if len(i.shape.elements) != len(operands) or not all(
                        o is None or _same(e, o) for e, o in zip(i.shape.elements, operands)):
                    wrong.append(f"{here}: tuple elements")
            elif i.opcode == "get-tuple-element" and operands[0] is not None:
                index = int(i.attrs["index"])
                if index >= len(operands[0].elements) or not _same(operands[0].elements[index], i.shape):
                    wrong.append(f"{here}: element {index}")
            elif i.opcode == "opt-barrier" and not _same(i.shape, operands[0]):
                wrong.append(f"{here}: barrier")
            elif i.opcode == "call":
                callee = module.computations[i.called_computations()[0]]
                params = [p.shape for p in callee.parameters]
                if len(params) != len(operands) or not all(_same(p, o) for p, o in zip(params, operands)) or \
                        not _same(callee.root.shape, i.shape):
                    wrong.append(f"{here}: call of {callee.name}")
            elif i.opcode == "while":
                body, condition = (module.computations[i.attrs[k].lstrip("%")] for k in ("body", "condition"))
                shapes = [i.shape, operands[0], body.parameters[0].shape, body.root.shape,
                          condition.parameters[0].shape]
                if not all(_same(s, i.shape) for s in shapes):
                    wrong.append(f"{here}: loop state")
            elif i.opcode == "conditional":
                for callee, operand in zip(i.called_computations(), operands[1:]):
                    branch = module.computations[callee]
                    expected = operand if operand is not None else tuple_shape([])
                    if not _same(branch.parameters[0].shape, expected) or not _same(branch.root.shape, i.shape):
                        wrong.append(f"{here}: branch {callee}")
    return wrong


@pytest.mark.parametrize("construct", CONSTRUCTS)
def test_the_lowerings_are_what_xla_parses(construct):
    """These texts are read by hlo-audit as XLA reads them (the oracle of every parser test)."""
    from xla_oracle import our_counts

    text = rng_constructs.hlo_text(StepSpec(construct, "private+idle"))
    assert our_counts(text) == xla_counts(text)
