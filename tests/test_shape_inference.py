"""Shape inference against XLA's own: every opcode XLA's parser infers a result shape for, written without one.

For each opcode in ``INFERRED_OPCODES`` (XLA's ``CanInferShape`` list, xla/hlo/parser/hlo_parser.cc) a module whose
ROOT ``r`` leaves its shape out: XLA's parser (jaxlib) reads it and its reprint gives the shape; hlo-audit's parser
must give the same one (layouts compared with XLA's defaults filled in, as XLA fills them), and the same module
counts. Cases cover layouts that pass through (a unary op keeps its operand's, transpose permutes it), dynamic
dimensions (``<=N``), broadcasting binary operands, variadic reduce and sort, every convolution grouping.
"""

from __future__ import annotations

import pytest
from jax._src.lib import hlo

from hlo_audit.hlo.shape_inference import INFERRED_OPCODES
from hlo_audit.hlo.shapes import parse_shape, with_default_layout
from hlo_audit.hlo.text import HloParseError, parse_module
from xla_oracle import our_counts, xla_counts

ADD = "add_f {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"
ADD2 = ("add2 {\n  a = f32[] parameter(0)\n  b = s32[] parameter(1)\n  c = f32[] parameter(2)\n  d = s32[] parameter(3)\n"
        "  x = f32[] add(a, c)\n  y = s32[] add(b, d)\n  ROOT t = (f32[], s32[]) tuple(x, y)\n}\n")
GE = "ge_f {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = pred[] compare(a, b), direction=GE\n}\n"
LT2 = ("lt2 {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  c = s32[] parameter(2)\n  d = s32[] parameter(3)\n"
       "  ROOT p = pred[] compare(a, b), direction=LT\n}\n")
NEG = "neg_f {\n  a = f32[] parameter(0)\n  ROOT n = f32[] negate(a)\n}\n"
TUPLE_BODY = ("body {\n  p = (s32[], f32[4]) parameter(0)\n  i = s32[] get-tuple-element(p), index=0\n  one = s32[] constant(1)\n"
              "  j = s32[] add(i, one)\n  v = f32[4] get-tuple-element(p), index=1\n  ROOT t = (s32[], f32[4]) tuple(j, v)\n}\n"
              "cond {\n  p = (s32[], f32[4]) parameter(0)\n  i = s32[] get-tuple-element(p), index=0\n  n = s32[] constant(3)\n"
              "  ROOT lt = pred[] compare(i, n), direction=LT\n}\n")
SCAN_STEP = ("scan_step {\n  c = f32[] parameter(0)\n  x = f32[] parameter(1)\n  s = f32[] add(c, x)\n"
             "  ROOT t = (f32[], f32[]) tuple(s, s)\n}\n"
             "scan_map {\n  x = f32[3] parameter(0)\n  ROOT n = f32[3] negate(x)\n}\n")
BRANCHES = ("br0 {\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(p)\n}\n"
            "br1 {\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] abs(p)\n}\n")


def module(params: list[str], root: str, computations: str = "") -> str:
    lines = [f"  p{i} = {shape} parameter({i})" for i, shape in enumerate(params)]
    return "HloModule m\n" + computations + "ENTRY e {\n" + "\n".join(lines) + f"\n  ROOT r = {root}\n}}\n"


CASES = {
    # unary
    **{op: module(["f32[2,3]{0,1}"], f"{op}(p0)") for op in [
        "abs", "ceil", "copy", "cosine", "exponential", "exponential-minus-one", "floor", "log", "log-plus-one",
        "logistic", "negate", "round-nearest-afz", "round-nearest-even", "rsqrt", "sign", "sine", "sqrt", "cbrt",
        "tan", "tanh", "is-finite", "real", "imag", "erf", "acos", "acosh", "asin", "asinh", "atanh", "cosh", "sinh"]},
    **{f"{op}-complex": module(["c64[2,3]"], f"{op}(p0)") for op in ["abs", "real", "imag", "sqrt"]},
    **{op: module(["s32[5]"], f"{op}(p0)") for op in ["count-leading-zeros", "popcnt", "not"]},
    "not-pred": module(["pred[5]"], "not(p0)"),
    "copy-tuple": module(["(f32[2], s32[])"], "copy(p0)"),
    "opt-barrier": module(["(f32[2], s32[])"], "opt-barrier(p0)"),
    "opt-barrier-array": module(["f32[2]"], "opt-barrier(p0)"),
    # binary
    **{op: module(["f32[2,3]{0,1}", "f32[2,3]"], f"{op}(p0, p1)") for op in [
        "add", "atan2", "divide", "maximum", "minimum", "multiply", "power", "remainder", "subtract"]},
    **{op: module(["s32[4]", "s32[4]"], f"{op}(p0, p1)") for op in [
        "and", "or", "xor", "shift-left", "shift-right-arithmetic", "shift-right-logical"]},
    "complex": module(["f32[4]", "f32[4]"], "complex(p0, p1)"),
    "complex-f64": module(["f64[4]", "f64[4]"], "complex(p0, p1)"),
    "compare": module(["f32[4]{0}", "f32[4]"], "compare(p0, p1), direction=LT"),
    "add-scalar-broadcast": module(["f32[2,3]", "f32[]"], "add(p0, p1)"),
    "add-degenerate": module(["f32[2,1]", "f32[1,3]"], "add(p0, p1)"),
    "add-mixed-precision": module(["bf16[4]", "f32[4]"], "add(p0, p1)"),
    # ternary
    "select": module(["pred[4]", "f32[4]", "f32[4]"], "select(p0, p1, p2)"),
    "select-layout": module(["pred[2,3]{0,1}", "f32[2,3]", "f32[2,3]"], "select(p0, p1, p2)"),
    "clamp": module(["f32[4]", "f32[4]{0}", "f32[4]"], "clamp(p0, p1, p2)"),
    # structural
    "tuple": module(["f32[4]", "s32[]"], "tuple(p0, p1)"),
    "tuple-empty": module([], "tuple()"),
    "get-tuple-element": module(["(f32[4], s32[])"], "get-tuple-element(p0), index=1"),
    "call": module(["f32[]"], "call(p0), to_apply=neg_f", NEG),
    "while": module(["(s32[], f32[4])"], "while(p0), condition=cond, body=body", TUPLE_BODY),
    "conditional": module(["s32[]", "f32[4]", "f32[4]"], "conditional(p0, p1, p2), branch_computations={br0, br1}",
                          BRANCHES),
    "conditional-pred": module(["pred[]", "f32[4]", "f32[4]"],
                               "conditional(p0, p1, p2), true_computation=br0, false_computation=br1", BRANCHES),
    "after-all": module(["token[]", "token[]"], "after-all(p0, p1)"),
    "after-all-empty": module([], "after-all()"),
    "add-dependency": module(["f32[4]", "token[]"], "add-dependency(p0, p1)"),
    "partition-id": module([], "partition-id()"),
    "replica-id": module([], "replica-id()"),
    "domain": module(["f32[4]"], "domain(p0), domain={kind=\"sharding\", entry={maximal device=0}, exit={maximal device=1}}"),
    "get-dimension-size": module(["f32[4,5]"], "get-dimension-size(p0), dimensions={1}"),
    "set-dimension-size": module(["f32[4,5]", "s32[]"], "set-dimension-size(p0, p1), dimensions={1}"),
    # shape-changing
    "broadcast": module(["f32[3]"], "broadcast(p0), dimensions={1}"),
    "broadcast-scalar": module(["f32[]"], "broadcast(p0), dimensions={}"),
    "broadcast-scalar-nodims": module(["f32[]"], "broadcast(p0)"),
    "concatenate": module(["f32[2,3]{0,1}", "f32[2,5]"], "concatenate(p0, p1), dimensions={1}"),
    "concatenate-three": module(["s32[1]", "s32[2]", "s32[3]"], "concatenate(p0, p1, p2), dimensions={0}"),
    "reduce": module(["f32[4,5,6]{0,1,2}", "f32[]"], "reduce(p0, p1), dimensions={1}, to_apply=add_f", ADD),
    "reduce-all": module(["f32[4,5]", "f32[]"], "reduce(p0, p1), dimensions={0,1}, to_apply=add_f", ADD),
    "reduce-variadic": module(["f32[4,5]", "s32[4,5]", "f32[]", "s32[]"],
                              "reduce(p0, p1, p2, p3), dimensions={0}, to_apply=add2", ADD2),
    "reduce-window": module(["f32[4,6]", "f32[]"],
                            "reduce-window(p0, p1), window={size=2x3 stride=2x1 pad=0_1x1_1}, to_apply=add_f", ADD),
    "reduce-window-dilated": module(["f32[8,8]", "f32[]"],
                                    "reduce-window(p0, p1), window={size=3x3 stride=1x2 lhs_dilate=2x1 rhs_dilate=1x2}, "
                                    "to_apply=add_f", ADD),
    "reduce-window-variadic": module(["f32[4,6]", "s32[4,6]", "f32[]", "s32[]"],
                                     "reduce-window(p0, p1, p2, p3), window={size=2x2}, to_apply=add2", ADD2),
    "pad": module(["f32[4,5]{0,1}", "f32[]"], "pad(p0, p1), padding=1_2x0_0_3"),
    "pad-negative": module(["f32[4,5]", "f32[]"], "pad(p0, p1), padding=-1_0x2_-1"),
    "reverse": module(["f32[4,5]{0,1}"], "reverse(p0), dimensions={0}"),
    "transpose": module(["f32[2,3,4]"], "transpose(p0), dimensions={2,0,1}"),
    "transpose-layout": module(["f32[2,3,4]{0,2,1}"], "transpose(p0), dimensions={2,0,1}"),
    "dot": module(["f32[2,3,4]", "f32[2,4,5]"],
                  "dot(p0, p1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}"),
    "dot-plain": module(["bf16[3,4]", "bf16[4]"], "dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
    "dot-outer": module(["f32[3]", "f32[5]"], "dot(p0, p1)"),
    "convolution": module(["f32[1,8,8,3]", "f32[3,3,3,16]"],
                          "convolution(p0, p1), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_01io->b01f"),
    "convolution-grouped": module(["f32[2,3,10,10]", "f32[6,1,3,3]"],
                                  "convolution(p0, p1), window={size=3x3}, dim_labels=bf01_oi01->bf01, "
                                  "feature_group_count=3"),
    "convolution-batch-group": module(["f32[4,3,10]", "f32[3,2,3]"],
                                      "convolution(p0, p1), window={size=3}, dim_labels=bf0_io0->fb0, batch_group_count=2"),
    "convolution-1d-nowindow": module(["f32[2,5]", "f32[5,7]"], "convolution(p0, p1), dim_labels=bf_io->bf"),
    "fft": module(["c64[4,8]"], "fft(p0), fft_type=FFT, fft_length={8}"),
    "rfft": module(["f32[4,8]"], "fft(p0), fft_type=RFFT, fft_length={8}"),
    "irfft": module(["c64[4,5]"], "fft(p0), fft_type=IRFFT, fft_length={8}"),
    "gather": module(["f32[5,6,7]", "s32[3,2]"],
                     "gather(p0, p1), offset_dims={1,2}, collapsed_slice_dims={0}, start_index_map={0,1}, "
                     "index_vector_dim=1, slice_sizes={1,2,7}"),
    "gather-batching": module(["f32[3,5,6]", "s32[3,4,1]"],
                              "gather(p0, p1), offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, "
                              "operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, "
                              "slice_sizes={1,1,6}"),
    "scatter": module(["f32[5,6]", "s32[3,1]", "f32[3,6]"],
                      "scatter(p0, p1, p2), update_window_dims={1}, inserted_window_dims={0}, "
                      "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add_f", ADD),
    "select-and-scatter": module(["f32[4,6]", "f32[2,3]", "f32[]"],
                                 "select-and-scatter(p0, p1, p2), window={size=2x2 stride=2x2}, select=ge_f, "
                                 "scatter=add_f", ADD + GE),
    "map": module(["f32[4,5]", "f32[4,5]"], "map(p0, p1), dimensions={0,1}, to_apply=add_f", ADD),
    "sort": module(["f32[10]"], "sort(p0), dimensions={0}, to_apply=ge_f", GE),
    "sort-pairs": module(["f32[10]", "s32[10]"], "sort(p0, p1), dimensions={0}, to_apply=lt2", LT2),
    "batch-norm-training": module(["f32[2,3,4,5]", "f32[3]", "f32[3]"],
                                  "batch-norm-training(p0, p1, p2), epsilon=0.001, feature_index=1"),
    "batch-norm-inference": module(["f32[2,3,4,5]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"],
                                   "batch-norm-inference(p0, p1, p2, p3, p4), epsilon=0.001, feature_index=1"),
    "batch-norm-grad": module(["f32[2,3,4,5]", "f32[3]", "f32[3]", "f32[3]", "f32[2,3,4,5]"],
                              "batch-norm-grad(p0, p1, p2, p3, p4), epsilon=0.001, feature_index=1"),
    "cholesky": module(["f32[3,4,4]"], "cholesky(p0), lower=true"),
    "triangular-solve": module(["f32[4,4]", "f32[4,6]"],
                               "triangular-solve(p0, p1), left_side=true, lower=true, transpose_a=NO_TRANSPOSE"),
    "scan": module(["f32[5]", "f32[]"], "scan(p0, p1), dimensions={0}, num_carries=1, to_apply=scan_step", SCAN_STEP),
    "scan-no-carry": module(["f32[3,5]"], "scan(p0), dimensions={1}, num_carries=0, to_apply=scan_map", SCAN_STEP),
    "topk": module(["f32[3,10]"], "topk(p0), k=4, largest=true"),
    "ragged-dot": module(["f32[11,5]", "f32[3,5,7]", "s32[3]"],
                         "ragged-dot(p0, p1, p2), lhs_contracting_dims={1}, rhs_contracting_dims={1}, "
                         "lhs_ragged_dims={0}, rhs_group_dims={0}"),
    "ragged-dot-contracting": module(["f32[11,5]", "f32[5,7]", "s32[3]"],
                                     "ragged-dot(p0, p1, p2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, "
                                     "lhs_ragged_dims={1}"),
    "ragged-dot-batch": module(["f32[2,11,5]", "f32[2,5,7]", "s32[2]"],
                               "ragged-dot(p0, p1, p2), lhs_batch_dims={0}, rhs_batch_dims={0}, "
                               "lhs_contracting_dims={2}, rhs_contracting_dims={1}, lhs_ragged_dims={0}"),
    "scaled-dot": module(["f8e4m3fn[4,32]", "f8e8m0fnu[4,1]", "f8e4m3fn[32,8]", "f8e8m0fnu[1,8]"],
                         "scaled-dot(p0, p1, p2, p3), lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
}
CASES.update({
    "reduce-dynamic": module(["f32[<=4,5]", "f32[]"], "reduce(p0, p1), dimensions={1}, to_apply=add_f", ADD),
    "concatenate-dynamic": module(["f32[<=2,3]", "f32[2,3]"], "concatenate(p0, p1), dimensions={1}"),
    "transpose-dynamic": module(["f32[<=2,3]"], "transpose(p0), dimensions={1,0}"),
    "add-dynamic-rhs": module(["f32[4]", "f32[<=4]"], "add(p0, p1)"),
    "nested-shapeless": module(["f32[3]"], "add(negate(p0), exponential(p0))"),
    "pad-interior-dynamic": module(["f32[<=4]", "f32[]"], "pad(p0, p1), padding=1_1_1"),
    "broadcast-dynamic": module(["f32[<=3]"], "broadcast(p0), dimensions={2}"),
    "dot-dynamic": module(["f32[<=3,4]", "f32[4,5]"], "dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
    "compare-tile-layout": module(["f32[8,128]{1,0:T(8,128)}", "f32[8,128]"], "compare(p0, p1), direction=EQ"),
    "transpose-tile-layout": module(["f32[8,128]{1,0:T(8,128)}"], "transpose(p0), dimensions={1,0}"),
    "gte-nested": module(["((f32[2], s32[]), u32[2])"], "get-tuple-element(p0), index=0"),
    "tuple-of-tuples": module(["(f32[2], s32[])", "u32[]"], "tuple(p0, p1)"),
    "map-scalar-first": module(["f32[]", "f32[4,5]"], "map(p0, p1), dimensions={0,1}, to_apply=add_f", ADD),
    "select-scalar-pred": module(["pred[]", "f32[4]", "f32[4]"], "select(p0, p1, p2)"),
})


# What XLA's parser refuses to infer, and hlo-audit infers anyway (harmless: see shape_inference.py's docstring).
XLA_REFUSES = {"opt-barrier", "opt-barrier-array", "reduce-window-variadic"}


def _root_shape(printed: str) -> str:
    rhs = next(line for line in printed.splitlines() if "ROOT %r = " in line).split("ROOT %r = ", 1)[1]
    if not rhs.startswith("("):
        return rhs.split(" ", 1)[0]
    depth = 0
    for end, c in enumerate(rhs):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0:
            return rhs[:end + 1]
    raise AssertionError(rhs)


def _opcode(text: str) -> str:
    return text.rsplit("ROOT r = ", 1)[1].split("(", 1)[0]


def test_every_opcode_xla_infers_has_a_case():
    assert {_opcode(text) for text in CASES.values()} == INFERRED_OPCODES


@pytest.mark.parametrize("name", sorted(set(CASES) - XLA_REFUSES))
def test_inferred_shape_is_xlas(name):
    text = CASES[name]
    xla = hlo.hlo_module_from_text(text).to_string()
    ours = parse_module(text).entry.root.shape
    assert with_default_layout(ours) == with_default_layout(parse_shape(_root_shape(xla)))
    assert our_counts(text) == xla_counts(text)


@pytest.mark.parametrize("name", sorted(XLA_REFUSES))
def test_what_xla_refuses_to_infer(name):
    with pytest.raises(Exception, match="failed to infer shape"):
        hlo.hlo_module_from_text(CASES[name])
    assert not parse_module(CASES[name]).entry.root.shape.text.startswith("b(")


@pytest.mark.parametrize("root", [
    "reshape(p0)", "convert(p0)", "bitcast(p0)", "slice(p0), slice={[0:1]}", "iota(), iota_dimension=0",
    "custom-call(p0), custom_call_target=\"foo\"", "all-reduce(p0), to_apply=add_f", "copy-start(p0)",
    "dynamic-slice(p0, p1), dynamic_slice_sizes={1}", "rng-bit-generator(p2), algorithm=rng_default",
])
def test_opcodes_that_must_carry_their_shape(root):
    text = module(["f32[4]", "s32[]", "u32[2]"], root, ADD)
    with pytest.raises(Exception, match="cannot infer shape for opcode"):
        hlo.hlo_module_from_text(text)
    with pytest.raises(HloParseError, match="does not infer the result shape of"):
        parse_module(text)


@pytest.mark.parametrize("root,message", [
    ("add(p0, p1)", "incompatible dimensions"),
    ("reduce(p0, p2), dimensions={3}, to_apply=add_f", "reduce dimensions"),
    ("concatenate(p0, p1), dimensions={0,1}", "one dimension"),
    ("pad(p0, p2), padding=1_1", "one low_high"),
    ("transpose(p0), dimensions={0,0}", "not a permutation"),
    ("dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}", "contracting or batch dimensions differ"),
])
def test_shapes_xla_cannot_infer_are_one_line_errors(root, message):
    text = module(["f32[4,5]", "f32[3,5]", "f32[]"], root, ADD)
    with pytest.raises(Exception, match="INVALID_ARGUMENT"):
        hlo.hlo_module_from_text(text)
    with pytest.raises(HloParseError, match=message) as error:
        parse_module(text)
    root_line = text.splitlines().index(f"  ROOT r = {root}") + 1
    assert "\n" not in str(error.value) and str(error.value).startswith(f"<text>:{root_line}: ")


def test_an_element_of_an_array_is_one_line_error():
    # XLA's parser aborts the process here (a CHECK in ShapeUtil::GetTupleElementShape): not asked.
    with pytest.raises(HloParseError, match="get-tuple-element index=0 of f32"):
        parse_module(module(["f32[4,5]"], "get-tuple-element(p0), index=0"))
