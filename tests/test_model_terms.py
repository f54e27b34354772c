"""Findings that say what happened, in the model's terms (issue 38): a small MoE train step (microbatch scan, loss
scaling, a cond-skipped update, a load-balancing aux loss) and a KV-cache decode step (tests/moe_steps.py) as a
callable target, each change checked against its base's golden through `hlo-audit check` (or the diff of the two
lowerings, as `hlo-audit diff` reads them): growth is never an improvement, a finding's numbers agree with the
model (2 layers are 2 layers), and each change is named as its own kind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import moe_steps as ms
from hlo_audit.comparison import Structural
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.report.change_words import change_line
from in_process import hlo_audit_here

pytestmark = pytest.mark.xdist_group("model_terms")

CONFIG = """target = "moe_steps:target"
models = ["{model}"]
scan = ["off"]
quant = {quants}
layers = [{layers}]
{extra}"""


def cell(model: str, variant: str, layers: int) -> str:
    return f"{model}/scan-off/{variant}/L{layers}"


def write_config(project: Path, model: str, quants, layers: int, extra: str = "") -> None:
    (project / "hlo-audit.toml").write_text(CONFIG.format(model=model, quants=json.dumps(list(quants)),
                                                          layers=layers, extra=extra))


def golden_of_base_for(golden: Path, base: str, variant: str, suffix: str = "") -> None:
    """The base cell's golden (record and text) as the variant's: the change checked against what its base accepted.
    ``suffix``: ``/compiled`` for a compiled stage's golden."""
    record = json.loads((golden / f"{base}{suffix}.json").read_text())
    mine = golden / f"{variant}{suffix}.json"
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text(json.dumps({**record, "cell": f"{variant}{suffix}"}, indent=1) + "\n")
    shutil.copy(golden / f"{base}{suffix}.hlo.txt", golden / f"{variant}{suffix}.hlo.txt")


def ms_line(code: str) -> str:
    """``moe_steps.py:N``: the line of the model's source that holds ``code`` (once)."""
    lines = [n for n, line in enumerate(Path(ms.__file__).read_text().splitlines(), 1) if code in line]
    assert len(lines) == 1, (code, lines)
    return f"moe_steps.py:{lines[0]}"


def check(project: Path) -> tuple[int, dict]:
    ran = hlo_audit_here(project, "check", "--format", "json")
    assert ran.returncode in (0, 1), ran.stderr[-3000:]
    return ran.returncode, json.loads(ran.stdout)


def test_a_donated_kv_cache_that_doubled_is_no_donation_improvement(tmp_path):
    """The decode step's donated KV cache of twice the length, compiled: alias bytes double because the donated
    buffers did (no parameter newly donated). That is the cache's shapes and the memory that grew, regressions;
    never "[improvement donation]". Without a text compared, the arguments that grew by as much say the same."""
    shutil.copy(ms.__file__, tmp_path / "moe_steps.py")
    extra = 'stage = "compiled"\n[policy]\nmemory = "fail"\n'
    write_config(tmp_path, "decode", ["base"], 1, extra)
    assert hlo_audit_here(tmp_path, "golden", "update").returncode == 0
    golden, base, doubled = tmp_path / "golden", cell("decode", "base", 1), cell("decode", "cache_doubled", 1)
    golden_of_base_for(golden, base, doubled, "/compiled")
    alias = json.loads((golden / f"{base}/compiled.json").read_text())["memory"]["alias_bytes"]
    assert alias >= 2 * 16 * 2 * 8 * 4  # the two donated caches, f32[16,2,8] each
    write_config(tmp_path, "decode", ["base", "cache_doubled"], 1, extra)
    for with_text in (True, False):
        if not with_text:
            record = json.loads((golden / f"{doubled}/compiled.json").read_text())
            (golden / f"{doubled}/compiled.json").write_text(json.dumps({**record, "hlo": None}))
            (golden / f"{doubled}/compiled.hlo.txt").unlink()
        code, report = check(tmp_path)
        mine = [f for f in report["findings"] if f["cell"] == f"{doubled}/compiled" and f["severity"] != "ok"]
        assert code == 1 and report["verdicts"][f"{doubled}/compiled"] == "regression", mine
        assert not [f for f in mine if f["severity"] == "improvement"], mine
        assert not [f for f in mine if f["rule"] == "donation"], mine
        (memory,) = [f for f in mine if f["rule"] == "memory"]
        assert memory["severity"] == "regression", memory
        if with_text:
            (shapes,) = [f for f in mine if f["rule"] == "shapes"]
            inputs = [c for c in shapes["details"]["changes"] if c["subject"] == "inputs"]
            assert inputs and set(inputs[0]["place"]["paths"]) == {"cache.k", "cache.v"}, shapes


def test_a_literal_key_in_a_compiled_decode_step_is_named_by_the_key_rule(tmp_path):
    """The decode step samples its next token from PRNGKey(0) written in the step instead of the key it is given
    (issue 47, item 3). Compiled, XLA inlines and fuses jax.random's calls (threefry's rounds a while loop among the
    model's fusions, the literal key's halves folded into constants): the text shows no draw, and the only finding was
    "program size: +188 instructions". The key rule reads the keys of the module XLA was handed, kept by the stage and
    by the golden, and names the literal key at the model's line; the golden's own cell has none."""
    shutil.copy(ms.__file__, tmp_path / "moe_steps.py")
    extra = 'stage = "compiled"\n[policy]\nhlo_text = "warn"\n'
    write_config(tmp_path, "decode", ["sampled"], 1, extra)
    assert hlo_audit_here(tmp_path, "golden", "update").returncode == 0
    golden, base, literal = tmp_path / "golden", cell("decode", "sampled", 1), cell("decode", "sampled_literal_key", 1)
    assert json.loads((golden / f"{base}/compiled.json").read_text())["key_hazards"] == []
    golden_of_base_for(golden, base, literal, "/compiled")
    write_config(tmp_path, "decode", ["sampled", "sampled_literal_key"], 1, extra)
    code, report = check(tmp_path)
    named = {f["cell"]: f for f in report["findings"] if f["rule"] == "rng_keys"}
    assert code == 1 and set(named) == {f"{literal}/compiled"}, report["findings"]
    finding = named[f"{literal}/compiled"]
    assert finding["severity"] == "regression", finding
    where = ms_line("jax.random.categorical(sample_key, out[0])")
    assert f"a literal key drawn from at {where}" in finding["message"], finding["message"]
    assert "literal keys 0 -> 1" in finding["message"], finding["message"]
    # `rng` of the compiled cell lists it too (from the module XLA was handed).
    ran = hlo_audit_here(tmp_path, "rng", f"{literal}/compiled", env={"COLUMNS": "200"})
    said = " ".join(ran.stdout.split())
    assert ran.returncode == 1 and f"literal: a key computed from constants alone, drawn from at {where}" in said, said


MOE_VARIANTS = ("scan", "micro_8", "aux_dropped", "no_loss_scale", "where_update", "top_2", "router_bf16")


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> tuple[int, dict]:
    """`check` of each MoE change against the base step's golden (2 layers; the text rule at warn)."""
    project = tmp_path_factory.mktemp("moe")
    shutil.copy(ms.__file__, project / "moe_steps.py")
    write_config(project, "moe", ["base"], 2)
    assert hlo_audit_here(project, "golden", "update").returncode == 0
    for variant in MOE_VARIANTS:
        golden_of_base_for(project / "golden", cell("moe", "base", 2), cell("moe", variant, 2))
    write_config(project, "moe", ["base", *MOE_VARIANTS], 2, '[policy]\nhlo_text = "warn"\n')
    return check(project)


def moe_findings(report: dict, variant: str, rule: str | None = None) -> list[dict]:
    return [f for f in report["findings"] if f["cell"] == cell("moe", variant, 2) and f["severity"] != "ok"
            and rule in (None, f["rule"])]


def test_a_two_layer_model_rolled_into_a_scan_says_two_layers(moe):
    """The 2 blocks stacked and scanned: 2 layers rolled into the forward and backward loops, and no finding of the
    cell counts a third layer (the stack's name beside the unrolled layers' indices once made 3)."""
    code, report = moe
    (loops,) = moe_findings(report, "scan", "loops")
    rolled = loops["details"]["changes"][0]
    assert (rolled["subject"], rolled["layers"]) == ("rolled", 2), rolled
    assert loops["message"].startswith("loops: 2 layers rolled into 2 loops of 2 iterations"), loops["message"]
    changes = [c for f in moe_findings(report, "scan") for c in f["details"].get("changes", [])
               if isinstance(c, dict)]
    assert changes and max(c["layers"] for c in changes) == 2, [(c["kind"], c["layers"]) for c in changes]
    assert not [f for f in moe_findings(report, "scan") if "3 layers" in f["message"]]


def test_a_trip_count_is_the_loops_finding_not_a_program_size_one(moe):
    """8 microbatches instead of 2: the same program, its accumulation loop run 8 times. The loops rule names the
    trip count; no program-size finding says "instructions 897 -> 897, per step 1,320 -> 4,068" beside it."""
    code, report = moe
    (loops,) = moe_findings(report, "micro_8", "loops")
    (trips,) = loops["details"]["changes"]
    assert (trips["subject"], trips["before"], trips["after"]) == ("trip count", "2 iterations", "8 iterations")
    assert loops["severity"] == "regression" and not moe_findings(report, "micro_8", "program_size")


def diff_of(base: str, variant: str) -> Structural:
    """The two lowerings compared as `hlo-audit diff` compares two files (no leaf types: state paths from the
    texts' own names, ``state_1.0__mu__layers_0.router`` for an optimizer moment)."""
    return Structural.of_inputs(analyze(ms.lower(base), base), analyze(ms.lower(variant), variant))


def test_diffed_from_texts_a_two_layer_model_spans_two_layers():
    """From the texts alone, the unrolled side's layers (``layers_0``, ``layers_1`` and each optimizer moment's
    ``0__mu__layers_1``) and the scanned side's stack (``layers``) are 2 layers: no "3 layers" (the stack's name
    counted beside the indices) nor "6 layers" (each moment's name a layer of its own)."""
    for a, b in (("base", "scan"), ("scan", "base")):
        named = diff_of(a, b).diff.named
        assert named and max(c.layers for c in named) == 2, [(c.kind.value, c.subject, c.layers) for c in named]
        assert not [line for c in named if " layers" in (line := change_line(c)) and "2 layers" not in line
                    and ("per layer" in line or "rolled" in line)], [change_line(c) for c in named]


def test_a_cond_replaced_by_computing_both_branches_is_named_a_conditional(moe):
    """The update under ``lax.cond`` (skipped where a gradient is not finite) computed always and selected by
    ``jnp.where``: the conditional removed with its branches' sizes, its branches' work now inline and the 25
    leaves of the state selected, placed at the model's ``jnp.where``; nothing else fails (no "program size -5%", no ops)."""
    code, report = moe
    (finding,) = moe_findings(report, "where_update", "conditional")
    (change,) = finding["details"]["changes"]
    assert (change["kind"], change["action"], change["per_step"]) == ("conditional", "removed", 1), change
    # The update (adam's moments, the bias correction, the new weights) and the branch that keeps the state.
    assert change["before"].startswith("2 branches: ") and change["after"] == "both branches computed, " \
        "25 values selected", change  # every leaf of the state: 8 weights, adam's count and 2 moments of each
    assert change["place"]["source"] == ms_line("jnp.where(finite, new, old)"), change["place"]
    assert finding["message"].startswith("conditional: a conditional removed (2 branches: "), finding["message"]
    regressions = {f["rule"] for f in moe_findings(report, "where_update") if f["severity"] == "regression"}
    assert regressions == {"conditional"}, moe_findings(report, "where_update")


def test_a_conditional_added_back_from_the_texts():
    """`hlo-audit diff` the other way: ``jnp.where`` of both branches replaced by the ``lax.cond``, a conditional
    added, its instructions the program's whole difference (nothing left to program size)."""
    structural = diff_of("where_update", "base")
    named = [c for c in structural.diff.named if c.kind.value not in ("instructions", "header")]
    (added,) = named
    before, after = structural.sizes["instructions"]
    assert (added.kind.value, added.action.value, added.instructions) == ("conditional", "added", after - before)
    assert change_line(added).startswith("conditional: a conditional added (2 branches: ")


def test_loss_scaling_removed_is_named_not_ops_at_equal_shapes(moe):
    """No more static loss scaling (the loss x1024 before the gradients, each gradient /1024 after): named loss
    scaling by the gradient rule, with its factor and the 9 values it divided (8 weights' gradients and the loss
    reported), and the backward pass's seeds jax had folded the factor into; not "ops: 24 instructions at equal
    shapes". The other way from the texts: added, the program's whole difference."""
    code, report = moe
    (finding,) = moe_findings(report, "no_loss_scale", "gradient")
    (change,) = finding["details"]["changes"]
    assert (change["kind"], change["action"], change["before"], change["count"]) == (
        "loss_scaling", "removed", "loss x1024, 9 values /1024", 9), change
    # At the kept instruction that read what went (the golden's text keeps no source): the gradients' accumulation.
    assert change["place"]["source"] == ms_line("jax.tree.map(jnp.add, acc, grads)"), change["place"]
    assert finding["message"].startswith("loss scaling: removed (loss x1024, 9 values /1024"), finding["message"]
    regressions = {f["rule"] for f in moe_findings(report, "no_loss_scale") if f["severity"] == "regression"}
    assert regressions == {"gradient"}, moe_findings(report, "no_loss_scale")
    structural = diff_of("no_loss_scale", "base")
    (added,) = [c for c in structural.diff.named if c.kind.value not in ("instructions", "header")]
    before, after = structural.sizes["instructions"]
    assert (added.kind.value, added.action.value, added.instructions) == ("loss_scaling", "added", after - before)


def test_loss_scaling_removed_compiled_counts_each_instruction_once():
    """Compiled, the scaling's multiplies and divides come with what XLA fused to feed them; a fused body that was
    also a carrier was counted twice: "loss scaling removed ... -28 instructions" where the program shrank by 24.
    The finding's count is the program's."""
    texts = [ms.train_traced(ms.VARIANTS.get(name, ms.Variant())).lower(lowering_platforms=("cpu",)).compile()
             .as_text() for name in ("base", "no_loss_scale")]
    structural = Structural.of_inputs(analyze(texts[0], "base"), analyze(texts[1], "no_loss_scale"))
    (scaling,) = structural.named(ChangeKind.LOSS_SCALING)
    before, after = structural.sizes["instructions"]
    assert scaling.instructions == after - before < 0, (scaling.instructions, before, after)


def test_an_aux_loss_dropped_is_a_loss_term_removed_not_values_reshaped(moe):
    """The load-balancing aux loss dropped: a term removed from the loss, what reduced into it (the experts' token
    fractions and mean router probabilities of both layers: 6 reductions), its weight (x0.01) and its backward
    pass, by the gradient rule; no "shapes: values reshaped" nor "ops" besides. The other way, added."""
    code, report = moe
    (finding,) = moe_findings(report, "aux_dropped", "gradient")
    (change,) = finding["details"]["changes"]
    assert (change["kind"], change["action"], change["before"]) == ("loss_term", "removed", "6 reductions, x0.01")
    # At the loss now computed without it (the scaled loss: the kept instruction that read the sum).
    assert change["place"]["source"] == ms_line("_loss(variant, p, tokens, targets) * variant.loss_scale"), change
    assert change["instructions"] < 0, change
    assert finding["message"].startswith("loss: a term removed (6 reductions, x0.01; "), finding["message"]
    regressions = {f["rule"] for f in moe_findings(report, "aux_dropped") if f["severity"] == "regression"}
    assert regressions == {"gradient"}, moe_findings(report, "aux_dropped")
    (added,) = [c for c in diff_of("aux_dropped", "base").diff.named if c.kind.value not in ("instructions", "header")]
    assert (added.kind.value, added.action.value, added.before) == ("loss_term", "added", "6 reductions, x0.01")


def test_the_text_rule_says_the_instructions_that_differ_not_the_lines(moe):
    """The text rule's headline is the program's change: the aux loss dropped is 31 instructions removed (the loss
    term's -31) and 4 changed, the lines of the text that moved with their renumbering only beside it."""
    _, report = moe
    (text,) = moe_findings(report, "aux_dropped", "hlo_text")
    (term,) = moe_findings(report, "aux_dropped", "gradient")[0]["details"]["changes"]
    assert term["instructions"] == -31, term
    head = "normalized HLO differs from the golden in 35 instructions (31 removed, 4 changed; "
    assert text["message"].startswith(head), text["message"]
    lines = int(text["message"][len(head):].split(" text lines)")[0].replace(",", ""))
    assert lines == text["details"]["changed_lines"] > 35, text


def test_top_1_routing_made_top_2_is_a_routing_change_not_ops(moe):
    """The router's experts chosen by ``top_k`` with k=2 instead of ``argmax``: "routing: argmax x2 -> top_k (k=2)
    x2" at the model's line, by the routing rule; argmax's computations and the one_hot of its index are the
    routing's, no ops or program size beside it. The other way, from the texts: top_k back to argmax."""
    _, report = moe
    (finding,) = moe_findings(report, "top_2", "routing")
    assert finding["severity"] == "regression", finding
    (change,) = finding["details"]["changes"]
    assert (change["action"], change["before"], change["after"]) == ("changed", "argmax x2", "top_k (k=2) x2")
    assert change["place"]["source"] == ms_line("jax.lax.top_k(probs, variant.top_k)"), change
    assert finding["message"].startswith("routing: argmax x2 -> top_k (k=2) x2, "), finding["message"]
    assert {f["rule"] for f in moe_findings(report, "top_2") if f["severity"] == "regression"} == {"routing"}
    (back,) = diff_of("top_2", "base").named(ChangeKind.ROUTING)
    assert (back.before, back.after) == ("top_k (k=2) x2", "argmax x2"), back


def test_the_router_in_bf16_is_a_precision_change_reading_the_router(moe):
    """The router's logits computed in bf16: the router's dots named by the precision rule, reading the router's
    weights; no shapes, ops or routing finding."""
    _, report = moe
    (finding,) = moe_findings(report, "router_bf16", "precision")
    (change,) = finding["details"]["changes"]
    assert change["after"].startswith("bf16 x bf16") and change["place"]["paths"] == ["state.0.layers_*.router"]
    assert {f["rule"] for f in moe_findings(report, "router_bf16") if f["severity"] == "regression"} == {"precision"}


def test_a_one_hot_embedding_says_the_flops_its_dots_add():
    """The embedding as ``one_hot(tokens) @ embed`` instead of a gather: the ops it adds carry their FLOPs, the
    forward dot's and the embedding gradient's, 2 x tokens x vocab x width each per microbatch: 32,768 per step."""
    ops = diff_of("base", "one_hot_embed").named(ChangeKind.OPS)
    expected = 2 * ms.MICRO * (2 * ms.TOKENS * ms.VOCAB * ms.WIDTH)
    assert sum(c.flops for c in ops) == expected, [(change_line(c), c.flops) for c in ops]
    assert any("FLOPs per step" in change_line(c) for c in ops)


@pytest.mark.parametrize("stage", ["lowered", "compiled"])
def test_the_router_in_bf16_at_decode_is_a_precision_change_at_the_router(tmp_path, stage):
    """The decode step's MoE router in bf16, lowered and compiled: the router's dot named by the precision rule,
    reading the router's weights, and nothing else fails (no program size for the converts it names). Compiled for
    the CPU, the dot keeps its f32 types and reads operands rounded to bf16 (converts to bf16 and back, in fusions of
    their own): that is the precision change, not "ops: fusion +2" beside a rewired dot. Lowered, it is placed at
    the model's line at both stages (a compiled text's own metadata places it, as
    ``test_compiled_dumps_place_the_rounding_at_the_router`` reads a dump)."""
    shutil.copy(ms.__file__, tmp_path / "moe_steps.py")
    extra = f'stage = "{stage}"\n'
    write_config(tmp_path, "decode", ["base"], 1, extra)
    assert hlo_audit_here(tmp_path, "golden", "update").returncode == 0
    suffix = "" if stage == "lowered" else f"/{stage}"
    base, bf16 = cell("decode", "base", 1), cell("decode", "router_bf16", 1)
    golden_of_base_for(tmp_path / "golden", base, bf16, suffix)
    write_config(tmp_path, "decode", ["base", "router_bf16"], 1, extra + '[policy]\nhlo_text = "warn"\n')
    code, report = check(tmp_path)
    mine = [f for f in report["findings"] if f["cell"] == f"{bf16}{suffix}" and f["severity"] != "ok"]
    assert code == 1 and {f["rule"] for f in mine if f["severity"] == "regression"} == {"precision"}, mine
    (finding,) = [f for f in mine if f["rule"] == "precision"]
    (change,) = finding["details"]["changes"]
    assert (change["before"], change["count"]) == ("f32 x f32 -> f32", 1), change
    rounded = "bf16 x bf16 -> f32 (f32 rounded to bf16)"
    assert change["after"] == ("bf16 x bf16 -> bf16" if stage == "lowered" else rounded), change
    assert finding["message"].startswith(f"precision: 1 dot: f32 x f32 -> f32 now {change['after']}; converts +")
    assert change["place"]["paths"] == ["params.moe.router"], change["place"]
    assert change["place"]["source"] == ms_line("x.astype(jnp.bfloat16) @ block"), change["place"]


def test_compiled_dumps_place_the_rounding_at_the_router():
    """Two compiled modules diffed as `hlo-audit diff` reads dumps (their metadata printed): the compiled dot has none,
    and is placed at the converts that round its operands, the model's router line; the fusions that round them
    and the dot rewired to read them are the precision change's, nothing is left to ops or program size."""
    texts = [ms.decode_traced(ms.VARIANTS.get(name, ms.Variant())).lower(lowering_platforms=("cpu",)).compile()
             .as_text() for name in ("base", "router_bf16")]
    structural = Structural.of_inputs(analyze(texts[0], "base"), analyze(texts[1], "router_bf16"))
    (change,) = structural.diff.named
    assert (change.kind, change.before, change.after) == (ChangeKind.PRECISION, "f32 x f32 -> f32",
                                                         "bf16 x bf16 -> f32 (f32 rounded to bf16)"), change
    assert (change.instructions, change.place.paths) == (4, ("params.moe.router",)), change
    assert change.place.source == ms_line("x.astype(jnp.bfloat16) @ block"), change.place


def test_routing_that_shrank_a_small_step_is_not_counted_again_as_program_size(tmp_path):
    """The decode step's router made top-2: 16 of its 133 instructions go with argmax (-12%, beyond program size's
    5%). The routing rule names them; program size does not judge the same instructions again."""
    shutil.copy(ms.__file__, tmp_path / "moe_steps.py")
    write_config(tmp_path, "decode", ["base"], 1)
    assert hlo_audit_here(tmp_path, "golden", "update").returncode == 0
    top_2 = cell("decode", "top_2", 1)
    golden_of_base_for(tmp_path / "golden", cell("decode", "base", 1), top_2)
    write_config(tmp_path, "decode", ["base", "top_2"], 1, '[policy]\nhlo_text = "warn"\n')
    _, report = check(tmp_path)
    mine = [f for f in report["findings"] if f["cell"] == top_2 and f["severity"] != "ok"]
    (routing,) = [f for f in mine if f["rule"] == "routing"]
    (change,) = routing["details"]["changes"]
    assert (change["after"], change["instructions"]) == ("top_k (k=2)", -16), change
    assert {f["rule"] for f in mine if f["severity"] == "regression"} == {"routing"}, mine
    assert not [f for f in mine if f["rule"] == "program_size"], mine


# Each train-step variant's own kind: the rules whose findings fail its compiled check against the base's golden, as
# its lowered check names it (a stack of scanned layers is also its inputs' shapes and count; 8 microbatches, the
# inputs' shapes; the KV cache is the decode step's, the train step's program is the same).
OWN_RULES = {
    "scan": {"count", "loops", "shapes"}, "micro_8": {"loops", "shapes"}, "aux_dropped": {"gradient"},
    "no_loss_scale": {"gradient"}, "where_update": {"conditional"}, "top_2": {"routing"},
    "router_bf16": {"precision"}, "one_hot_embed": {"ops"}, "cache_doubled": set(),
}


@pytest.fixture(scope="module")
def moe_compiled(tmp_path_factory) -> tuple[int, dict]:
    """`check` of every MoE change compiled against the base step's compiled golden (2 layers; the text rule at
    warn)."""
    project = tmp_path_factory.mktemp("moe_compiled")
    shutil.copy(ms.__file__, project / "moe_steps.py")
    extra = 'stage = "compiled"\n'
    write_config(project, "moe", ["base"], 2, extra)
    assert hlo_audit_here(project, "golden", "update").returncode == 0
    for variant in ms.VARIANTS:
        golden_of_base_for(project / "golden", cell("moe", "base", 2), cell("moe", variant, 2), "/compiled")
    write_config(project, "moe", ["base", *ms.VARIANTS], 2, extra + '[policy]\nhlo_text = "warn"\n')
    return check(project)


@pytest.mark.parametrize("variant", sorted(ms.VARIANTS))
def test_each_change_compiled_is_named_by_its_own_kind(moe_compiled, variant):
    """Compiled for the CPU (XLA's fusions between the model's ops), each change fails by its own rules only: the aux
    loss dropped a loss term, loss scaling removed, the cond's update computed always a conditional, top-2 routing,
    the router in bf16 precision; no leftover "ops" or "program size" beside it (a fusion's body is matched through
    its operands, not by position; the router gradient's dot, transposed by XLA's layout, is still the same dot)."""
    _, report = moe_compiled
    mine = [f for f in report["findings"] if f["cell"] == f"{cell('moe', variant, 2)}/compiled"
            and f["severity"] == "regression"]
    assert {f["rule"] for f in mine} == OWN_RULES[variant], [f["message"][:200] for f in mine]
    kinds = {"aux_dropped": "loss_term", "no_loss_scale": "loss_scaling", "where_update": "conditional",
             "top_2": "routing"}
    if variant in kinds:
        (finding,) = mine
        assert [c["kind"] for c in finding["details"]["changes"]] == [kinds[variant]], finding
    if variant == "top_2":
        (change,) = mine[0]["details"]["changes"]
        assert (change["before"], change["after"]) == ("argmax x2", "top_k (k=2) x2"), change
    # Placed at the model's line, as lowered (the compiled text's own metadata).
    lines = {"aux_dropped": "_loss(variant, p, tokens, targets) * variant.loss_scale",
             "no_loss_scale": "jax.tree.map(jnp.add, acc, grads)", "where_update": "jnp.where(finite, new, old)",
             "top_2": "jax.lax.top_k(probs, variant.top_k)", "router_bf16": "x.astype(jnp.bfloat16) @ block"}
    if variant in lines:
        places = {c["place"]["source"] for f in mine for c in f["details"]["changes"]}
        assert places == {ms_line(lines[variant])}, places
