"""The real CLI on real HLO: `count` and `diff`, their formats, exit codes and bad input.

Numbers are checked against ``nnx_models.expected_counts`` and the model's own state (``nnx.to_flat_state``),
never against what the tool itself printed for another input. Most calls go through typer's CliRunner; a few
run ``python -m hlo_audit`` in a subprocess to prove the entry point, pipes and exit codes end to end.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from flax import nnx
from typer.testing import CliRunner

import nnx_models
from hlo_audit.cli import app
from in_process import cli
from nnx_models import ModelSpec

REPO = Path(__file__).resolve().parent.parent
COUNT_SCHEMA = "hlo-audit/count/v1"
DIFF_SCHEMA = "hlo-audit/diff/v2"
ERROR_PREFIX = "hlo-audit: error: "
ANSI = "\x1b["
META_KEYS = ("total", "rng_keys", "rng_counts")


# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------


def run_module(*args: object, input: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m hlo_audit ...`` in a fresh process, output piped (not a terminal)."""
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    full_env.pop("FORCE_COLOR", None)
    return subprocess.run([sys.executable, "-m", "hlo_audit", *map(str, args)], input=input, capture_output=True,
                          cwd=REPO, env=full_env, timeout=120, check=False)


def count_json(*args: object, input: str | None = None) -> list[dict]:
    result = cli("count", *args, "--format", "json", input=input)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    doc = json.loads(result.stdout)
    assert doc["schema"] == COUNT_SCHEMA
    return doc["modules"]


def diff_json(old: object, new: object, *extra: object, exit_code: int) -> dict:
    result = cli("diff", old, new, *extra, "--format", "json")
    assert result.exit_code == exit_code, (result.exit_code, result.stdout[-2000:], result.stderr)
    assert result.stderr == ""
    doc = json.loads(result.stdout)
    assert doc["schema"] == DIFF_SCHEMA
    return doc


def assert_one_line_error(result_stderr: str, *must_contain: str) -> str:
    """Exactly one line on stderr, our prefix, naming what it must name; no traceback."""
    lines = result_stderr.splitlines()
    assert len(lines) == 1, result_stderr
    (line,) = lines
    assert line.startswith(ERROR_PREFIX), line
    assert "Traceback" not in line
    for text in must_contain:
        assert text in line, (text, line)
    return line


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_NUMBERED_NAME = re.compile(r"\b([A-Za-z_][\w\-]*)\.(\d+)\b")


def renumber(text: str, seed: int = 0) -> str:
    """Every ``name.N`` id (instructions, computations, the module) gets another number, consistently.

    One random injective map N -> M (M never an old number) applied to every ``.N`` suffix outside quoted
    strings (metadata op_names, custom-call targets and backend configs are left alone).
    """
    pieces = _QUOTED.split(text)
    quoted = _QUOTED.findall(text)
    numbers = sorted({int(m.group(2)) for piece in pieces for m in _NUMBERED_NAME.finditer(piece)})
    low = max(numbers, default=0) + 1
    new = random.Random(seed).sample(range(low, low + 10 * len(numbers) + 10), len(numbers))
    mapping = dict(zip(numbers, new))

    def sub(piece: str) -> str:
        return _NUMBERED_NAME.sub(lambda m: f"{m.group(1)}.{mapping[int(m.group(2))]}", piece)

    out = [sub(pieces[0])]
    for q, piece in zip(quoted, pieces[1:]):
        out += [q, sub(piece)]
    return "".join(out)


def state_leaves(spec: ModelSpec) -> list[tuple[tuple[str, ...], type]]:
    """(path, Variable type) of every leaf of the model state, in jax's flattening (sorted) order."""
    abstract = nnx.eval_shape(lambda: nnx_models.build(spec))
    return [(tuple(str(k) for k in path), type(var)) for path, var in nnx.to_flat_state(nnx.state(abstract))]


def _role(var_type: type) -> str:
    if issubclass(var_type, nnx.RngKey):
        return "rng_key"
    if issubclass(var_type, nnx.RngCount):
        return "rng_count"
    assert issubclass(var_type, nnx.Param), var_type
    return "weight"


def expected_params(spec: ModelSpec) -> list[tuple[str, str]]:
    """(path, role) per entry parameter, from the model state: state leaves in order, then the input x."""
    return [("state." + ".".join(path), _role(t)) for path, t in state_leaves(spec)] + [("x", "input")]


def expected_groups(spec: ModelSpec) -> dict[str, int]:
    """Group pattern -> count from the model state: ``layers_N`` -> ``layers_*``; RNG leaves fold to the
    attribute that holds the Rngs / RngStream (``rngs``, ``to_nnx__rngs``), i.e. ``<owner>.rngs.*``."""
    groups: Counter[str] = Counter()
    for path, t in state_leaves(spec):
        parts = ["state"] + [re.sub(r"^layers_\d+$", "layers_*", p) for p in path]
        if _role(t).startswith("rng_"):
            owner = next(i for i, p in enumerate(parts) if p in ("rngs", "to_nnx__rngs"))
            parts = parts[: owner + 1] + ["*"]
        groups[".".join(parts)] += 1
    groups["x"] += 1
    return dict(groups)


def rng_total(spec: ModelSpec) -> int:
    e = nnx_models.expected_counts(spec)
    return e["rng_keys"] + e["rng_counts"]


def dtype_counts(spec: ModelSpec) -> dict[str, int]:
    return {k: v for k, v in nnx_models.expected_counts(spec).items() if k not in META_KEYS}


# --------------------------------------------------------------------------------------------------------------
# count
# --------------------------------------------------------------------------------------------------------------

COUNT_SPECS = [
    ModelSpec(),
    ModelSpec(layers=3, dropout_rate=0.0),
    ModelSpec(dropout_rate=0.5),
    ModelSpec(scan=True, dropout_rate=0.0, layers=3),
    ModelSpec(rngs=False),
    ModelSpec(bridge="draws"),
]


@pytest.mark.parametrize("spec", COUNT_SPECS, ids=nnx_models.spec_name)
def test_count_json_equals_model_state(spec, write_hlo):
    path = write_hlo(spec)
    (m,) = count_json(path)
    expected = nnx_models.expected_counts(spec)
    assert m["source"] == str(path)
    assert m["module"] == "jit_train_step"
    assert isinstance(m["entry_params"], int) and m["entry_params"] == expected["total"]
    assert m["by_dtype"] == dtype_counts(spec)
    assert m["by_role"].get("rng_key", 0) == expected["rng_keys"]
    assert m["by_role"].get("rng_count", 0) == expected["rng_counts"]
    assert m["rng_params"] == expected["rng_keys"] + expected["rng_counts"]
    assert m["by_role"] == dict(Counter(role for _, role in expected_params(spec)))
    assert m["groups"] == expected_groups(spec)
    assert sum(m["groups"].values()) == sum(m["by_role"].values()) == m["entry_params"]


@pytest.mark.parametrize("spec", [ModelSpec(dropout_rate=0.0), ModelSpec(layers=4, dropout_rate=0.5)],
                         ids=nnx_models.spec_name)
def test_count_folds_dropout_rng_state_per_layer(spec, write_hlo):
    """Each unrolled Dropout keeps a (key, count) pair: 2 per layer, folded into one layers_* group."""
    (m,) = count_json(write_hlo(spec))
    assert m["groups"]["state.layers_*.dropout.rngs.*"] == 2 * spec.layers
    assert m["groups"]["state.rngs.*"] == 4  # the model's own Rngs: 2 streams x (key, count), whatever the depth
    rng_groups = {p: n for p, n in m["groups"].items() if p.endswith(".rngs.*")}
    assert sum(rng_groups.values()) == rng_total(spec) == m["by_role"]["rng_key"] + m["by_role"]["rng_count"]
    assert m["by_dtype"]["u32"] == rng_total(spec)


def test_count_params_lists_every_parameter(write_hlo):
    spec = ModelSpec(dropout_rate=0.0)
    (m,) = count_json(write_hlo(spec), "--params")
    params = m["params"]
    assert [p["index"] for p in params] == list(range(m["entry_params"]))
    assert [(p["path"], p["role"]) for p in params] == expected_params(spec)
    by_path = {p["path"]: p for p in params}
    key, count = by_path["state.layers_1.dropout.rngs.key"], by_path["state.layers_1.dropout.rngs.count"]
    assert (key["dtype"], key["dims"], key["pattern"]) == ("u32", [2], "state.layers_*.dropout.rngs.*")
    assert (count["dtype"], count["dims"], count["bytes"]) == ("u32", [], 4)
    assert by_path["x"]["dims"] == [nnx_models.BATCH, spec.width]
    assert by_path["state.layers_0.linear.kernel"]["bytes"] == spec.width * spec.width * 4
    assert all(p["name"].endswith(".1") for p in params)  # the raw HLO names are reported too


def test_count_several_paths_in_order(write_hlo, dump_folder):
    specs = [ModelSpec(rngs=False), ModelSpec(layers=3, dropout_rate=0.0)]
    paths = [write_hlo(s) for s in specs]
    modules = count_json(paths[0], dump_folder, paths[1])
    assert [m["source"] for m in modules[::2]] == [str(p) for p in paths]
    assert modules[1]["source"].endswith("jit_train_step.before_optimizations.txt")
    totals = [m["entry_params"] for m in modules]
    assert totals == [nnx_models.expected_counts(s)["total"] for s in (specs[0], ModelSpec(dropout_rate=0.5), specs[1])]


def test_count_stdin(write_hlo):
    spec = ModelSpec(scan=True)
    (m,) = count_json("-", input=nnx_models.hlo_text(spec))
    assert m["source"] == "<stdin>"
    assert m["entry_params"] == nnx_models.expected_counts(spec)["total"]
    assert m["by_dtype"] == dtype_counts(spec)
    assert m["groups"] == expected_groups(spec)


def test_count_dump_folder_defaults_to_train_step_before_optimizations(dump_folder):
    spec = ModelSpec(dropout_rate=0.5)  # what the dump_folder fixture ran
    (m,) = count_json(dump_folder)
    assert m["module"] == "jit_train_step"
    assert Path(m["source"]).parent == dump_folder
    assert Path(m["source"]).name.endswith(".jit_train_step.before_optimizations.txt")
    assert m["entry_params"] == nnx_models.expected_counts(spec)["total"]
    assert m["by_dtype"] == dtype_counts(spec)
    # Paths here come from the dump's op_name metadata; they fold to the same groups as the model state.
    assert m["groups"] == expected_groups(spec)


def test_count_dump_folder_stage_after(dump_folder):
    spec = ModelSpec(dropout_rate=0.5)
    (m,) = count_json(dump_folder, "--stage", "after")
    assert m["module"] == "jit_train_step"
    assert Path(m["source"]).name.endswith(".jit_train_step.cpu_after_optimizations.txt")
    assert m["entry_params"] == nnx_models.expected_counts(spec)["total"]
    assert m["by_dtype"] == dtype_counts(spec)
    assert m["by_role"]["rng_key"] + m["by_role"]["rng_count"] == rng_total(spec)


def test_count_dump_folder_module_regex(dump_folder):
    (seed,) = count_json(dump_folder, "--module", "threefry_seed")
    assert seed["module"] == "jit__threefry_seed"
    assert "jit__threefry_seed.before_optimizations" in seed["source"]
    assert seed["entry_params"] == 1 and seed["by_dtype"] == {"s32": 1}  # the integer seed
    (step,) = count_json(dump_folder, "--module", r"^jit_train_step$", "--stage", "after")
    assert step["module"] == "jit_train_step" and "after_optimizations" in step["source"]


def test_count_markdown(write_hlo):
    spec = ModelSpec(layers=3, dropout_rate=0.0)
    result = cli("count", write_hlo(spec), "--format", "markdown")
    assert result.exit_code == 0 and result.stderr == ""
    out = result.stdout
    total = nnx_models.expected_counts(spec)["total"]
    assert f"### `jit_train_step` — {total} entry parameters" in out
    assert f"| u32 | {rng_total(spec)} |" in out
    assert f"| f32 | {dtype_counts(spec)['f32']} |" in out
    assert f"| `state.layers_*.dropout.rngs.*` | {2 * spec.layers} |" in out
    assert ANSI not in out


def test_count_table_piped_is_plain_text(write_hlo):
    spec = ModelSpec(layers=3, dropout_rate=0.0)
    path = write_hlo(spec)
    total = nnx_models.expected_counts(spec)["total"]
    for out in (cli("count", path).stdout, run_module("count", path).stdout.decode()):
        assert ANSI not in out
        assert f"{total} entry parameters" in out
        assert re.search(rf"^u32\s+{rng_total(spec)}\s*$", out, re.M), out
        assert re.search(rf"^state\.layers_\*\.dropout\.rngs\.\*\s+{2 * spec.layers}\s*$", out, re.M), out


# --------------------------------------------------------------------------------------------------------------
# diff
# --------------------------------------------------------------------------------------------------------------


def test_diff_identical(write_hlo):
    path = write_hlo(ModelSpec(dropout_rate=0.5))
    doc = diff_json(path, path, exit_code=0)
    assert doc["verdict"] == "identical"
    assert doc["changes"] == [] and doc["params_added"] == [] and doc["params_removed"] == []
    assert doc["by_dtype_delta"] == {} and doc["opcode_dtype_delta"] == {} and doc["text_diff"] == []


def test_diff_dump_folder_against_itself(dump_folder):
    assert diff_json(dump_folder, dump_folder, "--stage", "after", exit_code=0)["verdict"] == "identical"


@pytest.mark.parametrize("spec", [ModelSpec(), ModelSpec(dropout_rate=0.5), ModelSpec(scan=True, dropout_rate=0.0),
                                  ModelSpec(bridge="nodraw")], ids=nnx_models.spec_name)
def test_diff_renumbered_is_identical_after_normalization(spec, tmp_path):
    text = nnx_models.hlo_text(spec)
    renumbered = renumber(text, seed=len(text))
    assert renumbered != text
    entry = re.compile(r"^ENTRY (\S+)", re.M)
    assert entry.search(renumbered).group(1) != entry.search(text).group(1)  # ids really moved
    a, b = tmp_path / "a.hlo", tmp_path / "b.hlo"
    a.write_text(text)
    b.write_text(renumbered)
    doc = diff_json(a, b, exit_code=0)
    assert doc["verdict"] == "identical-after-normalization"
    assert doc["params_added"] == doc["params_removed"] == [] and doc["opcode_dtype_delta"] == {}
    assert doc["entry_params"]["old"] == doc["entry_params"]["new"] == nnx_models.expected_counts(spec)["total"]


def test_diff_renumbered_xla_dump_before_optimizations(dump_folder, tmp_path):
    """%names, signatures, metadata and the FileNames/StackFrames tables of a real dump."""
    source = Path(count_json(dump_folder)[0]["source"])
    text = source.read_text()
    renamed = tmp_path / "renumbered.txt"
    renamed.write_text(renumber(text, seed=7))
    assert renamed.read_text() != text
    assert diff_json(source, renamed, exit_code=0)["verdict"] == "identical-after-normalization"


def test_diff_renumbered_xla_dump_after_optimizations(dump_folder, tmp_path):
    source = Path(count_json(dump_folder, "--stage", "after")[0]["source"])
    text = source.read_text()
    renamed = tmp_path / "renumbered.txt"
    renamed.write_text(renumber(text, seed=7))
    assert diff_json(source, renamed, exit_code=0)["verdict"] == "identical-after-normalization"


RNG_ONLY_PAIRS = [
    (ModelSpec(), ModelSpec(dropout_rate=0.0)),
    (ModelSpec(layers=3), ModelSpec(layers=3, dropout_rate=0.0)),
    (ModelSpec(rngs=False), ModelSpec()),
    (ModelSpec(scan=True), ModelSpec(scan=True, dropout_rate=0.0)),
    (ModelSpec(scan=True, rngs=False), ModelSpec(scan=True)),
    (ModelSpec(layers=3, rngs=False), ModelSpec(layers=3, dropout_rate=0.0)),
]


@pytest.mark.parametrize("old_spec,new_spec", RNG_ONLY_PAIRS,
                         ids=[f"{nnx_models.spec_name(a)}-{nnx_models.spec_name(b)}" for a, b in RNG_ONLY_PAIRS])
def test_diff_leaked_rng_state_is_rng_state_only(old_spec, new_spec, write_hlo):
    """NEW only adds never-drawn RNG state: exactly those u32 parameters, grouped; nothing else."""
    old, new = write_hlo(old_spec), write_hlo(new_spec)
    e_old, e_new = nnx_models.expected_counts(old_spec), nnx_models.expected_counts(new_spec)
    added_rng = rng_total(new_spec) - rng_total(old_spec)
    assert added_rng > 0

    doc = diff_json(old, new, exit_code=1)
    assert doc["verdict"] == "rng-state-only" and doc["changes"] == []
    assert doc["entry_params"] == {"old": e_old["total"], "new": e_new["total"]}
    assert doc["by_dtype_delta"] == {"u32": added_rng}
    assert doc["by_role_delta"] == {k: v for k, v in {
        "rng_key": e_new["rng_keys"] - e_old["rng_keys"],
        "rng_count": e_new["rng_counts"] - e_old["rng_counts"]}.items() if v}
    assert doc["params_removed"] == []
    assert all(g["dtype"] == "u32" and g["role"] in ("rng_key", "rng_count") and g["count"] > 0
               for g in doc["params_added"])
    assert sum(g["count"] for g in doc["params_added"]) == added_rng
    grouped: Counter[str] = Counter()
    for g in doc["params_added"]:
        grouped[g["pattern"]] += g["count"]
    g_old, g_new = expected_groups(old_spec), expected_groups(new_spec)
    assert dict(grouped) == {p: n - g_old.get(p, 0) for p, n in g_new.items() if n != g_old.get(p, 0)}
    if not new_spec.scan and new_spec.dropout_rate is not None and old_spec.rngs:
        assert dict(grouped) == {"state.layers_*.dropout.rngs.*": 2 * new_spec.layers}
        assert doc["by_dtype_delta"] == {"u32": 2 * new_spec.layers}

    # And backwards: the same state, removed.
    back = diff_json(new, old, exit_code=1)
    assert back["verdict"] == "rng-state-only"
    assert back["params_added"] == []
    assert sorted((g["role"], g["pattern"], -g["count"]) for g in back["params_removed"]) == sorted(
        (g["role"], g["pattern"], g["count"]) for g in doc["params_added"])
    assert back["by_dtype_delta"] == {"u32": -added_rng}


def test_diff_l2_against_l2_drop0_exact(write_hlo):
    """The issue's example, spelled out."""
    doc = diff_json(write_hlo(ModelSpec()), write_hlo(ModelSpec(dropout_rate=0.0)), "--text", exit_code=1)
    assert doc["verdict"] == "rng-state-only"
    assert doc["by_dtype_delta"] == {"u32": 4}
    assert sorted((g["role"], g["dtype"], g["pattern"], g["count"]) for g in doc["params_added"]) == [
        ("rng_count", "u32", "state.layers_*.dropout.rngs.*", 2),
        ("rng_key", "u32", "state.layers_*.dropout.rngs.*", 2),
    ]
    assert doc["params_removed"] == []
    assert doc["text_diff"] and doc["text_diff"][0].startswith("--- ")


def test_diff_dropout_rate_change_is_changed_ops(write_hlo):
    old, new = write_hlo(ModelSpec(dropout_rate=0.0)), write_hlo(ModelSpec(dropout_rate=0.5))
    doc = diff_json(old, new, "--text", exit_code=1)
    assert doc["verdict"] == "changed"
    assert "ops" in doc["changes"]
    assert "parameters" not in doc["changes"]  # same state, same entry parameters
    assert doc["params_added"] == doc["params_removed"] == []
    assert doc["by_dtype_delta"] == {}
    assert doc["opcode_dtype_delta"]  # dropout 0.5 draws random bits: new ops
    assert doc["text_diff"]


def test_diff_markdown_and_table(write_hlo):
    old, new = write_hlo(ModelSpec()), write_hlo(ModelSpec(dropout_rate=0.0))
    md = cli("diff", old, new, "--format", "markdown", "--text")
    assert md.exit_code == 1 and md.stderr == ""
    assert md.stdout.startswith("### HLO diff: **rng-state-only**")
    assert "entry parameters 9 → 13" in md.stdout
    assert "| +2 | rng_key | u32 | `state.layers_*.dropout.rngs.*` |" in md.stdout
    assert "| +2 | rng_count | u32 | `state.layers_*.dropout.rngs.*` |" in md.stdout
    assert "| dtype | u32 | +4 |" in md.stdout
    assert "```diff" in md.stdout
    assert "```diff" not in cli("diff", old, new, "--format", "markdown").stdout  # the text only on request

    same = cli("diff", old, old, "--format", "markdown")
    assert same.exit_code == 0 and same.stdout.startswith("### HLO diff: **identical**")

    table = cli("diff", old, new)
    assert table.exit_code == 1 and ANSI not in table.stdout
    assert "verdict: rng-state-only" in table.stdout
    assert re.search(r"^\s*\+2\s+rng_key\s+u32\s+state\.layers_\*\.dropout\.rngs\.\*\s*$", table.stdout, re.M)


# --------------------------------------------------------------------------------------------------------------
# the entry point, end to end
# --------------------------------------------------------------------------------------------------------------


def test_python_dash_m_exit_codes_and_streams(write_hlo, tmp_path):
    l2, drop0 = write_hlo(ModelSpec()), write_hlo(ModelSpec(dropout_rate=0.0))

    ok = run_module("count", drop0, "--format", "json")
    assert ok.returncode == 0 and ok.stderr == b""
    assert json.loads(ok.stdout)["modules"][0]["by_dtype"] == dtype_counts(ModelSpec(dropout_rate=0.0))

    stdin = run_module("count", "-", "--format", "json", input=l2.read_bytes())
    assert stdin.returncode == 0
    assert json.loads(stdin.stdout)["modules"][0]["entry_params"] == nnx_models.expected_counts(ModelSpec())["total"]

    same = run_module("diff", l2, l2, "--format", "json")
    assert same.returncode == 0 and json.loads(same.stdout)["verdict"] == "identical"

    differs = run_module("diff", l2, drop0, "--format", "json")
    assert differs.returncode == 1 and differs.stderr == b""
    assert json.loads(differs.stdout)["verdict"] == "rng-state-only"

    missing = tmp_path / "nope.hlo"
    bad = run_module("count", missing)
    assert bad.returncode == 2 and bad.stdout == b""
    assert_one_line_error(bad.stderr.decode(), str(missing), "no such file")

    usage = run_module("count", l2, "--format", "nonsense")
    assert usage.returncode == 2 and b"Traceback" not in usage.stderr


# --------------------------------------------------------------------------------------------------------------
# bad input: exit 2, one line naming the file (and line), no traceback
# --------------------------------------------------------------------------------------------------------------

def _real_module() -> str:
    return nnx_models.hlo_text(ModelSpec(dropout_rate=0.0))


def _cut_mid_line(text: str) -> tuple[str, int]:
    """Cut in the middle of an instruction line inside ENTRY; (text, number of the last line)."""
    lines = text.splitlines(keepends=True)
    entry = next(i for i, line in enumerate(lines) if line.startswith("ENTRY"))
    k = entry + (len(lines) - entry) // 2
    assert " = " in lines[k]
    return "".join(lines[:k]) + lines[k][: len(lines[k]) // 2], k + 1


def _cut_at_line(text: str) -> tuple[str, int]:
    lines = text.splitlines(keepends=True)
    keep = len(lines) * 2 // 3
    return "".join(lines[:keep]), keep


def bad_missing(tmp_path):
    return tmp_path / "does-not-exist.hlo", ["no such file"]


def bad_empty(tmp_path):
    path = tmp_path / "empty.hlo"
    path.write_text("")
    return path, ["empty"]


def bad_whitespace_only(tmp_path):
    path = tmp_path / "blank.hlo"
    path.write_text("\n   \n\t\n")
    return path, ["empty"]


def bad_folder_without_hlo(tmp_path):
    folder = tmp_path / "not-a-dump"
    folder.mkdir()
    (folder / "README.txt").write_text("HloModule nothing here\n")
    (folder / "module_0001.jit_f.debug_options").write_text("--xla_dump_to=x\n")
    return folder, ["no HLO"]


def bad_binary_garbage(tmp_path):
    path = tmp_path / "garbage.bin"
    data = bytearray(random.Random(3).randbytes(4096))
    data[100] = 0
    path.write_bytes(bytes(data))
    return path, ["binary"]


def bad_not_utf8(tmp_path):
    path = tmp_path / "latin1.hlo"
    text = _real_module()
    mid = len(text) // 2
    path.write_bytes(text[:mid].encode() + b"\xff\xfe caf\xe9 " + text[mid:].encode())
    return path, ["UTF-8"]


def bad_truncated_mid_line(tmp_path):
    text, last = _cut_mid_line(_real_module())
    path = tmp_path / "cut-mid-line.hlo"
    path.write_text(text)
    return path, [f"{path}:{last}:"]


def bad_truncated_at_line(tmp_path):
    text, last = _cut_at_line(_real_module())
    path = tmp_path / "cut-at-line.hlo"
    path.write_text(text)
    return path, [f"{path}:{last}:", "truncated"]


def bad_not_hlo(tmp_path):
    path = tmp_path / "notes.hlo"
    path.write_text("# notes\nthis is not HLO\n")
    return path, [f"{path}:1:", "HloModule"]


def bad_undefined_operand(tmp_path):
    text = _real_module().replace("dot(x.1, ", "dot(x_missing.1, ", 1)
    line = next(n for n, s in enumerate(text.splitlines(), 1) if "x_missing.1" in s)
    path = tmp_path / "dangling.hlo"
    path.write_text(text)
    return path, [f"{path}:{line}:", "x_missing.1"]


BAD_FILES = [bad_missing, bad_empty, bad_whitespace_only, bad_folder_without_hlo, bad_binary_garbage, bad_not_utf8,
             bad_truncated_mid_line, bad_truncated_at_line, bad_not_hlo, bad_undefined_operand]


@pytest.mark.parametrize("make", BAD_FILES, ids=lambda f: f.__name__.removeprefix("bad_"))
@pytest.mark.parametrize("command", ["count", "diff-old", "diff-new"])
def test_bad_input_exits_2_with_one_line(make, command, tmp_path, write_hlo):
    path, must = make(tmp_path)
    good = write_hlo(ModelSpec())
    args = {"count": ["count", path, "--format", "json"], "diff-old": ["diff", path, good],
            "diff-new": ["diff", good, path]}[command]
    result = cli(*args)
    assert result.exit_code == 2, (result.exit_code, result.stdout[-500:], result.stderr)
    line = assert_one_line_error(result.stderr, str(path), *must)
    if command == "count":  # JSON says which input failed and why, in its place
        assert json.loads(result.stdout)["modules"] == [{"source": str(path), "error": line.removeprefix(ERROR_PREFIX)}]
    else:
        assert result.stdout == ""


@pytest.mark.parametrize("fmt", ["json", "table", "markdown"])
def test_bad_input_among_good_paths_reports_each(write_hlo, tmp_path, fmt):
    """`count A B C` with B unreadable: A and C their numbers, B its error, exit 2."""
    specs = [ModelSpec(), ModelSpec(layers=4, dropout_rate=0.0)]
    good = [write_hlo(spec) for spec in specs]
    missing = tmp_path / "missing.hlo"
    result = cli("count", good[0], missing, good[1], "--format", fmt)
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr, str(missing))
    totals = [nnx_models.expected_counts(spec)["total"] for spec in specs]
    if fmt == "json":
        modules = json.loads(result.stdout)["modules"]
        assert [m["source"] for m in modules] == [str(good[0]), str(missing), str(good[1])]
        assert [modules[0]["entry_params"], modules[2]["entry_params"]] == totals
        assert modules[1] == {"source": str(missing), "error": line.removeprefix(ERROR_PREFIX)}
    else:
        for path, total in zip(good, totals):
            assert f"{path}" in result.stdout and f"{total} entry parameters" in result.stdout


def test_bad_module_regex(dump_folder, tmp_path):
    """The option's mistake, said as one before any input is read: the same for a dump folder and for a file (which
    ignored it)."""
    for given in (dump_folder, tmp_path / "module.hlo"):
        result = cli("count", given, "--module", "([unclosed")
        assert result.exit_code == 2 and result.stdout == ""
        assert_one_line_error(result.stderr, "--module '([unclosed': not a regular expression")


def test_module_regex_matching_nothing(dump_folder):
    result = cli("count", dump_folder, "--module", "no_such_module_zzz")
    assert result.exit_code == 2 and result.stdout == ""
    line = assert_one_line_error(result.stderr, str(dump_folder), "no_such_module_zzz")
    assert "jit_train_step" in line  # says what there is


def test_format_nonsense_is_a_usage_error(write_hlo):
    for args in (["count", write_hlo(ModelSpec())], ["diff", write_hlo(ModelSpec()), write_hlo(ModelSpec())]):
        result = cli(*args, "--format", "nonsense")
        assert result.exit_code == 2
        assert result.stdout == ""
        assert "nonsense" in result.stderr and "Traceback" not in result.stderr


def test_stage_nonsense_is_a_usage_error(dump_folder):
    result = cli("count", dump_folder, "--stage", "during")
    assert result.exit_code == 2 and "Traceback" not in result.stderr


def test_diff_stdin_twice(write_hlo):
    result = cli("diff", "-", "-", input=_real_module())
    assert result.exit_code == 2 and result.stdout == ""
    assert_one_line_error(result.stderr, "'-'")


def test_empty_stdin():
    result = cli("count", "-", input="")
    assert result.exit_code == 2
    assert_one_line_error(result.stderr, "<stdin>", "empty")


def test_no_arguments_prints_usage():
    result = cli()
    assert result.exit_code in (0, 2)  # click's no_args_is_help
    assert "count" in result.stdout + result.stderr and "diff" in result.stdout + result.stderr


# Bugs these tests found (tracebacks where the design asks for exit 2 and one line), now fixed and pinned.

def test_non_integer_parameter_number_is_an_input_error(tmp_path):
    path = tmp_path / "param.hlo"
    path.write_text("HloModule m\n\nENTRY e {\n  ROOT p = f32[] parameter(x)\n}\n")
    result = CliRunner().invoke(app, ["count", str(path)])
    assert result.exit_code == 2
    assert_one_line_error(result.stderr, f"{path}:4:")


def test_recursive_computation_is_an_input_error(tmp_path, write_hlo):
    path = tmp_path / "recursive.hlo"
    path.write_text("HloModule m\n\nENTRY e {\n  p = f32[] parameter(0)\n  ROOT y = f32[] call(p), to_apply=e\n}\n")
    assert cli("count", path).exit_code in (0, 2)
    result = CliRunner().invoke(app, ["diff", str(path), str(write_hlo(ModelSpec()))])
    assert result.exit_code == 2
    assert_one_line_error(result.stderr, str(path))


def test_non_utf8_stdin_is_an_input_error_in_any_locale():
    proc = run_module("count", "-", input=b"HloModule m\n\xff\xfe\n", env={"PYTHONIOENCODING": "utf-8:strict"})
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr.decode(), "<stdin>")


def test_status_lines_are_never_hard_wrapped(tmp_path):
    """Tables fit the width; a headline or summary stays one line whatever COLUMNS says (scripts grep them)."""
    deep = tmp_path / ("folder-name-that-makes-every-path-longer-than-the-terminal-" * 2)
    deep.mkdir()
    old, new = deep / "old.hlo.txt", deep / "new.hlo.txt"
    old.write_text(nnx_models.hlo_text(ModelSpec()))
    new.write_text(nnx_models.hlo_text(ModelSpec(dropout_rate=0.0)))
    env = {"COLUMNS": "60"}
    count = CliRunner().invoke(app, ["count", str(old)], env=env)
    assert f"{old}  module jit_train_step: {nnx_models.expected_counts(ModelSpec())['total']} entry parameters" \
        in count.stdout.splitlines()
    diff = CliRunner().invoke(app, ["diff", str(old), str(new)], env=env)
    lines = diff.stdout.splitlines()
    assert lines[0] == "verdict: rng-state-only"
    assert lines[1].startswith("entry parameters: ") and lines[1].endswith(f"({old} -> {new})")
    assert all(len(line) <= 60 for line in lines if line.startswith(("dtype ", "role ")))  # table rows fit


# --------------------------------------------------------------------------------------------------------------
# Conventions: --version, --help intact, rng's exit codes, repeated --only, scaling with nothing to fit
# --------------------------------------------------------------------------------------------------------------


def test_version():
    from importlib.metadata import version

    proc = run_module("--version")
    assert proc.returncode == 0 and proc.stderr == b""
    assert proc.stdout.decode() == f"hlo-audit {version('hlo-audit')}\n"


def _commands(group, prefix=()):
    import typer.main

    command = typer.main.get_command(group) if not hasattr(group, "commands") else group
    for name, sub in command.commands.items():
        if hasattr(sub, "commands"):
            yield from _commands(sub, (*prefix, name))
        else:
            yield (*prefix, name), sub


@pytest.mark.parametrize("columns", ["80", "120"])
def test_help_shows_every_option_s_help_whole(columns):
    """Typer's rich markup once ate `[tool.hlo-audit]`; every help text must come out as written, wrapped at
    spaces only (`hlo-audit.toml` never split at its hyphen)."""
    commands = list(_commands(app))
    assert len(commands) == 14  # measure: issue 33
    for path, command in commands:
        result = CliRunner(env={"COLUMNS": columns}).invoke(app, [*path, "--help"])
        assert result.exit_code == 0, result.output
        flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.stdout).split())
        # An integer range's metavar (`[1<=x<=256]`) wraps onto a second line of its column in typer 0.15, between
        # the words of the help beside it: it is the metavar's, not the help's.
        flat = re.sub(r" \[[0-9.]*<?=?x[<>]=[0-9.]*\]", "", flat)
        for param in command.params:
            if param.help:  # Markdown: `code` shows without its backticks
                assert " ".join(param.help.replace("`", "").split()) in flat, (path, param.name, flat)
        first = command.help.split("\n\n")[0]
        assert " ".join(first.replace("`", "").split()) in flat, (path, flat)
    check = CliRunner(env={"COLUMNS": columns}).invoke(app, ["check", "--help"]).stdout
    flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", check).split())
    for spelling in ("[tool.hlo-audit] in pyproject.toml", "[policy] and [[waive]] in hlo-audit.toml",
                     "[tool.hlo-audit.policy] and [[tool.hlo-audit.waive]] in pyproject.toml"):
        assert spelling in flat


def test_rng_exit_codes(tmp_path):
    """0 when no stream is carried (none at all, or every one drawn), 1 when one is (dead RNG state), 2 on bad
    input. The example target's cells: no dropout, a never-drawn Dropout(0.0) per layer, a drawing Dropout(0.1)."""
    (tmp_path / "hlo-audit.toml").write_text(EXAMPLE.replace('"int8"]', '"dropout"]'))
    config = str(tmp_path / "hlo-audit.toml")
    expected = {"none": (0, 0, 0), "dropout0": (1, 0, 2), "dropout": (0, 2, 0)}  # exit code, drawn, carried
    for quant, (code, drawn, carried) in expected.items():
        cell = f"mlp/scan-off/{quant}/L2"
        for fmt in ("table", "json", "markdown"):
            result = cli("rng", cell, "--config", config, "--format", fmt)
            assert result.exit_code == code, (cell, fmt, result.output)
        doc = json.loads(cli("rng", cell, "--config", config, "--format", "json").stdout)
        assert (doc["drawn"], doc["carried"]) == (drawn, carried), cell
    for bad in (tmp_path / "missing.hlo", "mlp/scan-off/int9/L2"):
        result = cli("rng", bad, "--config", config)
        assert result.exit_code == 2
        assert_one_line_error(result.stderr, str(bad))


EXAMPLE = """
target = "hlo_audit.examples.nnx_mlp:lower"
models = ["mlp"]
quant = ["none", "dropout0", "int8"]
layers = [2, 3]
"""


def test_repeated_only_options_combine(tmp_path):
    (tmp_path / "hlo-audit.toml").write_text(EXAMPLE)
    config = str(tmp_path / "hlo-audit.toml")

    def ids(*only):
        result = cli("list", "--config", config, "--format", "json", *only)
        assert result.exit_code == 0, result.output
        return sorted(c["id"] for c in json.loads(result.stdout)["cells"])

    every = ids()
    assert len(every) == 12
    # A key given twice: either value; different keys: both. The same as one --only joined by commas.
    assert ids("--only", "quant=none", "--only", "quant=int8") == ids("--only", "quant=none,quant=int8") == [
        i for i in every if "/none/" in i or "/int8/" in i]
    assert ids("--only", "quant=none", "--only", "scan=off") == ids("--only", "quant=none,scan=off") == [
        "mlp/scan-off/none/L2", "mlp/scan-off/none/L3"]
    assert ids("--only", "quant=none", "--only", "scan=off", "--only", "layers=3") == ["mlp/scan-off/none/L3"]


def test_scaling_with_nothing_to_fit_says_why_and_exits_2(tmp_path):
    (tmp_path / "hlo-audit.toml").write_text(EXAMPLE)
    config = str(tmp_path / "hlo-audit.toml")
    result = cli("scaling", "--config", config, "--only", "quant=int8")
    assert result.exit_code == 2 and result.stdout == ""
    (line,) = [line for line in result.stderr.splitlines() if not line.startswith("hlo-audit: cell ")]
    assert line == ("hlo-audit: error: scaling: every selected cell is unavailable here, so there is nothing to fit "
                    "(4 cells: nnx_mlp has no quantization 'int8' (it knows none, dropout0, dropout))")
    result = cli("scaling", "--config", config, "--only", "quant=none", "--layers", "2")
    assert result.exit_code == 2 and result.stdout == ""
    (line,) = [line for line in result.stderr.splitlines() if not line.startswith("hlo-audit: cell ")]
    assert line.startswith("hlo-audit: error: scaling: no depth series to fit") and "layers 2 " in line
    result = cli("scaling", "--config", config, "--only", "quant=none", "--format", "json")
    assert result.exit_code == 0 and len(json.loads(result.stdout)["series"]) == 2
