"""Result shapes of instructions written without one (``ROOT r = reduce(x, z), dimensions={1}, to_apply=add``).

XLA's HLO parser reads an instruction without a result shape when its opcode is one ``CanInferShape`` lists
(xla/hlo/parser/hlo_parser.cc) and then asks ``ShapeInference`` (xla/service/shape_inference.cc) for it. This
module gives the same shape for each of those opcodes, rule by rule as XLA states it, and held to XLA's own
reprint of the same text by tests/test_shape_inference.py (jaxlib 0.12.0.1). What XLA's rules say, in short:

* elementwise operations keep their first operand's shape (layout included); ``compare`` and ``is-finite``
  give ``pred``, ``complex`` ``c64``/``c128``, ``abs``/``real``/``imag`` of a complex its component type; a binary
  operation of a scalar and an array, or of arrays whose unequal dimensions are 1, broadcasts (a new shape, default
  layout); ``select`` takes its predicate's dimensions, ``clamp`` its operand's;
* an opcode whose result XLA builds anew (reduce, reduce-window, pad, concatenate, broadcast, dot, convolution,
  gather, map, topk, ragged-dot...) gets XLA's default layout; ``transpose`` permutes its operand's layout with its
  dimensions; ``broadcast`` without a shape prepends its ``dimensions`` as sizes (XLA passes them to
  ``InferBroadcastShape(operand, broadcast_sizes)``: ``broadcast(f32[3]), dimensions={1}`` is ``f32[1,3]``);
* structural ones read their operands or callees: tuple, get-tuple-element, call, while, conditional, sort,
  scatter, select-and-scatter, batch norms, cholesky, triangular-solve, domain, add-dependency, scan.

Opcodes outside XLA's list (parameter, constant, iota, reshape, convert, slice, dynamic-slice, fusion, custom-call,
collectives, async ops, rng...) must carry their shape, as XLA requires; the error says so. Two inferences XLA's
rules refuse are made anyway, as harmless: ``opt-barrier`` (XLA's unary rule has no case for it) and a reduce-window
of several operands (XLA checks the reducer against the first operand only).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hlo_audit.hlo.shapes import Shape, element_bits, tuple_shape

# Opcodes that XLA's parser infers a result shape for (CanInferShape), as HLO text spells them.
INFERRED_OPCODES = frozenset({
    "abs", "acos", "acosh", "asin", "asinh", "add", "add-dependency", "after-all", "atan2", "atanh",
    "batch-norm-grad", "batch-norm-inference", "batch-norm-training", "broadcast", "call", "ceil", "cholesky",
    "clamp", "count-leading-zeros", "compare", "complex", "concatenate", "conditional", "convolution", "copy",
    "cosine", "cosh", "opt-barrier", "divide", "domain", "dot", "erf", "exponential", "exponential-minus-one", "fft",
    "floor", "gather", "get-dimension-size", "set-dimension-size", "get-tuple-element", "imag", "is-finite", "log",
    "log-plus-one", "logistic", "and", "not", "or", "xor", "map", "maximum", "minimum", "multiply", "negate", "pad",
    "partition-id", "popcnt", "power", "ragged-dot", "real", "reduce", "remainder", "replica-id", "reverse",
    "round-nearest-afz", "round-nearest-even", "rsqrt", "scan", "scaled-dot", "scatter", "select", "shift-left",
    "shift-right-arithmetic", "shift-right-logical", "sign", "sine", "sinh", "sqrt", "cbrt", "reduce-window",
    "select-and-scatter", "sort", "subtract", "tan", "tanh", "transpose", "triangular-solve", "tuple", "while", "topk",
})
UNARY = frozenset({
    "abs", "acos", "acosh", "asin", "asinh", "atanh", "cbrt", "ceil", "copy", "cosine", "cosh", "count-leading-zeros",
    "erf", "exponential", "exponential-minus-one", "floor", "imag", "is-finite", "log", "log-plus-one", "logistic",
    "negate", "not", "opt-barrier", "popcnt", "real", "round-nearest-afz", "round-nearest-even", "rsqrt", "sign",
    "sine", "sinh", "sqrt", "tan", "tanh",
})
BINARY = frozenset({
    "add", "and", "atan2", "complex", "compare", "divide", "maximum", "minimum", "multiply", "or", "power",
    "remainder", "shift-left", "shift-right-arithmetic", "shift-right-logical", "subtract", "xor",
})
_COMPLEX_PART = {"c64": "f32", "c128": "f64"}
_FLOAT_SIGNIFICAND = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}
_MANTISSA = re.compile(r"f\d+e\d+m(\d+)")
_INTS = re.compile(r"-?\d+")
_NAME_LIST = re.compile(r"%?([A-Za-z_][\w.\-]*)")
_WINDOW_FIELD = re.compile(r"([a-z_]+)=([-\d_x]+)")
_SPATIAL = re.compile(r"\d")


class ShapeInferenceError(ValueError):
    pass


@dataclass(frozen=True)
class ProgramShape:
    """A computation's parameter shapes (by number) and root shape: what XLA's ComputeProgramShape gives."""

    parameters: tuple[Shape, ...]
    result: Shape


def infer_shape(opcode: str, operands: Sequence[Shape], attrs: Mapping[str, str],
                program_shape: Callable[[str], ProgramShape]) -> Shape:
    """The result shape XLA's parser gives ``opcode(operands), attrs`` written without one.

    ``program_shape(name)`` is the program shape of the computation called ``name`` (defined before the
    instruction, as XLA requires). Raises ShapeInferenceError naming what is wrong.
    """
    if opcode not in INFERRED_OPCODES:
        raise ShapeInferenceError(f"XLA's parser does not infer the result shape of {opcode}: write the shape out")
    rule = _RULES.get(opcode)
    try:
        if rule is not None:
            return rule(operands, _Attrs(opcode, attrs), program_shape)
        if opcode in UNARY:
            _arity(opcode, operands, 1)
            return _unary(opcode, operands[0])
        _arity(opcode, operands, 2)
        return _binary(opcode, operands[0], operands[1])
    except ShapeInferenceError:
        raise
    except (IndexError, KeyError, ValueError, ZeroDivisionError) as exc:  # an attribute or operand out of range
        raise ShapeInferenceError(f"cannot infer the shape of {opcode} from its operands and attributes "
                                  f"({type(exc).__name__}: {exc})") from None


# -- shapes ----------------------------------------------------------------------------------------------------


def _dynamic(shape: Shape) -> tuple[bool, ...]:
    """Per dimension, whether it is dynamic (``<=N`` or ``?`` in the text)."""
    if not shape.dims or "<" not in shape.text and "?" not in shape.text:
        return (False,) * len(shape.dims)
    inside = shape.text[shape.text.index("[") + 1:shape.text.index("]")]
    return tuple(d.strip().startswith(("<=", "?")) for d in inside.split(","))


def _default_layout(rank: int) -> str:
    return ",".join(str(i) for i in reversed(range(rank)))


def make_array(dtype: str, dims: Sequence[int], dynamic: Sequence[bool] | None = None,
               layout: str | None = "default") -> Shape:
    """An array shape built anew, as XLA's ShapeUtil::MakeShape builds it: with the default layout."""
    dims = tuple(dims)
    dynamic = tuple(dynamic) if dynamic is not None else (False,) * len(dims)
    words = ["?" if d < 0 else f"<={d}" if dyn else str(d) for d, dyn in zip(dims, dynamic)]
    if layout == "default":
        layout = _default_layout(len(dims)) if dims else None
    text = f"{dtype}[{','.join(words)}]" + (f"{{{layout}}}" if layout is not None and dims else "")
    return Shape(text=text, dtype=dtype, dims=dims, layout=layout if dims else None)


def _with_dtype(shape: Shape, dtype: str) -> Shape:
    """The same array (dimensions, layout) with another element type: XLA's ChangeElementType."""
    if shape.dtype == dtype:
        return shape
    return Shape(text=dtype + shape.text[len(shape.dtype):], dtype=dtype, dims=shape.dims, layout=shape.layout)


def _array(opcode: str, shape: Shape, what: str = "operand") -> Shape:
    if shape.is_tuple or shape.text.startswith("b("):
        raise ShapeInferenceError(f"{opcode} expects an array {what}, got {shape.text}")
    return shape


def _arity(opcode: str, operands: Sequence[Shape], n: int) -> None:
    if len(operands) != n:
        raise ShapeInferenceError(f"{opcode} takes {n} operand{'s' if n != 1 else ''}, got {len(operands)}")


def _is_float(dtype: str | None) -> bool:
    return bool(dtype) and (dtype.startswith(("f", "bf")))


def _same_type_ignoring_precision(a: Shape, b: Shape) -> bool:
    return a.dtype == b.dtype or (_is_float(a.dtype) and _is_float(b.dtype))


def significand_bits(dtype: str) -> int:
    """The bits of a float dtype's significand, its implicit one included (f32: 24); 0 for any other dtype."""
    m = _MANTISSA.fullmatch(dtype)
    return int(m.group(1)) + 1 if m else _FLOAT_SIGNIFICAND.get(dtype, 0)


def _higher_precision(a: Shape, b: Shape) -> str:
    """XLA's HigherPrecisionElementType: the wider float (then the longer significand), else ``a``'s type."""
    return _higher_type(a.dtype, b.dtype)


def _higher_type(a: str, b: str) -> str:
    if a == b or not (_is_float(a) and _is_float(b)):
        return a
    return b if (element_bits(b) or 0, significand_bits(b)) > (element_bits(a) or 0, significand_bits(a)) else a


# -- attributes ------------------------------------------------------------------------------------------------


class _Attrs:
    """An instruction's attributes, read the way XLA reads each kind (braced int lists, windows, paddings...)."""

    def __init__(self, opcode: str, attrs: Mapping[str, str]):
        self.opcode, self.raw = opcode, attrs

    def has(self, key: str) -> bool:
        return key in self.raw

    def required(self, key: str) -> str:
        value = self.raw.get(key)
        if value is None:
            raise ShapeInferenceError(f"{self.opcode} needs attribute {key}")
        return value.strip()

    def ints(self, key: str, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
        if key not in self.raw and default is not None:
            return default
        return tuple(int(v) for v in _INTS.findall(self.required(key)))

    def int(self, key: str, default: int | None = None) -> int:
        if key not in self.raw and default is not None:
            return default
        value = self.required(key)
        if not _INTS.fullmatch(value):
            raise ShapeInferenceError(f"{self.opcode}: attribute {key}={value} is not an integer")
        return int(value)

    def word(self, key: str) -> str:
        return self.required(key).strip("\"'")

    def computations(self, key: str) -> list[str]:
        return _NAME_LIST.findall(self.required(key))

    def window(self, rank: int) -> list[dict[str, int]]:
        """``window={size=2x3 stride=2x1 pad=0_1x1_1 lhs_dilate=1x1 rhs_dilate=1x1}``, one dict per dimension."""
        if "window" not in self.raw:
            fields: dict[str, str] = {}
        else:
            fields = dict(_WINDOW_FIELD.findall(self.required("window")))
        sizes = [int(v) for v in fields["size"].split("x")] if "size" in fields else []
        if len(sizes) != rank:
            raise ShapeInferenceError(f"{self.opcode}: window has {len(sizes)} dimensions, its operand {rank}")
        dims = [{"size": s, "stride": 1, "low": 0, "high": 0, "base_dilation": 1, "window_dilation": 1}
                for s in sizes]
        for key, field in (("stride", "stride"), ("lhs_dilate", "base_dilation"), ("rhs_dilate", "window_dilation")):
            if key in fields:
                values = [int(v) for v in fields[key].split("x")]
                if len(values) != rank:
                    raise ShapeInferenceError(f"{self.opcode}: window {key} has {len(values)} dimensions, size "
                                              f"{rank}")
                for dim, v in zip(dims, values):
                    dim[field] = v
        if "pad" in fields:
            pads = fields["pad"].split("x")
            if len(pads) != rank:
                raise ShapeInferenceError(f"{self.opcode}: window pad has {len(pads)} dimensions, size {rank}")
            for dim, pad in zip(dims, pads):
                dim["low"], dim["high"] = (int(v) for v in _pad_numbers(pad, 2))
        return dims


def _pad_numbers(text: str, count: int) -> list[int]:
    """``1_-2`` or ``-1_0_3``: integers joined by '_' (a minus sign belongs to its number)."""
    values = [int(v) for v in _INTS.findall(text)]
    if len(values) != count:
        raise ShapeInferenceError(f"expected {count} numbers joined by '_', got {text!r}")
    return values


# -- rules -----------------------------------------------------------------------------------------------------


def _unary(opcode: str, operand: Shape) -> Shape:
    if opcode in ("copy", "opt-barrier"):
        return operand
    _array(opcode, operand)
    if opcode == "is-finite":
        return _with_dtype(operand, "pred")
    if opcode in ("abs", "real", "imag") and operand.dtype in _COMPLEX_PART:
        return _with_dtype(operand, _COMPLEX_PART[operand.dtype])
    return operand


def _binary(opcode: str, lhs: Shape, rhs: Shape) -> Shape:
    _array(opcode, lhs, "lhs")
    _array(opcode, rhs, "rhs")
    if not _same_type_ignoring_precision(lhs, rhs):
        raise ShapeInferenceError(f"{opcode} of {lhs.text} and {rhs.text}: different element types")
    if lhs.dims == rhs.dims:
        result = _with_dtype(lhs, _higher_precision(lhs, rhs))
        if any(_dynamic(rhs)) and not any(_dynamic(lhs)):
            result = make_array(result.dtype, result.dims, _dynamic(rhs), result.layout)
    else:
        result = _broadcast_binary(opcode, lhs, rhs)
    if opcode == "compare":
        return _with_dtype(result, "pred")
    if opcode == "complex":
        kind = {"f32": "c64", "f64": "c128"}.get(lhs.dtype) if lhs.dtype == rhs.dtype else None
        if kind is None:
            raise ShapeInferenceError(f"complex of {lhs.dtype} and {rhs.dtype}: needs f32 or f64 parts")
        return _with_dtype(result, kind)
    return result


def _broadcast_binary(opcode: str, lhs: Shape, rhs: Shape) -> Shape:
    """Binary operands of different shapes: a scalar against an array, or size-1 dimensions (XLA's degenerate
    dimension broadcast); a new shape."""
    if len(lhs.dims) != len(rhs.dims):
        smaller, larger = (lhs, rhs) if len(lhs.dims) < len(rhs.dims) else (rhs, lhs)
        if smaller.dims:
            raise ShapeInferenceError(f"{opcode} of {lhs.text} and {rhs.text}: ranks differ (only a scalar "
                                      "broadcasts without broadcast dimensions)")
        lhs, rhs = larger, larger
    dims = []
    for a, b in zip(lhs.dims, rhs.dims):
        if a != b and a != 1 and b != 1:
            raise ShapeInferenceError(f"{opcode} of {lhs.text} and {rhs.text}: incompatible dimensions")
        dims.append(b if a == 1 else a)
    dynamic = [x or y for x, y in zip(_dynamic(lhs), _dynamic(rhs))]
    return make_array(_higher_precision(lhs, rhs), dims, dynamic)


def _select(operands, attrs, program_shape) -> Shape:
    _arity("select", operands, 3)
    pred, on_true, on_false = (_array("select", s) for s in operands)
    if pred.dtype != "pred" or on_true.dims != on_false.dims or pred.dims not in ((), on_true.dims):
        raise ShapeInferenceError(f"select of {pred.text}, {on_true.text}, {on_false.text}: needs a pred of the "
                                  "operands' shape, or a scalar one")
    # The predicate's dimensions and layout, unless it is a scalar choosing between whole arrays.
    return _with_dtype(on_true if not pred.dims else pred, _higher_precision(on_true, on_false))


def _clamp(operands, attrs, program_shape) -> Shape:
    _arity("clamp", operands, 3)
    low, operand, high = (_array("clamp", s) for s in operands)
    for bound in (low, high):
        if bound.dims and bound.dims != operand.dims:
            raise ShapeInferenceError(f"clamp of {low.text}, {operand.text}, {high.text}: bounds of another shape")
    return operand


def _tuple(operands, attrs, program_shape) -> Shape:
    return tuple_shape(list(operands))


def _get_tuple_element(operands, attrs, program_shape) -> Shape:
    _arity("get-tuple-element", operands, 1)
    index = attrs.int("index")
    operand = operands[0]
    if not operand.is_tuple or not 0 <= index < len(operand.elements):
        raise ShapeInferenceError(f"get-tuple-element index={index} of {operand.text}")
    return operand.elements[index]


def _call(operands, attrs, program_shape) -> Shape:
    callee = program_shape(attrs.computations("to_apply")[0])
    if len(callee.parameters) != len(operands):
        raise ShapeInferenceError(f"call passes {len(operands)} operands to a computation of "
                                  f"{len(callee.parameters)} parameters")
    return callee.result


def _while(operands, attrs, program_shape) -> Shape:
    _arity("while", operands, 1)
    program_shape(attrs.computations("condition")[0])
    program_shape(attrs.computations("body")[0])
    return operands[0]


def _conditional(operands, attrs, program_shape) -> Shape:
    if attrs.has("branch_computations"):
        branches = attrs.computations("branch_computations")
    else:
        branches = [attrs.computations("true_computation")[0], attrs.computations("false_computation")[0]]
    if not branches or len(operands) != len(branches) + 1:
        raise ShapeInferenceError(f"conditional has {len(branches)} branches and {len(operands) - 1} branch operands")
    return program_shape(branches[0]).result


def _after_all(operands, attrs, program_shape) -> Shape:
    return make_array("token", ())


def _add_dependency(operands, attrs, program_shape) -> Shape:
    _arity("add-dependency", operands, 2)
    return operands[0]


def _u32_scalar(operands, attrs, program_shape) -> Shape:
    return make_array("u32", ())


def _domain(operands, attrs, program_shape) -> Shape:
    _arity("domain", operands, 1)
    return operands[0]


def _get_dimension_size(operands, attrs, program_shape) -> Shape:
    _arity("get-dimension-size", operands, 1)
    dim = attrs.ints("dimensions")[0]
    if not 0 <= dim < len(operands[0].dims):
        raise ShapeInferenceError(f"get-dimension-size dimension {dim} of {operands[0].text}")
    return make_array("s32", ())


def _set_dimension_size(operands, attrs, program_shape) -> Shape:
    _arity("set-dimension-size", operands, 2)
    operand = _array("set-dimension-size", operands[0])
    dim = attrs.ints("dimensions")[0]
    if not 0 <= dim < len(operand.dims) or operands[1].text != "s32[]":
        raise ShapeInferenceError(f"set-dimension-size dimension {dim} of {operand.text} to {operands[1].text}")
    dynamic = list(_dynamic(operand))
    dynamic[dim] = True
    return make_array(operand.dtype, operand.dims, dynamic, operand.layout)


def _broadcast(operands, attrs, program_shape) -> Shape:
    # XLA's parser passes `dimensions` to InferBroadcastShape(operand, broadcast_sizes): they become leading sizes.
    _arity("broadcast", operands, 1)
    operand = _array("broadcast", operands[0])
    if not operand.dims and not attrs.has("dimensions"):
        sizes: tuple[int, ...] = ()
    else:
        sizes = attrs.ints("dimensions")
    if any(s < 0 for s in sizes):
        raise ShapeInferenceError(f"broadcast to a negative size: {sizes}")
    return make_array(operand.dtype, sizes + operand.dims, (False,) * len(sizes) + _dynamic(operand))


def _concatenate(operands, attrs, program_shape) -> Shape:
    dims_attr = attrs.ints("dimensions")
    if not operands or len(dims_attr) != 1:
        raise ShapeInferenceError("concatenate needs operands and one dimension")
    dim = dims_attr[0]
    first = _array("concatenate", operands[0])
    if not 0 <= dim < len(first.dims):
        raise ShapeInferenceError(f"concatenate dimension {dim} of {first.text}")
    dims = list(first.dims)
    dtype = first.dtype
    dynamic = list(_dynamic(first))
    for shape in operands[1:]:
        _array("concatenate", shape)
        if len(shape.dims) != len(first.dims) or not _same_type_ignoring_precision(first, shape) or any(
                a != b for i, (a, b) in enumerate(zip(first.dims, shape.dims)) if i != dim):
            raise ShapeInferenceError(f"concatenate of {first.text} and {shape.text} along {dim}")
        dims[dim] += shape.dims[dim]
        dtype = _higher_type(dtype, shape.dtype)
        dynamic = [x or y for x, y in zip(dynamic, _dynamic(shape))]
    return make_array(dtype, dims, dynamic)


def _reducer_results(callee: ProgramShape, inputs: int, opcode: str) -> list[str]:
    """Element types a reduction computation returns, one per reduced input (XLA's VerifyReducerShape)."""
    if len(callee.parameters) != 2 * inputs:
        raise ShapeInferenceError(f"{opcode}'s computation takes {len(callee.parameters)} parameters, it must take "
                                  f"{2 * inputs}")
    results = list(callee.result.elements) if callee.result.is_tuple else [callee.result]
    if len(results) != inputs or any(r.is_tuple or r.dims for r in results):
        raise ShapeInferenceError(f"{opcode}'s computation must return {inputs} scalar(s), returns "
                                  f"{callee.result.text}")
    return [r.dtype for r in results]


def _reduce(operands, attrs, program_shape) -> Shape:
    if not operands or len(operands) % 2:
        raise ShapeInferenceError(f"reduce needs an even number of operands, has {len(operands)}")
    inputs = operands[:len(operands) // 2]
    first = _array("reduce", inputs[0])
    if any(s.dims != first.dims for s in inputs):
        raise ShapeInferenceError("reduce of inputs with different dimensions")
    reduced = attrs.ints("dimensions")
    if len(set(reduced)) != len(reduced) or any(not 0 <= d < len(first.dims) for d in reduced):
        raise ShapeInferenceError(f"reduce dimensions {list(reduced)} of {first.text}")
    types = _reducer_results(program_shape(attrs.computations("to_apply")[0]), len(inputs), "reduce")
    kept = [i for i in range(len(first.dims)) if i not in reduced]
    dims = [first.dims[i] for i in kept]
    dynamic = [_dynamic(first)[i] for i in kept]
    results = [make_array(t, dims, dynamic) for t in types]
    return results[0] if len(inputs) == 1 else tuple_shape(results)


def _dilated(bound: int, dilation: int) -> int:
    return 0 if bound == 0 else (bound - 1) * dilation + 1


def _window_output(opcode: str, base: Shape, window: list[dict[str, int]], dtype: str) -> Shape:
    dims = []
    for size, dim in zip(base.dims, window):
        if dim["size"] <= 0 or dim["stride"] <= 0 or dim["base_dilation"] < 1 or dim["window_dilation"] < 1:
            raise ShapeInferenceError(f"{opcode}: window sizes, strides and dilations must be positive")
        padded = dim["low"] + _dilated(size, dim["base_dilation"]) + dim["high"]
        window_size = _dilated(dim["size"], dim["window_dilation"])
        dims.append(0 if window_size > padded else (padded - window_size) // dim["stride"] + 1)
    return make_array(dtype, dims, _dynamic(base))


def _reduce_window(operands, attrs, program_shape) -> Shape:
    if not operands or len(operands) % 2:
        raise ShapeInferenceError(f"reduce-window needs an even number of operands, has {len(operands)}")
    inputs, inits = operands[:len(operands) // 2], operands[len(operands) // 2:]
    first = _array("reduce-window", inputs[0])
    _reducer_results(program_shape(attrs.computations("to_apply")[0]), len(inputs), "reduce-window")
    window = attrs.window(len(first.dims))
    results = [_window_output("reduce-window", _array("reduce-window", s), window, init.dtype)
               for s, init in zip(inputs, inits)]
    return results[0] if len(inputs) == 1 else tuple_shape(results)


def _pad(operands, attrs, program_shape) -> Shape:
    _arity("pad", operands, 2)
    operand, value = _array("pad", operands[0]), _array("pad", operands[1], "padding value")
    if value.dims or not _same_type_ignoring_precision(operand, value):
        raise ShapeInferenceError(f"pad of {operand.text} with {value.text}: the padding value must be a scalar of "
                                  "its type")
    config = attrs.required("padding")
    per_dim = config.split("x") if operand.dims else []
    if len(per_dim) != len(operand.dims):
        raise ShapeInferenceError(f"padding={config} for {operand.text}: one low_high[_interior] per dimension")
    dims = []
    for size, text in zip(operand.dims, per_dim):
        numbers = [int(v) for v in _INTS.findall(text)]
        if len(numbers) not in (2, 3):
            raise ShapeInferenceError(f"padding={config}: expected low_high or low_high_interior")
        low, high, interior = numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else 0
        if interior < 0:
            raise ShapeInferenceError(f"padding={config}: interior padding cannot be negative")
        dims.append(size + low + high + max(size - 1, 0) * interior)
        if dims[-1] < 0:
            raise ShapeInferenceError(f"padding={config} gives a negative size")
    return make_array(_higher_precision(operand, value), dims, _dynamic(operand))


def _reverse(operands, attrs, program_shape) -> Shape:
    _arity("reverse", operands, 1)
    operand = _array("reverse", operands[0])
    dims = attrs.ints("dimensions")
    if len(set(dims)) != len(dims) or any(not 0 <= d < len(operand.dims) for d in dims):
        raise ShapeInferenceError(f"reverse dimensions {list(dims)} of {operand.text}")
    return operand


def _transpose(operands, attrs, program_shape) -> Shape:
    # XLA's PermuteDimensions: output dimension i is operand dimension dims[i], and the layout keeps the same
    # physical order (an operand without a layout has the default one).
    _arity("transpose", operands, 1)
    operand = _array("transpose", operands[0])
    perm = attrs.ints("dimensions")
    if sorted(perm) != list(range(len(operand.dims))):
        raise ShapeInferenceError(f"transpose dimensions {list(perm)} are not a permutation of {operand.text}'s")
    dims = [operand.dims[p] for p in perm]
    dynamic = [_dynamic(operand)[p] for p in perm]
    layout = None
    if operand.dims:
        minor_to_major = _minor_to_major(operand)
        inverse = {p: i for i, p in enumerate(perm)}
        layout = ",".join(str(inverse[d]) for d in minor_to_major) + _layout_tail(operand)
    return make_array(operand.dtype, dims, dynamic, layout)


def _minor_to_major(shape: Shape) -> list[int]:
    if shape.layout is None:
        return list(reversed(range(len(shape.dims))))
    head = shape.layout.split(":", 1)[0]
    return [int(v) for v in head.split(",") if v.strip()]


def _layout_tail(shape: Shape) -> str:
    return ":" + shape.layout.split(":", 1)[1] if shape.layout and ":" in shape.layout else ""


def _dot_dims(attrs: _Attrs, lhs: Shape, rhs: Shape, opcode: str) -> tuple[list[int], list[bool]]:
    lc, rc = attrs.ints("lhs_contracting_dims", ()), attrs.ints("rhs_contracting_dims", ())
    lb, rb = attrs.ints("lhs_batch_dims", ()), attrs.ints("rhs_batch_dims", ())
    for dims, shape in ((lc + lb, lhs), (rc + rb, rhs)):
        if len(set(dims)) != len(dims) or any(not 0 <= d < len(shape.dims) for d in dims):
            raise ShapeInferenceError(f"{opcode}: dimension numbers out of range or repeated for {shape.text}")
    if len(lc) != len(rc) or len(lb) != len(rb) or any(lhs.dims[a] != rhs.dims[b] for a, b in zip(lc + lb, rc + rb)):
        raise ShapeInferenceError(f"{opcode} of {lhs.text} and {rhs.text}: contracting or batch dimensions differ")
    ldyn, rdyn = _dynamic(lhs), _dynamic(rhs)
    dims = [lhs.dims[d] for d in lb]
    dynamic = [ldyn[d] for d in lb]
    for shape, dyn, skip in ((lhs, ldyn, set(lc + lb)), (rhs, rdyn, set(rc + rb))):
        for i, size in enumerate(shape.dims):
            if i not in skip:
                dims.append(size)
                dynamic.append(dyn[i])
    return dims, dynamic


def _dot(operands, attrs, program_shape) -> Shape:
    _arity("dot", operands, 2)
    lhs, rhs = _array("dot", operands[0], "lhs"), _array("dot", operands[1], "rhs")
    dims, dynamic = _dot_dims(attrs, lhs, rhs, "dot")
    return make_array(_higher_precision(lhs, rhs), dims, dynamic)


def _scaled_dot(operands, attrs, program_shape) -> Shape:
    # XLA: InferDotOpShape(lhs=operand 0, rhs=operand 2); operands 1 and 3 are the scales.
    _arity("scaled-dot", operands, 4)
    lhs, rhs = _array("scaled-dot", operands[0], "lhs"), _array("scaled-dot", operands[2], "rhs")
    dims, dynamic = _dot_dims(attrs, lhs, rhs, "scaled-dot")
    return make_array(_higher_precision(lhs, rhs), dims, dynamic)


def _ragged_dot(operands, attrs, program_shape) -> Shape:
    """lhs [b..., m, k] and a group sizes vector: the ragged dimension of lhs is non-contracting (rhs carries a
    group dimension, dropped from the result), contracting (the result gains the groups as its leading
    dimension) or a batch dimension (as a dot)."""
    _arity("ragged-dot", operands, 3)
    lhs, rhs = _array("ragged-dot", operands[0], "lhs"), _array("ragged-dot", operands[1], "rhs")
    groups = _array("ragged-dot", operands[2], "group sizes")
    ragged = attrs.ints("lhs_ragged_dims", ())
    if len(ragged) != 1 or not 0 <= ragged[0] < len(lhs.dims):
        raise ShapeInferenceError("ragged-dot needs one lhs_ragged_dims inside lhs")
    rg = attrs.ints("rhs_group_dims", ())
    lc, lb = attrs.ints("lhs_contracting_dims", ()), attrs.ints("lhs_batch_dims", ())
    mode = "contracting" if ragged[0] in lc else "batch" if ragged[0] in lb else "non-contracting"
    if mode == "non-contracting":
        if len(rg) != 1 or not 0 <= rg[0] < len(rhs.dims):
            raise ShapeInferenceError("ragged-dot with a non-contracting ragged dimension needs one rhs_group_dims")
        keep = [i for i in range(len(rhs.dims)) if i != rg[0]]
        renumber = {old: new for new, old in enumerate(keep)}
        rhs_dims = [rhs.dims[i] for i in keep]
        rhs_dyn = [_dynamic(rhs)[i] for i in keep]
        rhs = make_array(rhs.dtype, rhs_dims, rhs_dyn)
        translated = {key: "{" + ",".join(str(renumber[d]) for d in attrs.ints(key, ())) + "}"
                      for key in ("rhs_contracting_dims", "rhs_batch_dims")}
        attrs = _Attrs("ragged-dot", {**attrs.raw, **translated})
    elif rg:
        raise ShapeInferenceError(f"ragged-dot with a {mode} ragged dimension takes no rhs_group_dims")
    dims, dynamic = _dot_dims(attrs, lhs, rhs, "ragged-dot")
    if mode == "contracting":
        dims, dynamic = [groups.dims[-1] if groups.dims else 1, *dims], [False, *dynamic]
    return make_array(_higher_precision(lhs, rhs), dims, dynamic)


def _dim_labels(text: str) -> tuple[str, str, str]:
    lhs, _, rest = text.strip().partition("_")
    rhs, arrow, out = rest.partition("->")
    if not arrow:
        raise ShapeInferenceError(f"dim_labels={text} is not lhs_rhs->out")
    return lhs, rhs, out


def _convolution(operands, attrs, program_shape) -> Shape:
    _arity("convolution", operands, 2)
    lhs, rhs = _array("convolution", operands[0], "lhs"), _array("convolution", operands[1], "rhs")
    lhs_labels, rhs_labels, out_labels = _dim_labels(attrs.required("dim_labels"))
    features, batches = attrs.int("feature_group_count", 1), attrs.int("batch_group_count", 1)
    spatial = len(_SPATIAL.findall(lhs_labels))
    if len(lhs_labels) != len(lhs.dims) or len(rhs_labels) != len(rhs.dims) or len(out_labels) != len(lhs.dims) or \
            len(_SPATIAL.findall(rhs_labels)) != spatial or len(_SPATIAL.findall(out_labels)) != spatial:
        raise ShapeInferenceError(f"dim_labels={attrs.required('dim_labels')} do not fit {lhs.text} and {rhs.text}")
    if features <= 0 or batches <= 0 or (features > 1 and batches > 1):
        raise ShapeInferenceError("convolution: feature_group_count and batch_group_count must be positive, and "
                                  "not both above 1")

    def at(labels: str, shape: Shape, label: str) -> int:
        return shape.dims[labels.index(label)]

    input_batch, input_features = at(lhs_labels, lhs, "b"), at(lhs_labels, lhs, "f")
    kernel_in, kernel_out = at(rhs_labels, rhs, "i"), at(rhs_labels, rhs, "o")
    if kernel_out % batches or input_features % features or input_features // features != kernel_in or \
            kernel_out % features or input_batch % batches:
        raise ShapeInferenceError(f"convolution of {lhs.text} and {rhs.text}: features and groups do not fit")
    window = attrs.window(spatial)
    if [w["size"] for w in window] != [at(rhs_labels, rhs, str(i)) for i in range(spatial)]:
        raise ShapeInferenceError(f"convolution window does not match the kernel {rhs.text}")
    base = make_array(lhs.dtype, [at(lhs_labels, lhs, str(i)) for i in range(spatial)])
    spatial_out = _window_output("convolution", base, window, lhs.dtype).dims
    dims = [0] * len(out_labels)
    for position, label in enumerate(out_labels):
        if label == "b":
            dims[position] = input_batch // batches
        elif label == "f":
            dims[position] = kernel_out
        else:
            dims[position] = spatial_out[int(label)]
    return make_array(_higher_precision(lhs, rhs), dims)


def _fft(operands, attrs, program_shape) -> Shape:
    _arity("fft", operands, 1)
    operand = _array("fft", operands[0])
    kind, lengths = attrs.word("fft_type"), attrs.ints("fft_length")
    if not 1 <= len(lengths) <= 3 or len(operand.dims) < len(lengths):
        raise ShapeInferenceError(f"fft of rank {len(lengths)} on {operand.text}")
    dims = list(operand.dims)
    if kind in ("FFT", "IFFT"):
        if operand.dtype not in _COMPLEX_PART:
            raise ShapeInferenceError(f"{kind} needs a complex operand, got {operand.text}")
        return operand
    if kind == "RFFT":
        if operand.dtype not in ("f32", "f64") or tuple(dims[-len(lengths):]) != lengths:
            raise ShapeInferenceError(f"RFFT of {operand.text} with fft_length={list(lengths)}")
        if lengths[-1]:
            dims[-1] = lengths[-1] // 2 + 1
        return make_array("c64" if operand.dtype == "f32" else "c128", dims, _dynamic(operand), operand.layout)
    if kind == "IRFFT":
        if operand.dtype not in _COMPLEX_PART or tuple(dims[-len(lengths):-1]) != lengths[:-1]:
            raise ShapeInferenceError(f"IRFFT of {operand.text} with fft_length={list(lengths)}")
        dims[-1] = lengths[-1]
        return make_array(_COMPLEX_PART[operand.dtype], dims, _dynamic(operand), operand.layout)
    raise ShapeInferenceError(f"unknown fft_type {kind}")


def _gather(operands, attrs, program_shape) -> Shape:
    _arity("gather", operands, 2)
    operand, indices = _array("gather", operands[0]), _array("gather", operands[1], "start indices")
    offset_dims, collapsed = attrs.ints("offset_dims"), attrs.ints("collapsed_slice_dims")
    batching = attrs.ints("operand_batching_dims", ())
    index_vector_dim, slice_sizes = attrs.int("index_vector_dim"), attrs.ints("slice_sizes")
    attrs.ints("start_index_map")
    if len(slice_sizes) != len(operand.dims) or not 0 <= index_vector_dim <= len(indices.dims):
        raise ShapeInferenceError(f"gather slice_sizes / index_vector_dim do not fit {operand.text}, {indices.text}")
    expanded = list(indices.dims) + ([1] if index_vector_dim == len(indices.dims) else [])
    expanded_dyn = list(_dynamic(indices)) + ([False] if index_vector_dim == len(indices.dims) else [])
    rank = len(offset_dims) + len(expanded) - 1
    window = [i for i in range(len(operand.dims)) if i not in collapsed and i not in batching]
    if len(window) != len(offset_dims):
        raise ShapeInferenceError("gather: offset_dims must number the slice dimensions that are not collapsed")
    dims, dynamic = [], []
    offsets = iter(window)
    batch_dims = iter(i for i in range(len(expanded)) if i != index_vector_dim)
    operand_dyn = _dynamic(operand)
    for i in range(rank):
        if i in offset_dims:
            d = next(offsets)
            dims.append(slice_sizes[d])
            dynamic.append(operand_dyn[d] and slice_sizes[d] == operand.dims[d])
        else:
            d = next(batch_dims)
            dims.append(expanded[d])
            dynamic.append(expanded_dyn[d])
    return make_array(operand.dtype, dims, dynamic)


def _scatter(operands, attrs, program_shape) -> Shape:
    if len(operands) % 2 == 0:
        raise ShapeInferenceError(f"scatter needs an odd number of operands, has {len(operands)}")
    count = len(operands) // 2
    for key in ("update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims"):
        attrs.ints(key)
    attrs.int("index_vector_dim")
    _reducer_results(program_shape(attrs.computations("to_apply")[0]), count, "scatter")
    results = [_array("scatter", s) for s in operands[:count]]
    return results[0] if count == 1 else tuple_shape(results)


def _select_and_scatter(operands, attrs, program_shape) -> Shape:
    _arity("select-and-scatter", operands, 3)
    program_shape(attrs.computations("select")[0])
    program_shape(attrs.computations("scatter")[0])
    return _array("select-and-scatter", operands[0])


def _map(operands, attrs, program_shape) -> Shape:
    if not operands:
        raise ShapeInferenceError("map needs operands")
    callee = program_shape(attrs.computations("to_apply")[0])
    shape = _array("map", operands[0])
    for other in operands[1:]:
        if other.dims != shape.dims:
            if not other.dims:
                continue
            if shape.dims:
                raise ShapeInferenceError("map of operands of different shapes")
            shape = other
    if callee.result.is_tuple or callee.result.dims or len(callee.parameters) != len(operands):
        raise ShapeInferenceError("map's computation must take one scalar per operand and return a scalar")
    if attrs.ints("dimensions", tuple(range(len(shape.dims)))) != tuple(range(len(shape.dims))):
        raise ShapeInferenceError("map applies to every dimension in order")
    return make_array(callee.result.dtype, shape.dims)


def _sort(operands, attrs, program_shape) -> Shape:
    if not operands or len(attrs.ints("dimensions")) != 1:
        raise ShapeInferenceError("sort needs operands and one dimension")
    program_shape(attrs.computations("to_apply")[0])
    if len(operands) == 1:
        return operands[0]
    if any(s.dims != operands[0].dims for s in operands):
        raise ShapeInferenceError("sort keys and values must have the same dimensions")
    return tuple_shape(list(operands))


def _feature_vector(opcode: str, operand: Shape, attrs: _Attrs) -> Shape:
    index = attrs.int("feature_index")
    if not 0 <= index < len(operand.dims):
        raise ShapeInferenceError(f"{opcode} feature_index {index} of {operand.text}")
    return make_array(operand.dtype, (operand.dims[index],))


def _batch_norm_training(operands, attrs, program_shape) -> Shape:
    _arity("batch-norm-training", operands, 3)
    operand = _array("batch-norm-training", operands[0])
    feature = _feature_vector("batch-norm-training", operand, attrs)
    return tuple_shape([operand, feature, feature])


def _batch_norm_inference(operands, attrs, program_shape) -> Shape:
    _arity("batch-norm-inference", operands, 5)
    operand = _array("batch-norm-inference", operands[0])
    _feature_vector("batch-norm-inference", operand, attrs)
    return operand


def _batch_norm_grad(operands, attrs, program_shape) -> Shape:
    _arity("batch-norm-grad", operands, 5)
    operand = _array("batch-norm-grad", operands[0])
    feature = _feature_vector("batch-norm-grad", operand, attrs)
    return tuple_shape([operand, feature, feature])


def _cholesky(operands, attrs, program_shape) -> Shape:
    _arity("cholesky", operands, 1)
    a = _array("cholesky", operands[0])
    if len(a.dims) < 2 or a.dims[-1] != a.dims[-2]:
        raise ShapeInferenceError(f"cholesky of {a.text}: needs square minor dimensions")
    return a


def _triangular_solve(operands, attrs, program_shape) -> Shape:
    _arity("triangular-solve", operands, 2)
    a, b = _array("triangular-solve", operands[0], "a"), _array("triangular-solve", operands[1], "b")
    if a.dtype != b.dtype or len(a.dims) < 2 or len(b.dims) != len(a.dims) or a.dims[-1] != a.dims[-2]:
        raise ShapeInferenceError(f"triangular-solve of {a.text} and {b.text}")
    return b


def _topk(operands, attrs, program_shape) -> Shape:
    _arity("topk", operands, 1)
    operand = _array("topk", operands[0])
    k = attrs.int("k")
    if not operand.dims or operand.dims[-1] < k:
        raise ShapeInferenceError(f"topk k={k} of {operand.text}")
    dims = (*operand.dims[:-1], k)
    dynamic = (*_dynamic(operand)[:-1], False)
    return tuple_shape([make_array(operand.dtype, dims, dynamic), make_array("s32", dims, dynamic)])


def _scan(operands, attrs, program_shape) -> Shape:
    """XLA's parser: the root of ``to_apply`` (carries last), each non-carry output gaining the scanned dimension."""
    callee = program_shape(attrs.computations("to_apply")[0])
    dims_attr, carries = attrs.ints("dimensions"), attrs.int("num_carries")
    if len(operands) != len(callee.parameters) or len(dims_attr) != 1 or not 0 <= carries <= len(operands):
        raise ShapeInferenceError("scan: operands, to_apply's parameters, dimensions and num_carries do not fit")
    if len(operands) == carries:
        raise ShapeInferenceError("cannot infer the shape of a scan with no inputs")
    dim = dims_attr[0]
    length = operands[0].dims[dim]

    def scanned(shape: Shape) -> Shape:
        if shape.is_tuple or not 0 <= dim <= len(shape.dims):
            raise ShapeInferenceError(f"scan: dimension {dim} does not fit an output element {shape.text}")
        dims = (*shape.dims[:dim], length, *shape.dims[dim:])
        return make_array(shape.dtype, dims)

    root = callee.result
    if not root.is_tuple:
        return root if carries else scanned(root)
    elements = list(root.elements)
    return tuple_shape([scanned(e) if i + carries < len(elements) else e for i, e in enumerate(elements)])


_RULES: dict[str, Callable[[Sequence[Shape], _Attrs, Callable[[str], ProgramShape]], Shape]] = {
    "select": _select, "clamp": _clamp, "tuple": _tuple, "get-tuple-element": _get_tuple_element, "call": _call,
    "while": _while, "conditional": _conditional, "after-all": _after_all, "add-dependency": _add_dependency,
    "partition-id": _u32_scalar, "replica-id": _u32_scalar, "domain": _domain,
    "get-dimension-size": _get_dimension_size, "set-dimension-size": _set_dimension_size, "broadcast": _broadcast,
    "concatenate": _concatenate, "reduce": _reduce, "reduce-window": _reduce_window, "pad": _pad,
    "reverse": _reverse, "transpose": _transpose, "dot": _dot, "scaled-dot": _scaled_dot, "ragged-dot": _ragged_dot,
    "convolution": _convolution, "fft": _fft, "gather": _gather, "scatter": _scatter,
    "select-and-scatter": _select_and_scatter, "map": _map, "sort": _sort,
    "batch-norm-training": _batch_norm_training, "batch-norm-inference": _batch_norm_inference,
    "batch-norm-grad": _batch_norm_grad, "cholesky": _cholesky, "triangular-solve": _triangular_solve,
    "topk": _topk, "scan": _scan,
}
