"""Result shapes of instructions written without one (``ROOT v = abs(a)``), as XLA's parser infers them.

XLA's parser infers the result shape of most opcodes when the text leaves it out. hlo-audit infers the
ones whose rule is local and certain: elementwise operations take their operand's shape (``compare`` and
``is-finite`` as ``pred``), and the structural ones take it from their operands or callees (``tuple``,
``get-tuple-element``, ``call``, ``while``, ``conditional``...). For any other opcode the text must say
the shape; the error says so rather than guessing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from hlo_audit.hlo.shapes import Shape, array_shape, tuple_shape

UNARY = frozenset({
    "abs", "acos", "acosh", "asin", "asinh", "atanh", "cbrt", "ceil", "copy", "cosine", "cosh", "count-leading-zeros",
    "erf", "exponential", "exponential-minus-one", "floor", "imag", "is-finite", "log", "log-plus-one", "logistic",
    "negate", "not", "popcnt", "real", "round-nearest-afz", "round-nearest-even", "rsqrt", "sign", "sine", "sinh",
    "sqrt", "tan", "tanh",
})
BINARY = frozenset({
    "add", "and", "atan2", "complex", "compare", "divide", "maximum", "minimum", "multiply", "or", "power",
    "remainder", "shift-left", "shift-right-arithmetic", "shift-right-logical", "subtract", "xor",
})
# The value of the first operand passes through.
FIRST_OPERAND = frozenset({"add-dependency", "domain", "opt-barrier", "while"})
_COMPLEX_PART = {"c64": "f32", "c128": "f64"}
_PART = frozenset({"abs", "real", "imag"})
_INDEX = re.compile(r"\s*(\d+)\s*")


class ShapeInferenceError(ValueError):
    pass


def infer_shape(opcode: str, operands: Sequence[Shape], attrs: Mapping[str, str],
                callee_root: Callable[[str], Shape]) -> Shape:
    """The result shape of ``opcode`` applied to ``operands``; ``callee_root(attribute)`` gives the root shape
    of the computation an attribute names."""
    if opcode in UNARY and len(operands) == 1:
        return _elementwise(opcode, operands[0])
    if opcode in BINARY and len(operands) == 2:
        return _binary(opcode, operands[0], operands[1])
    if opcode in ("select", "clamp") and len(operands) == 3:
        return operands[1]
    if opcode in FIRST_OPERAND and operands:
        return operands[0]
    if opcode == "tuple":
        return tuple_shape(list(operands))
    if opcode == "get-tuple-element" and len(operands) == 1:
        return _element(operands[0], attrs.get("index", ""))
    if opcode == "call":
        return callee_root("to_apply")
    if opcode == "conditional":
        return callee_root("branch_computations" if "branch_computations" in attrs else "true_computation")
    if opcode == "after-all":
        return array_shape("token", ())
    if opcode in ("partition-id", "replica-id"):
        return array_shape("u32", ())
    if opcode == "get-dimension-size":
        return array_shape("s32", ())
    raise ShapeInferenceError(f"{opcode} has no result shape, and hlo-audit infers it only for elementwise and "
                              "tuple, call and loop instructions: write the shape out")


def _elementwise(opcode: str, operand: Shape) -> Shape:
    if operand.is_tuple:
        raise ShapeInferenceError(f"{opcode} of a tuple")
    if opcode == "is-finite":
        return array_shape("pred", operand.dims, operand.layout)
    if opcode in _PART and operand.dtype in _COMPLEX_PART:
        return array_shape(_COMPLEX_PART[operand.dtype], operand.dims, operand.layout)
    return operand


def _binary(opcode: str, lhs: Shape, rhs: Shape) -> Shape:
    if lhs.is_tuple or rhs.is_tuple or lhs.dims != rhs.dims:
        raise ShapeInferenceError(f"{opcode} of {lhs.text} and {rhs.text}: operands of different shapes")
    if opcode == "compare":
        return array_shape("pred", lhs.dims, lhs.layout)
    if opcode == "complex":
        return array_shape({"f32": "c64", "f64": "c128"}.get(lhs.dtype, lhs.dtype), lhs.dims, lhs.layout)
    return lhs


def _element(operand: Shape, index: str) -> Shape:
    m = _INDEX.fullmatch(index)
    if not operand.is_tuple or not m or int(m.group(1)) >= len(operand.elements):
        raise ShapeInferenceError(f"get-tuple-element index={index} of {operand.text}")
    return operand.elements[int(m.group(1))]
