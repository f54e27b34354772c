"""The RNG dataflow analysis on small hand-written modules: one construct per test, each a way a key can go.

Parameter names follow jax's mangling (``state__a____rngs____key___value``), so paths and roles come out as they
do for real lowerings: ``state.a.rngs`` is the stream, ``.key`` / ``.count`` its parameters.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hlo_audit.cli import app
from hlo_audit.hlo.analysis import analyze
from xla_oracle import our_counts, xla_counts

KEY = "state__a____rngs____key___value.1"

THREEFRY = """
threefry2x32.1 {
  Arg_0.1 = u32[2]{0} parameter(0)
  Arg_1.1 = u32[2]{0} parameter(1)
  ROOT xor.1 = u32[2]{0} xor(Arg_0.1, Arg_1.1)
}
"""


def _stream(name: str, number: int) -> str:
    return (f"  state__{name}____rngs____key___value.1 = u32[2]{{0}} parameter({number})\n"
            f"  state__{name}____rngs____count___value.1 = u32[] parameter({number + 1})\n")


def verdicts(text: str) -> dict[str, tuple[str, str, float]]:
    report = analyze(text, "test.hlo").rng
    return {s.path: (s.verdict, s.where, s.increments) for s in report.streams}


def one_stream(body: str, out: str, computations: str = THREEFRY) -> str:
    """A module with stream ``a`` and a weight ``w.1`` in its entry: runs ``body`` (instruction lines) and returns
    ``(out, a's key, a's count)``, the key and count handed back unchanged."""
    return f"""HloModule m
{computations}
ENTRY main.1 {{
{_stream("a", 0)}  w.1 = f32[2]{{0}} parameter(2)
{body.strip(chr(10))}
  ROOT out.1 = (f32[2]{{0}}, u32[2]{{0}}, u32[]) tuple({out}, state__a____rngs____key___value.1, state__a____rngs____count___value.1)
}}
"""


def test_key_handed_back_through_pass_through_ops_and_count_incremented_is_carried():
    text = f"""HloModule m

ENTRY main.1 {{
{_stream("a", 0)}  w.1 = f32[4]{{0}} parameter(2)
  sharded.1 = u32[2]{{0}} custom-call(state__a____rngs____key___value.1), custom_call_target="Sharding", sharding={{replicated}}
  b.1 = u32[1,2]{{1,0}} bitcast(sharded.1)
  r.1 = u32[2]{{0}} reshape(b.1)
  c.1 = u32[2]{{0}} copy(r.1)
  one.1 = u32[] constant(1)
  inc.1 = u32[] add(state__a____rngs____count___value.1, one.1)
  t.1 = (u32[2]{{0}}, u32[]) tuple(c.1, inc.1)
  k.1 = u32[2]{{0}} get-tuple-element(t.1), index=0
  ROOT out.1 = (f32[4]{{0}}, u32[2]{{0}}, u32[]) tuple(w.1, k.1, inc.1)
}}
"""
    assert verdicts(text) == {"state.a.rngs": ("carried", "", 1)}



def test_key_through_a_pass_through_whose_result_is_a_one_element_tuple_is_followed():
    """Shardy's xla.sdy.GlobalToLocalShape returns a 1-tuple of its operand (real modules in the corpus: XLA's
    shardy_xla_pass_test); the element read back from it is the key, and `rng` once raised a TypeError there."""
    text = f"""HloModule m

ENTRY main.1 {{
{_stream("a", 0)}  w.1 = f32[4]{{0}} parameter(2)
  local.1 = (u32[2]{{0}}) custom-call(state__a____rngs____key___value.1), custom_call_target="xla.sdy.GlobalToLocalShape"
  k.1 = u32[2]{{0}} get-tuple-element(local.1), index=0
  ROOT out.1 = (f32[4]{{0}}, u32[2]{{0}}, u32[]) tuple(w.1, k.1, state__a____rngs____count___value.1)
}}
"""
    assert verdicts(text) == {"state.a.rngs": ("carried", "", 0)}
    result = CliRunner().invoke(app, ["rng", "-"], input=text)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1 and "1 carried" in result.output

def test_key_folded_into_random_bits_that_reach_the_loss_is_drawn():
    text = one_stream(f"""
  bits.1 = u32[2]{{0}} call({KEY}, {KEY}), to_apply=threefry2x32.1
  f.1 = f32[2]{{0}} convert(bits.1)
  loss.1 = f32[2]{{0}} add(w.1, f.1)
""", "loss.1")
    assert verdicts(text) == {"state.a.rngs": ("drawn", "main.1/bits.1", 0)}


def test_random_bits_nobody_uses_do_not_make_a_stream_drawn():
    text = f"""HloModule m
{THREEFRY}
ENTRY main.1 {{
{_stream("a", 0)}  bits.1 = u32[2]{{0}} call(state__a____rngs____key___value.1, state__a____rngs____key___value.1), to_apply=threefry2x32.1
  ROOT out.1 = (u32[2]{{0}}, u32[]) tuple(state__a____rngs____key___value.1, state__a____rngs____count___value.1)
}}
"""
    assert verdicts(text)["state.a.rngs"][0] == "carried"


LOOP = f"""HloModule m
{THREEFRY}
body.2 {{
  p.2 = (s32[], u32[2]{{0}}, u32[2]{{0}}, u32[], f32[2]{{0}}) parameter(0)
  i.2 = s32[] get-tuple-element(p.2), index=0
  one.2 = s32[] constant(1)
  next.2 = s32[] add(i.2, one.2)
  drawn_key.2 = u32[2]{{0}} get-tuple-element(p.2), index=1
  kept_key.2 = u32[2]{{0}} get-tuple-element(p.2), index=2
  count.2 = u32[] get-tuple-element(p.2), index=3
  uone.2 = u32[] constant(1)
  inc.2 = u32[] add(count.2, uone.2)
  acc.2 = f32[2]{{0}} get-tuple-element(p.2), index=4
  bits.2 = u32[2]{{0}} call(drawn_key.2, drawn_key.2), to_apply=threefry2x32.1
  f.2 = f32[2]{{0}} convert(bits.2)
  acc_next.2 = f32[2]{{0}} add(acc.2, f.2)
  ROOT t.2 = (s32[], u32[2]{{0}}, u32[2]{{0}}, u32[], f32[2]{{0}}) tuple(next.2, drawn_key.2, kept_key.2, inc.2, acc_next.2)
}}

cond.3 {{
  p.3 = (s32[], u32[2]{{0}}, u32[2]{{0}}, u32[], f32[2]{{0}}) parameter(0)
  i.3 = s32[] get-tuple-element(p.3), index=0
  n.3 = s32[] constant(4)
  ROOT lt.3 = pred[] compare(i.3, n.3), direction=LT
}}

ENTRY main.1 {{
{_stream("a", 0)}{_stream("b", 2)}  w.1 = f32[2]{{0}} parameter(4)
  zero.1 = s32[] constant(0)
  init.1 = (s32[], u32[2]{{0}}, u32[2]{{0}}, u32[], f32[2]{{0}}) tuple(zero.1, state__a____rngs____key___value.1, state__b____rngs____key___value.1, state__b____rngs____count___value.1, w.1)
  loop.1 = (s32[], u32[2]{{0}}, u32[2]{{0}}, u32[], f32[2]{{0}}) while(init.1), condition=cond.3, body=body.2
  acc.1 = f32[2]{{0}} get-tuple-element(loop.1), index=4
  kb.1 = u32[2]{{0}} get-tuple-element(loop.1), index=2
  cb.1 = u32[] get-tuple-element(loop.1), index=3
  ROOT out.1 = (f32[2]{{0}}, u32[2]{{0}}, u32[], u32[2]{{0}}, u32[]) tuple(acc.1, state__a____rngs____key___value.1, state__a____rngs____count___value.1, kb.1, cb.1)
}}
"""


def test_loop_state_keeps_streams_apart_and_counts_increments_per_trip():
    """A scan carries two streams in one loop tuple; only one is drawn. The other's count is bumped 4 times."""
    result = verdicts(LOOP)
    assert result["state.a.rngs"] == ("drawn", "body.2/bits.2", 0)
    assert result["state.b.rngs"] == ("carried", "", 4)


def test_unknown_trip_count_is_said():
    text = LOOP.replace("n.3 = s32[] constant(4)", "n.3 = s32[] parameter(1)").replace(
        "p.3 = (s32[], u32[2]{0}, u32[2]{0}, u32[], f32[2]{0}) parameter(0)",
        "p.3 = (s32[], u32[2]{0}, u32[2]{0}, u32[], f32[2]{0}) parameter(0)\n  q.3 = s32[] constant(4)")
    text = text.replace("n.3 = s32[] parameter(1)", "n.3 = s32[] add(i.3, q.3)")
    report = analyze(text, "test.hlo").rng
    assert not report.increments_exact
    assert {s.path: s.increments for s in report.streams}["state.b.rngs"] == 1  # one iteration's worth, flagged


def test_key_into_a_custom_call_it_does_not_know_is_unknown_and_says_where():
    text = one_stream(f"""
  mystery.1 = f32[2]{{0}} custom-call({KEY}, w.1), custom_call_target="my_kernel"
""", "mystery.1", computations="")
    verdict, where, _ = verdicts(text)["state.a.rngs"]
    assert verdict == "unknown" and "main.1/mystery.1" in where and "my_kernel" in where


def test_key_used_as_plain_data_is_unknown_naming_the_output():
    text = one_stream(f"""
  f.1 = f32[2]{{0}} convert({KEY})
  loss.1 = f32[2]{{0}} add(w.1, f.1)
""", "loss.1", computations="")
    assert verdicts(text)["state.a.rngs"][:2] == ("unknown", "the key reaches output 0 without random-bit generation")


def test_a_branch_chosen_by_random_bits_makes_the_stream_drawn():
    branches = """
yes.2 {
  y.2 = f32[2]{0} parameter(0)
  ROOT n.2 = f32[2]{0} negate(y.2)
}

no.3 {
  ROOT z.3 = f32[2]{0} parameter(0)
}
"""
    text = one_stream(f"""
  bits.1 = u32[2]{{0}} call({KEY}, {KEY}), to_apply=threefry2x32.1
  first.1 = u32[1]{{0}} slice(bits.1), slice={{[0:1]}}
  scalar.1 = u32[] reshape(first.1)
  zero.1 = u32[] constant(0)
  pick.1 = pred[] compare(scalar.1, zero.1), direction=EQ
  out.2 = f32[2]{{0}} conditional(pick.1, w.1, w.1), true_computation=yes.2, false_computation=no.3
""", "out.2", computations=THREEFRY + branches)
    assert verdicts(text)["state.a.rngs"][0] == "drawn"


def test_optimized_dump_fusion_named_threefry_by_metadata_counts_as_random_bits():
    fused = """
fused.2 {
  a.2 = u32[2]{0} parameter(0)
  ROOT x.2 = u32[2]{0} xor(a.2, a.2)
}
"""
    text = one_stream(f"""
  bits.1 = u32[2]{{0}} fusion({KEY}), kind=kLoop, calls=fused.2, metadata={{op_name="jit(train_step)/threefry2x32"}}
  f.1 = f32[2]{{0}} convert(bits.1)
  loss.1 = f32[2]{{0}} add(w.1, f.1)
""", "loss.1", computations=fused)
    assert verdicts(text)["state.a.rngs"][0] == "drawn"


def test_rng_cli_formats_and_bad_input(tmp_path):
    path = tmp_path / "loop.hlo"
    path.write_text(LOOP)
    # Wide enough that the headline, which starts with the (long, temporary) path, stays on one line.
    runner = CliRunner(env={"COLUMNS": "200"})
    table = runner.invoke(app, ["rng", str(path), "--streams"])
    assert table.exit_code == 1, table.output  # b.rngs is carried: dead RNG state found
    assert "2 RNG streams: 1 drawn, 1 carried (dead state), 0 unknown" in table.output
    assert "dead state: 2 entry parameters (12 bytes), 4 counter increments per step" in table.output
    doc = json.loads(runner.invoke(app, ["rng", str(path), "--format", "json", "--streams"]).output)
    assert doc["schema"] == "hlo-audit/rng/v1" and (doc["drawn"], doc["carried"], doc["unknown"]) == (1, 1, 0)
    assert [(p["pattern"], p["carried"], p["dead_params"], p["dead_increments"]) for p in doc["patterns"]] == [
        ("b.rngs", 1, 2, 4), ("a.rngs", 0, 0, 0)]
    assert {s["path"]: s["verdict"] for s in doc["stream_list"]} == {"state.a.rngs": "drawn", "state.b.rngs": "carried"}
    md = runner.invoke(app, ["rng", str(path), "--format", "markdown"]).output
    assert "| `b.rngs` | 1 | 0 | 1 | 0 | 2 | 4 |" in md
    for bad, message in ((str(tmp_path / "missing.hlo"), "no such file"),
                         ("llama3-8b/scan-off/int9/L2", "no such cell in the matrix")):
        result = runner.invoke(app, ["rng", bad])
        assert result.exit_code == 2 and message in result.output, result.output
    (tmp_path / "garbage.hlo").write_text("HloModule m\n\nENTRY main {\n  x = f32[] nonsense(\n")
    result = runner.invoke(app, ["rng", str(tmp_path / "garbage.hlo")])
    assert result.exit_code == 2 and "garbage.hlo" in result.output


@pytest.mark.parametrize("rule_pattern, severity", [(None, "advisory"), ("b.rngs", "waived"), ("x.*", "advisory")])
def test_dead_rng_policy_and_pattern_waivers(tmp_path, rule_pattern, severity):
    from hlo_audit.analysed import RngSummary
    from hlo_audit.hlo.params import ParamSummary
    from hlo_audit.judging.gate import Gate
    from hlo_audit.matrix import Cell
    from hlo_audit.policy import Policy, Waiver
    from hlo_audit.report.words import message
    from hlo_audit.results import LoweredCell

    report = analyze(LOOP, "loop").rng
    result = LoweredCell(cell=Cell("m", False, "none", 2), summary=ParamSummary(entry_params=0, by_dtype={}, by_role={}, groups={}, bytes_by_role={}), rng=RngSummary.of(report))
    waivers = (Waiver("dead_rng", "known", {}, pattern=rule_pattern),) if rule_pattern else ()

    def dead(gate: Gate):
        """The cell's dead-RNG finding as the gate's table judges it (the rules that need a golden do not run)."""
        return next((f for f in gate.judge_cell(result, None, None, None)[0] if f.rule == "dead_rng"), None)

    finding = dead(Gate(Policy({"dead_rng": "warn"}, waivers), "hlo-audit golden update"))
    assert finding.severity == severity
    assert "1 RNG stream never drawn: 2 entry parameters and 4 counter increments per step" in message(finding)
    assert dead(Gate(Policy({"dead_rng": "fail"}, waivers), "x")).severity == (
        "waived" if severity == "waived" else "regression")
    assert dead(Gate(Policy({"dead_rng": "off"}), "x")) is None


def test_random_bits_drawn_inside_an_async_computation_reach_the_output():
    wrapped = """
wrapped.2 {
  k.2 = u32[2]{0} parameter(0)
  ROOT bits.2 = u32[2]{0} call(k.2, k.2), to_apply=threefry2x32.1
}
"""
    text = one_stream(f"""
  start.1 = ((u32[2]{{0}}), u32[2]{{0}}, s32[]) async-start({KEY}), calls=wrapped.2
  done.1 = u32[2]{{0}} async-done(start.1)
  f.1 = f32[2]{{0}} convert(done.1)
  loss.1 = f32[2]{{0}} add(w.1, f.1)
""", "loss.1", computations=THREEFRY + wrapped)
    assert verdicts(text)["state.a.rngs"] == ("drawn", "wrapped.2/bits.2", 0)


# Transformer Engine's custom calls as MaxText's te_nvfp4 recipes lower them (operands and backend_config copied from
# llama3-8b/scan-off/te_nvfp4_no_rht/L2/cuda-sm_90; shapes shrunk). hlo/custom_calls.py cites TE's source for each.
TE_BITS = """
threefry2x32.1 {
  Arg_0.1 = u32[2]{0} parameter(0)
  Arg_1.1 = u32[2]{0} parameter(1)
  ROOT xor.1 = u32[2]{0} xor(Arg_0.1, Arg_1.1)
}

randint.2 {
  k.2 = u32[2]{0} parameter(0)
  bits.2 = u32[2]{0} call(k.2, k.2), to_apply=threefry2x32.1
  ROOT state.2 = u32[1,4]{1,0} broadcast(bits.2), dimensions={1}
}
"""
QUANTIZE = ("q.1 = (f4e2m1fn[2]{{0}}, f4e2m1fn[2]{{0}}, f8e4m3fn[1]{{0}}, f8e4m3fn[1]{{0}}, f32[1]{{0}}, bf16[1]{{0}}, "
            "f32[1]{{0}}) custom-call(w.1, empty.1, empty.1, {state}, empty.1, empty.2), "
            'custom_call_target="te_dbias_quantize_ffi", api_version=API_VERSION_TYPED_FFI, '
            "backend_config={{flatten_axis = -1 : i64, is_dbias = {dbias}, q_layout = 2 : i64, scaling_mode = 4 : i64, "
            "stochastic_rounding = {sr}, use_rht = false}}")


def te_step(sr: str = "true", dbias: str = "false", result: int = 0, state: str = "sr.1") -> str:
    """A key drawn into TE's rng state (fold_in + randint, as TE's NVFP4ScalingQuantizeConfig does), quantized,
    then multiplied by te_gemm_v2_ffi into the loss; ``result`` is the quantize result the gemm reads."""
    source = (f"sr.1 = u32[1,4]{{1,0}} call({KEY}), to_apply=randint.2" if state == "sr.1" else
              f"{state} = u32[1,4]{{1,0}} broadcast({KEY}), dimensions={{1}}")
    return one_stream(f"""
  {source}
  empty.1 = f32[1]{{0}} custom-call(), custom_call_target="AllocateBuffer"
  empty.2 = bf16[1,1]{{1,0}} custom-call(), custom_call_target="AllocateBuffer"
  {QUANTIZE.format(state=state, sr=sr, dbias=dbias)}
  d.1 = f4e2m1fn[2]{{0}} get-tuple-element(q.1), index={result}
  g.1 = (f32[2]{{0}}, u8[8]{{0}}) custom-call(d.1, empty.1, d.1, empty.1, empty.1, empty.1, empty.1), custom_call_target="te_gemm_v2_ffi", api_version=API_VERSION_TYPED_FFI
  loss.1 = f32[2]{{0}} get-tuple-element(g.1), index=0
""", "loss.1", computations=TE_BITS)


def test_te_stochastic_rounding_state_reaching_the_gemm_is_drawn():
    assert verdicts(te_step())["state.a.rngs"][:2] == ("drawn", "randint.2/bits.2")


def test_te_quantize_draws_from_its_rng_state_operand_itself():
    """quantization.cpp: with stochastic_rounding the kernel seeds Philox from operand 3: random-bit generation."""
    verdict, where, _ = verdicts(te_step(state="raw.1"))["state.a.rngs"]
    assert verdict == "drawn" and where == "main.1/q.1 (te_dbias_quantize_ffi)"


@pytest.mark.parametrize("sr, dbias", [("false", "false"), ("true", "true")])
def test_te_quantize_that_does_not_round_stochastically_never_reads_its_rng_state(sr, dbias):
    """stochastic_rounding = false, or is_dbias (nvte_quantize_dbias takes no quant_config): operand 3 is unread."""
    assert verdicts(te_step(sr=sr, dbias=dbias))["state.a.rngs"][0] == "carried"


def test_te_quantize_scales_do_not_depend_on_the_rng_state():
    """Only the quantized tensors (results 0 and 1) are rounded with the random bits; scale_inv (2) is not."""
    assert verdicts(te_step(result=2))["state.a.rngs"][0] == "carried"
    assert verdicts(te_step(result=1))["state.a.rngs"][0] == "drawn"


def test_random_bits_into_a_kernel_nobody_has_read_are_unknown_not_drawn():
    """The kernel may drop them: past an unknown custom call the stream is unknown, naming the call."""
    text = te_step().replace('"te_gemm_v2_ffi"', '"their_gemm"')
    verdict, where, _ = verdicts(text)["state.a.rngs"]
    assert verdict == "unknown" and "main.1/g.1 (their_gemm)" in where


def passing_through(with_idle: bool) -> str:
    """Stream ``a`` drawn and, with ``with_idle``, stream ``b`` handed back unchanged, both through every
    pass-through there is besides loops, branches and calls: a tuple-shaped Sharding custom call, an asynchronous
    start / update / done pair around a tuple-shaped MoveToHost, a copy-start / copy-done pair (b only)."""
    b = with_idle
    kinds = ["u32[2]{0}", *(["u32[2]{0}"] if b else []), "f32[2]{0}"]
    t = "(" + ", ".join(kinds) + ")"

    def elements(base: str, kb: str) -> str:
        return "\n".join(f"  {name} = {shape} get-tuple-element({base}), index={i}"
                         for i, (name, shape) in enumerate(zip(["ka" + kb, *(["kb" + kb] if b else []), "w" + kb],
                                                               kinds)))

    stream_b = ("  state__b____rngs____key___value.1 = u32[2]{0} parameter(2)\n"
                "  state__b____rngs____count___value.1 = u32[] parameter(3)\n") if b else ""
    b_key = ", state__b____rngs____key___value.1" if b else ""
    return f"""HloModule m
{THREEFRY}
wrapped.2 {{
  p.2 = {t} parameter(0)
  ROOT host.2 = {t} custom-call(p.2), custom_call_target="MoveToHost"
}}

ENTRY main.1 {{
{_stream("a", 0)}{stream_b}  state__w___value.1 = f32[2]{{0}} parameter({2 + 2 * b})
  t.1 = {t} tuple(state__a____rngs____key___value.1{b_key}, state__w___value.1)
  s.1 = {t} custom-call(t.1), custom_call_target="Sharding", sharding={{{", ".join(["{replicated}"] * (1 + b) + ["{maximal device=0}"])}}}
{elements("s.1", ".1")}
  start.1 = (({t}), {t}, s32[]) async-start(s.1), calls=wrapped.2
  update.1 = (({t}), {t}, s32[]) async-update(start.1)
  done.1 = {t} async-done(update.1)
{elements("done.1", ".2")}
  {"copy.1 = (u32[2]{0}, u32[2]{0}, u32[]) copy-start(kb.2)" if b else ""}
  {"kb.3 = u32[2]{0} copy-done(copy.1)" if b else ""}
  bits.1 = u32[2]{{0}} call(ka.2, ka.2), to_apply=threefry2x32.1
  f.1 = f32[2]{{0}} convert(bits.1)
  loss.1 = f32[2]{{0}} add(w.2, f.1)
  one.1 = u32[] constant(1)
  inca.1 = u32[] add(state__a____rngs____count___value.1, one.1)
  {"incb.1 = u32[] add(state__b____rngs____count___value.1, one.1)" if b else ""}
  ROOT out.1 = (f32[2]{{0}}, u32[2]{{0}}, u32[]{", u32[2]{0}, u32[]" if b else ""}) tuple(loss.1, state__a____rngs____key___value.1, inca.1{", kb.3, incb.1" if b else ""})
}}
"""


@pytest.mark.parametrize("with_idle", [True, False])
def test_the_pass_through_module_is_what_xla_parses(with_idle):
    text = passing_through(with_idle)
    assert our_counts(text) == xla_counts(text)


def test_streams_through_async_pairs_and_tuple_pass_throughs_keep_apart():
    """An async-update held the drawn key and the idle one in one tuple, and the analysis joined them: the idle
    stream was drawn. Each element is followed on its own now; the copy pair hands the idle key back as it was."""
    assert verdicts(passing_through(True)) == {"state.a.rngs": ("drawn", "main.1/bits.1", 1),
                                               "state.b.rngs": ("carried", "", 1)}


def test_rng_state_through_async_pairs_and_tuple_pass_throughs_is_stripped():
    """Without stream b, the same program: rng-state-only, the tuples, the async wrapper's parameter and its
    MoveToHost losing the element b held."""
    from hlo_audit.comparison import Structural

    compared = Structural.of_analyses(analyze(passing_through(True), "idle"), analyze(passing_through(False), "none"))
    assert (compared.diff.verdict, compared.params.by_dtype) == ("rng-state-only", {"u32": -2})
