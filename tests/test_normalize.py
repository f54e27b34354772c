"""Canonical text: insertion-stable names, volatile parts dropped, semantics kept, deterministic."""

from __future__ import annotations

import difflib
import hashlib
import re
import subprocess
import sys

from jax._src.lib import hlo  # XLA's own parser: the judge of what is valid HLO

import nnx_models
from hlo_audit.hlo.analysis import analyze, analyze_canonical
from hlo_audit.hlo.normalize import normalize
from hlo_audit.hlo.source import pick_dump_module
from hlo_audit.hlo.text import parse_file, parse_module
from nnx_models import ModelSpec


def _changed_lines(a: str, b: str) -> tuple[list[str], list[str]]:
    removed, added = [], []
    for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0):
        if line.startswith("-") and not line.startswith("---"):
            removed.append(line[1:])
        elif line.startswith("+") and not line.startswith("+++"):
            added.append(line[1:])
    return removed, added


def test_inserted_rng_state_does_not_renumber_the_rest():
    """ModelSpec(dropout_rate=0) adds per-layer Rngs that are never drawn: 4 parameters, 4 Sharding calls."""
    old_text = nnx_models.hlo_text(ModelSpec(layers=4))
    new_text = nnx_models.hlo_text(ModelSpec(layers=4, dropout_rate=0.0))
    raw_removed, raw_added = _changed_lines(old_text, new_text)
    removed, added = _changed_lines(normalize(parse_module(old_text)), normalize(parse_module(new_text)))
    # Raw text: every parameter after the first inserted one is renumbered, and so on.
    assert len(raw_removed) > 5 * 2
    # Canonical text: the header and the ROOT tuple are the only old lines touched...
    assert len(removed) == 2
    assert removed[0].startswith("HloModule") and removed[1].lstrip().startswith("ROOT %tuple.")
    # ...and every added line is the new RNG state: 8 parameters, 8 key Sharding calls, header, root.
    params = [line for line in added if "parameter()" in line]
    shardings = [line for line in added if 'custom_call_target="Sharding"' in line]
    assert len(params) == 8 and all("dropout.rngs" in line for line in params)
    assert len(shardings) == 8
    assert len(added) == 8 + 8 + 2


def test_renumbered_ids_normalize_identically():
    text = nnx_models.hlo_text(ModelSpec(dropout_rate=0.5))
    renumbered = re.sub(r"\b([A-Za-z_][\w\-]*)\.(\d+)\b", lambda m: f"{m.group(1)}.{int(m.group(2)) * 7 + 1000}",
                        text)
    assert renumbered != text
    assert normalize(parse_module(renumbered)) == normalize(parse_module(text))


def test_volatile_parts_dropped_and_semantics_kept(dump_folder):
    module = parse_file(pick_dump_module(dump_folder, stage="after"))
    text = normalize(module)
    for volatile in ("metadata=", "op_name", "source_line", "stack_frame_id", "FileNames", "StackFrames",
                     "/*index="):
        assert volatile not in text
    assert "fusion(" in text and "calls=%" in text and "kind=kLoop" in text
    assert "{1,0}" in text  # layouts kept
    # Every computation a fusion calls exists under its canonical name.
    called = {line.split("calls=%", 1)[1].split(",")[0] for line in text.splitlines() if "calls=%" in line}
    defined = {line[1:].split(" ", 1)[0] for line in text.splitlines() if line.startswith("%")}
    assert called <= defined


def test_deterministic_across_processes(tmp_path):
    path = tmp_path / "m.hlo.txt"
    path.write_text(nnx_models.hlo_text(ModelSpec(bridge="draws")))
    here = hashlib.sha256(normalize(parse_file(path)).encode()).hexdigest()
    code = ("import hashlib,sys; from hlo_audit.hlo.normalize import normalize; "
            "from hlo_audit.hlo.text import parse_file; "
            "print(hashlib.sha256(normalize(parse_file(sys.argv[1])).encode()).hexdigest())")
    env_seeds = ["0", "12345"]  # different str-hash seeds must not matter
    for seed in env_seeds:
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"})
        assert out.stdout.strip() == here


SNIPPET = '''HloModule m.3, entry_computation_layout={(f32[8]{0}, f32[8]{0})->f32[8]{0}}

ENTRY %main.4 (a.1: f32[8], b.2: f32[8]) -> f32[8] {
  %a.1 = f32[8]{0} parameter(0), sharding={devices=[2]<=[2]}
  %b.2 = f32[8]{0} parameter(1)
  %k.3 = f32[8]{0} custom-call(%a.1), custom_call_target="tpu_custom_call", backend_config="{\\"custom_call_config\\": {\\"body\\": \\"TUzvUgFNTElSMjAuMC4w\\"}}"
  ROOT %s.5 = f32[8]{0} add(%k.3, %b.2), metadata={op_name="jit(f)/add" source_file="f.py" source_line=3}
}
'''


def test_kernel_bodies_dropped_commutative_operands_sorted_shardings_kept():
    text = normalize(parse_module(SNIPPET))
    assert "TUzvUgFN" not in text and "<kernel body dropped>" in text
    assert "sharding={devices=[2]<=[2]}" in text
    swapped = SNIPPET.replace("add(%k.3, %b.2)", "add(%b.2, %k.3)")
    assert normalize(parse_module(swapped)) == text
    relaid = SNIPPET.replace("%b.2 = f32[8]{0} parameter(1)", "%b.2 = f32[8]{0:T(8)} parameter(1)")
    assert normalize(parse_module(relaid)) != text


def test_analysis_normalizes_once():
    a = analyze(nnx_models.hlo_text(ModelSpec()))
    assert a.normalized is a.normalized


def _reordered(text: str, computation: str) -> str:
    """``text`` with the instructions of ``computation`` printed in another valid order: each instruction
    after its operands, but the last-ready first (the printer's choice reversed wherever it had one)."""
    module = parse_module(text)
    comp = module.computations[computation]
    lines = text.splitlines()
    waiting = {i.name: set(i.operands) for i in comp.instructions}
    users = {i.name: [u.name for u in comp.instructions if i.name in u.operands] for i in comp.instructions}
    ready = [i for i in comp.instructions if not waiting[i.name]]
    order = []
    while ready:
        instr = ready.pop()
        order.append(instr)
        for user in users[instr.name]:
            waiting[user].discard(instr.name)
            if not waiting[user] and comp.by_name[user] not in order and comp.by_name[user] not in ready:
                ready.append(comp.by_name[user])
    assert len(order) == len(comp.instructions)
    first = min(i.line for i in comp.instructions) - 1
    body = [lines[i.line - 1] for i in order]
    return "\n".join(lines[:first] + body + lines[first + len(body):]) + "\n"


def test_printed_order_does_not_matter():
    """A shared constant printed elsewhere, independent instructions swapped: the same canonical text."""
    text = nnx_models.hlo_text(ModelSpec(layers=4, dropout_rate=0.0))
    module = parse_module(text)
    reordered = _reordered(text, module.entry.name)
    assert reordered != text
    assert [i.name for i in parse_module(reordered).entry.instructions] != [i.name for i in module.entry.instructions]
    assert normalize(parse_module(reordered)) == normalize(module)


def test_entry_layout_that_spells_out_defaults_is_no_change():
    text = nnx_models.hlo_text(ModelSpec())
    header, rest = text.split("\n", 1)
    assert "entry_computation_layout={" in header
    start = header.index(", entry_computation_layout={")
    depth, end = 0, start
    for end, c in enumerate(header[start:], start):
        depth += {"{": 1, "}": -1}.get(c, 0)
        if c == "}" and depth == 0:
            break
    without = header[:start] + header[end + 1:] + "\n" + rest
    assert "entry_computation_layout" not in without.split("\n", 1)[0]
    assert normalize(parse_module(without)) == normalize(parse_module(text))
    # A layout other than the parameters' own is a change.
    moved = header.replace("entry_computation_layout={(f32[8]{0}", "entry_computation_layout={(f32[8]{0:S(1)}") + \
        "\n" + rest
    assert moved != text and normalize(parse_module(moved)) != normalize(parse_module(text))


def test_canonical_text_reads_back_to_itself(dump_folder):
    """Goldens are canonical text: hlo-audit reads them, and normalizing them again changes nothing."""
    modules = [nnx_models.hlo_text(spec) for spec in (ModelSpec(), ModelSpec(scan=True, dropout_rate=0.5),
                                                      ModelSpec(bridge="draws"))]
    modules.append(pick_dump_module(dump_folder, stage="after").read_text())
    for text in modules:
        canonical = analyze(text).normalized
        again = analyze(canonical, "golden")
        assert again.normalized == canonical
        assert [p.path for p in again.params] == [p.path for p in analyze(text).params]


# From XLA's async_collective_creator_test: control predecessors name an entry parameter and an instruction
# printed after the parameters.
CONTROL_PREDECESSOR = '''HloModule test

ENTRY %entry (p0: f32[128], p1: f32[128]) -> f32[1024] {
  %p0 = f32[128]{0} parameter(0)
  %ag = f32[1024]{0} all-gather(%p0), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, control-predecessors={%p0}
  %p1 = f32[128]{0} parameter(1), control-predecessors={%ag}
  ROOT %sum = f32[1024]{0} add(%ag, %ag)
}
'''


def test_control_predecessors_are_renamed_with_the_instructions():
    hlo.hlo_module_from_text(CONTROL_PREDECESSOR)  # valid HLO, as XLA's parser says
    renamed = CONTROL_PREDECESSOR.replace("%p0", "%p0.7").replace("%ag", "%all-gather.12")
    text = normalize(parse_module(CONTROL_PREDECESSOR))
    assert normalize(parse_module(renamed)) == text
    assert "control-predecessors={%all-gather." in text and "control-predecessors={%p0}" in text


def test_a_canonical_text_is_its_own_canonical_text():
    """Normalizing is idempotent, every computation of a canonical text printed once: `diff` reads each side's
    canonical text without normalizing it again (``analysis.analyze_canonical``)."""
    for spec in (ModelSpec(layers=2, dropout_rate=0.5), ModelSpec(layers=2, bridge="draws")):
        canonical = analyze(nnx_models.hlo_text(spec)).normalized
        again = analyze(canonical)
        assert again.normalized == canonical
        assert again.printed_computations == frozenset(again.module.computations)
        assert analyze_canonical(canonical).normalized is canonical


# -- issue 47 item 5: a golden's git diff is about the size of the change --------------------------------------------


def _train_step_text(scaled_layer: int | None = None, layers: int = 6) -> str:
    """A user's train step as plain jax writes one: unrolled layers (the same ops in each), adam, global-norm
    clipping (one running sum over every leaf); ``scaled_layer`` multiplies that layer's output by 2 (a pull request
    that adds one op)."""
    import jax
    import jax.numpy as jnp
    import optax

    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    params = [{"w": jnp.zeros((16, 16)), "b": jnp.zeros((16,)), "scale": jnp.ones((16,))} for _ in range(layers)]

    def loss(params, x):
        for i, layer in enumerate(params):
            h = jnp.tanh(x @ layer["w"] + layer["b"])
            h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * layer["scale"]
            x = x + (h * 2.0 if i == scaled_layer else h)
        return jnp.mean(x * x)

    def step(params, opt_state, x):
        grads = jax.grad(loss)(params, x)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(step).lower(params, optimizer.init(params), jnp.zeros((4, 16))).as_text(dialect="hlo")


def test_one_op_added_by_a_pull_request_changes_a_handful_of_golden_lines():
    """A multiply added in one layer of six: jax's lines for it (forward and backward) and the lines near them, not a
    renaming of everything after it: 58 lines of 893 here, where names digesting everything upstream changed 1,134."""
    old, new = (normalize(parse_module(_train_step_text(scaled))) for scaled in (None, 2))
    removed, added = _changed_lines(old, new)
    lines = len(old.splitlines())
    assert lines > 600
    # The forward multiply and its broadcast constant, the backward pass's, and the lines that read them.
    assert len(added) - len(removed) >= 2, (removed, added)
    assert len(removed) + len(added) <= 70, "\n".join(["-" + x for x in removed] + ["+" + x for x in added])


def test_one_instruction_inserted_anywhere_changes_lines_near_it():
    """A negate inserted before each of 40 instructions of a real step in turn (the entry's and a reducer's alike):
    each changes its own line, its user's and a few named after them; never the thousands a name digesting
    everything upstream changed. The canonical text reads back as itself every time."""
    text = _train_step_text()
    module = parse_module(text)
    old = normalize(module)
    entry = module.entry
    eligible = [i for i in entry.instructions if i.operands and i.opcode not in ("parameter", "tuple", "constant")
                and not i.shape.is_tuple and i.operands[0] in entry.by_name
                and not entry.by_name[i.operands[0]].shape.is_tuple]
    assert len(eligible) > 300
    counts = []
    for target in eligible[:: len(eligible) // 40][:40]:
        operand = entry.by_name[target.operands[0]]
        lines = text.splitlines()
        # jax prints names without XLA's ``%``: an operand is its name after ``(``
        at = next(n for n, line in enumerate(lines) if re.match(rf"\s*(ROOT )?{re.escape(target.name)} = ", line))
        assert f"({operand.name}" in lines[at], lines[at]
        lines[at] = lines[at].replace(f"({operand.name}", "(inserted_negate", 1)
        lines.insert(at, f"  inserted_negate = {operand.shape.text} negate({operand.name})")
        changed = "\n".join(lines) + "\n"
        hlo.hlo_module_from_text(changed)  # XLA's parser reads it: a module a user could have
        new = normalize(parse_module(changed))
        assert normalize(parse_module(new)) == new
        removed, added = _changed_lines(old, new)
        assert len(added) == len(removed) + 1, (target.name, removed, added)
        counts.append(len(removed) + len(added))
    counts.sort()
    assert counts[len(counts) // 2] <= 9 and counts[-1] <= 30, counts
