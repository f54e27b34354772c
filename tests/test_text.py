"""The parser on real jax text, real XLA dumps (before and after optimization) and XLA-syntax corners."""

from __future__ import annotations

import re

import pytest
from jax._src.lib import hlo

import nnx_models
from hlo_audit.hlo.source import dump_entries, pick_dump_module
from hlo_audit.hlo.text import HloParseError, parse_file, parse_module, parse_shape
from nnx_models import ModelSpec
from xla_oracle import our_counts, xla_counts

SPECS = [
    ModelSpec(),
    ModelSpec(layers=4),
    ModelSpec(scan=True),
    ModelSpec(dropout_rate=0.0),
    ModelSpec(dropout_rate=0.5),
    ModelSpec(dropout_rate=0.5, scan=True),
    ModelSpec(rngs=False),
    ModelSpec(bridge="draws"),
    ModelSpec(bridge="nodraw", scan=True),
]


@pytest.mark.parametrize("spec", SPECS, ids=nnx_models.spec_name)
def test_entry_parameters_match_model_state(spec):
    """One entry parameter per state leaf plus x, by dtype: counted from the model, not from HLO."""
    module = parse_module(nnx_models.hlo_text(spec))
    expected = nnx_models.expected_counts(spec)
    params = module.entry.parameters
    assert len(params) == expected["total"]
    by_dtype = {}
    for p in params:
        by_dtype[p.shape.dtype] = by_dtype.get(p.shape.dtype, 0) + 1
    assert by_dtype == {k: v for k, v in expected.items() if k not in ("total", "rng_keys", "rng_counts")}
    assert [p.parameter_number for p in params] == list(range(len(params)))


def test_jax_printer_has_no_percent_and_no_signature():
    text = nnx_models.hlo_text(ModelSpec(dropout_rate=0.5))
    assert "%" not in text.split("ENTRY", 1)[1].splitlines()[0]
    module = parse_module(text)
    assert module.name == "jit_train_step"
    assert module.entry.root.opcode == "tuple"
    # Every operand resolves to an instruction printed before its user.
    for comp in module.computations.values():
        position = {instr.name: n for n, instr in enumerate(comp.instructions)}
        for n, instr in enumerate(comp.instructions):
            assert all(position[op] < n for op in instr.operands)


def test_dump_before_and_after_optimizations(dump_folder):
    before = parse_file(pick_dump_module(dump_folder, stage="before"))
    after = parse_file(pick_dump_module(dump_folder, stage="after"))
    assert before.name == after.name == "jit_train_step"
    assert len(before.entry.parameters) == len(after.entry.parameters) == nnx_models.expected_counts(
        ModelSpec(dropout_rate=0.5))["total"]
    opcodes = {i.opcode for i in after.instructions()}
    assert "fusion" in opcodes  # nested fused computations are parsed and linked
    fusion = next(i for i in after.instructions() if i.opcode == "fusion")
    assert fusion.called_computations()[0] in after.computations
    # The dump's metadata and the FileNames/StackFrames tables do not leak into instructions.
    assert all(i.name and not i.name.startswith("%") for i in before.instructions())
    assert any("metadata" in i.attrs for i in before.instructions())


def test_dump_entries_name_modules_and_stages(dump_folder):
    entries = dump_entries(dump_folder)
    names = {e.module_name for e in entries}
    assert "jit_train_step" in names
    assert {e.stage for e in entries} == {"before", "after"}
    assert pick_dump_module(dump_folder, module_regex="threefry").name.endswith("before_optimizations.txt")


@pytest.mark.parametrize("text,dtype,dims,layout", [
    ("f32[4,4]{1,0}", "f32", (4, 4), "1,0"),
    ("u32[]", "u32", (), None),
    ("bf16[2,<=8]{1,0:T(8,128)(2,1)}", "bf16", (2, 8), "1,0:T(8,128)(2,1)"),
    ("pred[?]", "pred", (-1,), None),
    ("f8e4m3fn[16]{0}", "f8e4m3fn", (16,), "0"),
])
def test_array_shapes(text, dtype, dims, layout):
    shape = parse_shape(text)
    assert (shape.dtype, shape.dims, shape.layout) == (dtype, dims, layout)


def test_tuple_shape_with_index_comments():
    shape = parse_shape("(s32[], u32[2]{0}, f32[], (f32[4], u32[]), /*index=5*/bf16[2,2]{1,0})")
    assert shape.is_tuple and len(shape.elements) == 5
    assert [leaf.dtype for leaf in shape.leaves()] == ["s32", "u32", "f32", "f32", "u32", "bf16"]
    assert shape.bytes == 4 + 8 + 4 + 16 + 4 + 8


# XLA-printer corners that a CPU lowering of the small models does not produce: async pairs, tuple element
# shorthand, shardings, frontend attributes, strings holding braces and commas, while/conditional.
XLA_SYNTAX = r'''HloModule jit_corners.7, is_scheduled=true, entry_computation_layout={(f32[8]{0}, u32[2]{0})->(f32[8]{0}, u32[])}

%add.clone (x.1: f32[], y.1: f32[]) -> f32[] {
  %x.1 = f32[] parameter(0)
  %y.1 = f32[] parameter(1)
  ROOT %add.3 = f32[] add(f32[] %x.1, f32[] %y.1)
}

%body.4 (arg_tuple.1: (s32[], f32[8])) -> (s32[], f32[8]) {
  %arg_tuple.1 = (s32[], f32[8]{0}) parameter(0)
  %one = s32[] constant(1)
  %i.2 = s32[] add(%arg_tuple.1#0, %one)
  ROOT %t = (s32[], f32[8]{0}) tuple(%i.2, %arg_tuple.1#1)
}

%cond.5 (arg_tuple.2: (s32[], f32[8])) -> pred[] {
  %arg_tuple.2 = (s32[], f32[8]{0}) parameter(0)
  %gte = s32[] get-tuple-element(%arg_tuple.2), index=0
  %limit = s32[] constant(4)
  ROOT %lt = pred[] compare(%gte, %limit), direction=LT
}

ENTRY %main.9 (p.1: f32[8], state__rngs____key___value.3: u32[2]) -> (f32[8], u32[]) {
  %p.1 = f32[8]{0} parameter(0), sharding={devices=[2]<=[2]}, metadata={op_name="x" source_file="a, b{c}.py" source_line=3}
  %state__rngs____key___value.3 = u32[2]{0} parameter(1), frontend_attributes={_xla_buffer_placement="arg"}
  %ars = f32[8]{0} all-reduce-start(f32[8]{0} %p.1), replica_groups={{0,1}}, to_apply=%add.clone, backend_config={"collective_backend_config":{"is_sync":false}}
  %ard = f32[8]{0} all-reduce-done(f32[8]{0} %ars)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8]{0}) tuple(s32[] %zero, f32[8]{0} %ard)
  %w = (s32[], f32[8]{0}) while((s32[], f32[8]{0}) %init), condition=%cond.5, body=%body.4, backend_config={"known_trip_count":{"n":"4"}}
  %res = f32[8]{0} get-tuple-element((s32[], f32[8]{0}) %w), index=1
  %cc = u32[] custom-call(u32[2]{0} %state__rngs____key___value.3), custom_call_target="weird\"target,{", api_version=API_VERSION_TYPED_FFI
  ROOT %out = (f32[8]{0}, u32[]) tuple(%res, %cc)
}
'''


def test_xla_syntax_corners():
    module = parse_module(XLA_SYNTAX, "corners.hlo")
    assert module.name == "jit_corners.7"
    assert set(module.computations) == {"add.clone", "body.4", "cond.5", "main.9"}
    entry = module.entry
    assert [p.name for p in entry.parameters] == ["p.1", "state__rngs____key___value.3"]
    assert entry.by_name["p.1"].attrs["sharding"] == "{devices=[2]<=[2]}"
    assert entry.by_name["ard"].operands == ("ars",)
    assert entry.by_name["w"].called_computations() == ["cond.5", "body.4"]
    assert entry.by_name["cc"].attrs["custom_call_target"] == r'"weird\"target,{"'
    # %arg_tuple.1#0 is XLA's shorthand for a get-tuple-element, which XLA's parser builds (and names so).
    body = module.computations["body.4"]
    assert body.by_name["i.2"].operands == ("arg_tuple.1_0", "one")
    assert (body.by_name["arg_tuple.1_0"].opcode, body.by_name["arg_tuple.1_0"].attrs) == (
        "get-tuple-element", {"index": "0"})
    assert body.by_name["t"].operands == ("i.2", "arg_tuple.1_1")
    assert entry.root.name == "out"


@pytest.mark.parametrize("text,message", [
    ("", "empty input"),
    ("hello world\n", "not HLO text"),
    ("HloModule m\n\nENTRY %e {\n  %p = f32[] parameter(0)\n", "truncated module"),
    ("HloModule m, is_scheduled=true\n", "no computation after the HloModule header"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = f32[] add(%p, %p)\n}\n", "undefined operand 'p'"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = f32[ add(%p)\n}\n", "expected a shape"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = f32[] call(), to_apply=%nowhere\n}\n", "undefined computation"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = f32[] constant(0), garbage\n}\n", "attribute without '='"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = zz32[] constant(0)\n}\n", "not an HLO shape"),
])
def test_malformed_text_is_one_clean_error(text, message):
    with pytest.raises(HloParseError) as info:
        parse_module(text, "bad.hlo")
    assert message in str(info.value)
    assert str(info.value).startswith("bad.hlo")
    assert "\n" not in str(info.value)


# Each kind of syntax XLA's parser reads, in the smallest module that shows it; XLA's parser is the judge
# (tests/xla_oracle.py): hlo-audit counts what XLA built. The real-HLO corpus (test_corpus.py) has them all in
# the wild; these run without it.
GRAMMAR = {
    "indented header after comments": """
  // RUN: hlo-opt %s --passes=dce | FileCheck %s
  /* Copyright 2026 The Authors.
     Licensed under the Apache License. */
    HloModule m, entry_computation_layout={(f32[2]{0})->f32[2]{0}}

ENTRY main {
  p = f32[2] parameter(0)
  ROOT n = f32[2] negate(p)
}
""",
    "instruction over several lines, trailing and block comments": """HloModule m
ENTRY main {
  p0 = f32[8,8] parameter(0)   // the input
  /* a comment
     over two lines, with ROOT x = f32[1] constant({1}) in it */
  ROOT d = f32[8,8]
      dot(p0,
          p0),
      lhs_contracting_dims={1},
      rhs_contracting_dims={0}
}
""",
    "string with a newline and escaped quotes (a TPU pallas_call)": """HloModule m
ENTRY main {
  p0 = f32[8,128]{1,0} parameter(0)
  ROOT k = f32[8,128]{1,0} custom-call(p0), custom_call_target="tpu_custom_call", backend_config="{\\"custom_call_config\\": {\\"body\\": \\"TUzvUgFN\\", \\"name\\": \\"_splash_attention\\",
\\"cost\\": \\"a \\\\\\"quoted\\\\\\" word\\"}}", frontend_attributes={kernel_name='pallas_call'}
}
""",
    "header and backend_config over several lines": """HloModule m, is_scheduled=true,
    entry_computation_layout={(f32[4]{0})->f32[4]{0}},
    frontend_attributes={fingerprint="abc"}

ENTRY main {
  p = f32[4] parameter(0)
  ROOT c = f32[4] custom-call(p), custom_call_target="foo", backend_config={
    "operation_queue_id": "0",
    "wait_on_operation_queues": []}
}
""",
    "named closing braces, execution threads, an async computation": """HloModule m

%host_fn (x: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  ROOT %y = f32[4] negate(f32[4] %x)
} // host_fn, execution_thread="host"

%wrapped (a: f32[4]) -> f32[4] {
  %a = f32[4] parameter(0)
  ROOT %b = f32[4] call(%a), to_apply=%host_fn
}, execution_thread="host"

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %start = ((f32[4]), f32[4], s32[]) async-start(%p), async_execution_thread="host", calls=%wrapped
  ROOT %done = f32[4] async-done(%start)
} // main
""",
    "shorthand async: custom-call-start and -done": """HloModule m
ENTRY main {
  a = f32[64] parameter(0)
  start = ((f32[64]), f32[64], u32[]) custom-call-start(a), custom_call_target="Foo"
  ROOT done = f32[64] custom-call-done(start)
}
""",
    "no result shapes, no ROOT, no ENTRY": """HloModule m
body {
  t = (s32[], f32[3]) parameter(0)
  i = get-tuple-element(t), index=0
  one = s32[] constant(1)
  next = add(i, one)
  x = get-tuple-element(t), index=1
  new = tuple(next, abs(x))
}
cond {
  t = (s32[], f32[3]) parameter(0)
  i = get-tuple-element(t), index=0
  ten = s32[] constant(10)
  ROOT lt = compare(i, ten), direction=LT
}
main {
  x = f32[3] parameter(0)
  zero = s32[] constant(0)
  init = tuple(zero, x)
  w = while(init), condition=cond, body=body
  ROOT r = get-tuple-element(w), index=1
}
""",
    "nested operands, inline to_apply bodies, t#i#j elements": """HloModule m
ENTRY test {
  p0 = (f32[10], (f32[20], f32[30])) parameter(0)
  s = f32[20] add(f32[20] %p0#1#0, f32[20] %p0#1#0)
  m = f32[20] multiply(s, f32[20] broadcast(f32[] constant(2)))
  ROOT r = f32[] reduce(m, f32[] constant(0)), dimensions={0}, to_apply={
    a = f32[] parameter(0)
    b = f32[] parameter(1)
    ROOT c = f32[] add(a, b)
  }
}
""",
    "tuple, token and buffer shapes; index comments anywhere": """HloModule m
ENTRY main {
  p = (f32[2], /*index=1*/s32[], (u32[2]{0}, pred[])) parameter(0)
  tok = token[] parameter(1)
  b = f32[16] parameter(2)
  pinned = b(f32[16]) custom-call(b), custom_call_target="Pin"
  unpinned = f32[16] custom-call(pinned), custom_call_target="Unpin"
  ROOT t = (f32[16], /*index=1*/token[]) tuple(unpinned, /*index=1*/tok)
}
""",
    "tuple sharding lists over lines, control predecessors": """HloModule m
ENTRY main {
  data = (f32[1024,2]{1,0}, f32[2]{0}) parameter(0), sharding={{devices=[2,1]<=[2]},
    {replicated}}
  a = f32[1024,2]{1,0} get-tuple-element(data), index=0, sharding={devices=[2,1]<=[2]}
  b = f32[2]{0} get-tuple-element(data), index=1, control-predecessors={a}
  ROOT t = (f32[1024,2]{1,0}, f32[2]{0}) tuple(a, b), sharding={{devices=[2,1]<=[2]}, {replicated}}
}
""",
    "element types": """HloModule m
ENTRY main {
  a = f8e4m3b11fnuz[4] parameter(0)
  b = f4e2m1fn[4] parameter(1)
  c = f6e3m2fn[4] parameter(2)
  d = f8e8m0fnu[4] parameter(3)
  e = s4[4] parameter(4)
  f = c128[2] parameter(5)
  ROOT t = (f8e4m3b11fnuz[4], f4e2m1fn[4], f6e3m2fn[4], f8e8m0fnu[4], s4[4], c128[2]) tuple(a, b, c, d, e, f)
}
""",
    "whitespace between a shape's tokens": """HloModule m
ENTRY e {
  p = s32 [5, 10] {1, 0} parameter(0)
  q = f32 [ 2 , 3 ]{ 0 , 1 } parameter(1)
  r = ( s32 [5,10], f32[] ) parameter(2)
  ROOT n = s32 [5,10] negate(p)
}
""",
    "inline bodies nested in inline bodies, their instructions named alike": """HloModule main, is_scheduled=true

ENTRY main {
  arg.0 = (s32[], s32[]) parameter(0)
  ROOT call.0 = call(arg.0), to_apply={
    arg.0 = (s32[], s32[]) parameter(0)
    ROOT call.0 = call(arg.0), to_apply={
      arg.0 = (s32[], s32[]) parameter(0)
      gte.0 = get-tuple-element(arg.0), index=0
      gte.1 = get-tuple-element(arg.0), index=1
      ROOT add.0 = add(gte.0, gte.1)
    }
  }
}
""",
}


def test_whitespace_inside_a_shape_is_no_part_of_it():
    spaced = parse_module(GRAMMAR["whitespace between a shape's tokens"])
    assert [p.shape.text for p in spaced.entry.parameters] == ["s32[5,10]{1,0}", "f32[2,3]{0,1}", "(s32[5,10], f32[])"]


def _xla_reads_tuple_element_shorthand() -> bool:
    """Whether the installed XLA's parser reads ``%t#i`` operands (jaxlib 0.10's does not: Python 3.11's newest)."""
    try:
        hlo.hlo_module_from_text("HloModule m\nENTRY e {\n  p = (f32[2]) parameter(0)\n"
                                 "  ROOT n = f32[2] negate(f32[2] %p#0)\n}\n")
    except Exception:  # noqa: BLE001 (XLA's parse error, whatever jaxlib calls it)
        return False
    return True


@pytest.mark.parametrize("kind", GRAMMAR)
def test_every_kind_of_syntax_xla_reads(kind):
    text = GRAMMAR[kind]
    if "t#i#j" in kind and not _xla_reads_tuple_element_shorthand():
        pytest.skip("this jaxlib's XLA parser does not read %t#i#j operands (newer XLA's syntax)")
    assert our_counts(text) == xla_counts(text)


def test_the_parsed_shorthands_are_what_xla_builds():
    nested = parse_module(GRAMMAR["nested operands, inline to_apply bodies, t#i#j elements"])
    entry = nested.entry
    assert [i.name for i in entry.instructions[:3]] == ["p0", "p0_1", "p0_1_0"]  # shared by both uses
    assert entry.by_name["s"].operands == ("p0_1_0", "p0_1_0")
    assert entry.by_name["m"].operands[1] == "broadcast.anon"
    assert entry.by_name["r"].called_computations() == ["r.to_apply"]
    shapeless = parse_module(GRAMMAR["no result shapes, no ROOT, no ENTRY"])
    assert shapeless.entry.name == "main" and shapeless.entry.root.name == "r"
    assert [i.shape.text for i in shapeless.computations["body"].instructions[-3:]] == [
        "f32[3]", "f32[3]", "(s32[], f32[3])"]
    async_shorthand = parse_module(GRAMMAR["shorthand async: custom-call-start and -done"])
    start = async_shorthand.entry.by_name["start"]
    wrapped = async_shorthand.computations[start.called_computations()[0]]
    assert (start.opcode, wrapped.root.opcode, wrapped.root.custom_call_target) == ("async-start", "custom-call", "Foo")
    pallas = parse_module(GRAMMAR["string with a newline and escaped quotes (a TPU pallas_call)"])
    config = pallas.entry.root.attrs["backend_config"]
    assert "\n" not in config and '\\n\\"cost' in config  # one line, the same string once XLA unescapes it


@pytest.mark.parametrize("text,line,message", [
    ("HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT v = reshape(p)\n}\n", 4,
     "cannot infer a result shape: XLA's parser does not infer the result shape of reshape"),
    ("HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT v = f32[2] negate(p)  /* never closed\n}\n", 4,
     "unterminated /* comment"),
    ("HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT v = f32[2] custom-call(p), backend_config=\"x\n}\n", 4,
     "unterminated string"),
])
def test_what_xla_rejects_or_hlo_audit_cannot_infer_is_one_line(text, line, message):
    with pytest.raises(HloParseError) as info:
        parse_module(text, "bad.hlo")
    assert str(info.value).startswith(f"bad.hlo:{line}: ") and message in str(info.value)
    assert "\n" not in str(info.value)


_BARE = """HloModule m
f {
  a = f32[2,4] parameter(0)
  ROOT n = f32[2,4] negate(a)
}
ENTRY e {
  x = f32[2,4] parameter(0)
  ROOT r = f32[2,4] %s
}
"""


@pytest.mark.parametrize("rhs", [
    "fusion(f32[2,4]{1,0}), kind=kLoop, calls=f",  # the module: a bare shape, no operand
    "fusion(f32[2,4]{1,0}, x), kind=kLoop, calls=f",
    "fusion(x, f32[2,4]), kind=kLoop, calls=f",
    "fusion((f32[2], s32[]), x), kind=kLoop, calls=f",
    "fusion(f32[2,4]{1,0} %x, f32[2]), kind=kLoop, calls=f",
    "fusion(, x), kind=kLoop, calls=f",
    "fusion(x, ), kind=kLoop, calls=f",
    "fusion(,), kind=kLoop, calls=f",
    "fusion(\n    f32[2,4]{1,0} /* a comment */,\n    x), kind=kLoop, calls=f",
    "custom-call(f32[2,4]), custom_call_target=\"foo\"",
    "custom-call(f32[2,4], x, b(f32[8])), custom_call_target=\"foo\"",
    "negate(f32[2,4], x)",
    "add(x, f32[] , f32[2,4] negate(x))",
])
def test_an_operand_that_is_only_a_shape_is_no_operand(rhs):
    """XLA tries such an operand as a name, then as a nested instruction, and moves on from the ',' or ')'
    where both stopped: no operand. Measured with jaxlib's parser, whatever the opcode."""
    text = _BARE % rhs
    assert our_counts(text) == xla_counts(text)
    xla_root = next(line for line in hlo.hlo_module_from_text(text).to_string().splitlines() if "ROOT %r" in line)
    xla_operands = [word.lstrip("%") for word in re.findall(r"%[\w.\-]+", xla_root.split("(", 1)[1])
                    if not word.startswith("%f")]
    ours = parse_module(text).entry.root.operands
    assert [o.split(".")[0] for o in ours] == [o.split(".")[0] for o in xla_operands]


@pytest.mark.parametrize("rhs", ["negate(f32[2,4] y)", "fusion(f32[2,4] 5), kind=kLoop, calls=f",
                                 "fusion(x y), kind=kLoop, calls=f"])
def test_what_is_not_an_operand_xla_rejects_too(rhs):
    text = _BARE % rhs
    with pytest.raises(Exception, match="INVALID_ARGUMENT"):
        hlo.hlo_module_from_text(text)
    with pytest.raises(HloParseError) as info:
        parse_module(text)
    assert str(info.value).startswith("<text>:8: ")
