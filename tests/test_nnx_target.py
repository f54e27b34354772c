"""The stock NNX target (target = "nnx"): a model library's model audited from a config, with no Python.

Real libraries: google-tunix's Qwen3 and Llama3 (from PyPI, `make setup` installs it; marked `tunix`), and
``tinylm`` (tests/nnx_library.py), a small library written into the test's folder as a user's own package, with a
layer-scan switch. Counts are held to the models themselves: the number of ``nnx.Param`` leaves each builds
(``nnx.eval_shape``, outside hlo-audit), adamw's two moments per parameter and its count.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest
from typer.testing import CliRunner

from hlo_audit.cli import app
from in_process import Ran, hlo_audit_here
from nnx_library import write_library

REPO = Path(__file__).resolve().parents[1]

TUNIX_CONFIG = """
target = "nnx"
models = ["qwen3-0.6b", "llama3.2-1b"]
layers = [2, 4]

[nnx]                       # shared by both models: the call tunix's trainers make, adamw
optimizer = "adamw"
learning_rate = 1e-4
layers = "num_layers"
inputs = { input_tokens = "int32[batch,seq]", positions = "int32[batch,seq]", cache = "none", attention_mask = "bool[batch,seq,seq]" }
labels = "input_tokens"
output = 0

[nnx.models."qwen3-0.6b"]
model = "tunix.models.qwen3.model:Qwen3"
config = "tunix.models.qwen3.model:ModelConfig.qwen3_0p6b"

[nnx.models."llama3.2-1b"]
model = "tunix.models.llama3.model:Llama3"
config = "tunix.models.llama3.model:ModelConfig.llama3p2_1b"
"""

TINY_CONFIG = """
target = "nnx"
models = ["tiny"]
layers = {layers}
{extra}

[nnx]
model = "tinylm.model:TinyLM"
config = "tinylm.model:ModelConfig.tiny"
layers = "num_layers"
scan = "scan_layers"
inputs = {{ tokens = "int32[batch,seq]" }}
labels = "tokens"
{tables}
"""


def hlo_audit(folder: Path, *args: str, pythonpath: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    """The CLI in a fresh process, run in ``folder`` with ``pythonpath`` (a library's folder) first: for a library
    the test edits between runs (each run imports it anew, as a user's does)."""
    path = os.pathsep.join([*map(str, pythonpath), str(REPO), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path}, timeout=600)


def cells_of(result: subprocess.CompletedProcess | Ran) -> dict[str, dict]:
    assert result.returncode == 0, result.stderr[-3000:]
    return {c["id"]: c for c in json.loads(result.stdout)["cells"]}


def param_count(model) -> int:
    """``nnx.Param`` leaves of a model built from shapes: the weights a train step's state holds."""
    from flax import nnx

    return len(jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.tunix
@pytest.mark.xdist_group("tunix")
def test_two_tunix_models_audited_from_a_config_alone(tmp_path):
    from flax import nnx
    from tunix.models.llama3 import model as llama3
    from tunix.models.qwen3 import model as qwen3

    (tmp_path / "hlo-audit.toml").write_text(TUNIX_CONFIG)
    cells = cells_of(hlo_audit_here(tmp_path, "run", "--format", "json"))
    assert sorted(cells) == ["llama3.2-1b/scan-off/none/L2", "llama3.2-1b/scan-off/none/L4",
                             "qwen3-0.6b/scan-off/none/L2", "qwen3-0.6b/scan-off/none/L4"]
    builders = {"qwen3-0.6b": (qwen3.Qwen3, qwen3.ModelConfig.qwen3_0p6b),
                "llama3.2-1b": (llama3.Llama3, llama3.ModelConfig.llama3p2_1b)}
    for cid, cell in cells.items():
        model_cls, preset = builders[cell["model"]]
        config = dataclasses.replace(preset(), num_layers=cell["layers"])
        weights = param_count(nnx.eval_shape(lambda: model_cls(config, rngs=nnx.Rngs(0))))
        roles = cell["by_role"]
        assert cell["status"] == "ok", cell["message"]
        assert roles["weight"] == weights, cid
        assert roles["optimizer_state"] == 2 * weights + 1, cid  # adamw: mu and nu per parameter, one count
        assert roles["input"] == 3 and roles["step"] == 1, cid  # tokens, positions, mask; the optimizer's step
        assert cell["entry_params"] == 3 * weights + 5, cid
        assert "rng_key" not in roles, cid  # tunix's layers keep no Rngs
    # Per layer: each weight, its two moments (Qwen3's layer has q_norm/k_norm, Llama3's not).
    per_layer = {m: (cells[f"{m}/scan-off/none/L4"]["entry_params"] - cells[f"{m}/scan-off/none/L2"]["entry_params"])
                 // 2 for m in builders}
    assert per_layer == {"qwen3-0.6b": 33, "llama3.2-1b": 27}
    # The gate over them: goldens, then a check that passes from the cache.
    assert hlo_audit_here(tmp_path, "golden", "update").returncode == 0
    check = hlo_audit_here(tmp_path, "check", "--format", "json")
    assert check.returncode == 0, check.stdout[-2000:]
    assert json.loads(check.stdout)["totals"]["cells_by_verdict"] == {"ok": 4}
    # `--layers full` is each model's own depth, read off its config preset.
    full = hlo_audit_here(tmp_path, "list", "--layers", "full", "--format", "json")
    assert sorted(c["id"] for c in json.loads(full.stdout)["cells"]) == [
        "llama3.2-1b/scan-off/none/L16", "qwen3-0.6b/scan-off/none/L28"]


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A project folder and the library's folder (on PYTHONPATH), with a config over ``extra`` and ``tables``.
    Each test imports its own copy of the library (in-process tests resolve it; subprocesses import it anew)."""
    for name in [m for m in sys.modules if m == "tinylm" or m.startswith("tinylm.")]:
        monkeypatch.delitem(sys.modules, name)
    library = write_library(tmp_path / "site")
    project = tmp_path / "project"
    project.mkdir()

    def configure(extra: str = "", tables: str = "", layers: str = "[2, 4]") -> Path:
        (project / "hlo-audit.toml").write_text(TINY_CONFIG.format(extra=extra, tables=tables, layers=layers))
        return project

    configure.library = library
    return configure


def tiny_weights(layers: int, scan: bool, **fields) -> int:
    from flax import nnx
    from tinylm.model import ModelConfig, TinyLM

    config = dataclasses.replace(ModelConfig.tiny(), num_layers=layers, scan_layers=scan, **fields)
    return param_count(nnx.eval_shape(lambda: TinyLM(config, rngs=nnx.Rngs(0))))


def test_scan_defaults_to_what_the_model_supports_and_counts_match_the_model(tiny, monkeypatch):
    project = tiny(extra='quant = ["none", "bf16"]', tables='[nnx.quant.bf16]\nfields = { dtype = "bfloat16" }')
    monkeypatch.syspath_prepend(str(tiny.library))
    cells = cells_of(hlo_audit_here(project, "run", "--format", "json"))
    # The description names scan_layers, so scan is on and off without the config saying so.
    assert sorted(cells) == [f"tiny/scan-{s}/{q}/L{d}" for s in ("off", "on") for q in ("bf16", "none")
                             for d in (2, 4)]
    for cid, cell in cells.items():
        weights = tiny_weights(cell["layers"], cell["scan"] == "on")
        assert cell["by_role"]["weight"] == weights, cid
        assert cell["by_role"]["optimizer_state"] == 2 * weights + 1, cid
    # Scanned, the layers are one stacked set of arrays: the same parameters at any depth; unrolled, 15 a layer
    # (5 weights, 10 moments).
    assert cells["tiny/scan-on/none/L2"]["entry_params"] == cells["tiny/scan-on/none/L4"]["entry_params"]
    assert cells["tiny/scan-off/none/L4"]["entry_params"] - cells["tiny/scan-off/none/L2"]["entry_params"] == 30
    # The variant sets the config's dtype field (coerced to a dtype): the bf16 cells compute in bf16.
    bf16, none = (hlo_audit_here(project, "lower", f"tiny/scan-off/{q}/L2").stdout for q in ("bf16", "none"))
    assert "bf16[" in bf16 and "bf16[" not in none and none.startswith("HloModule")


def test_a_library_edit_is_a_cache_miss_and_changes_the_cells(tiny):
    """The cell carries a digest of the library's source: an edit re-lowers, never serves the old module."""
    from nnx_library import add_layer_dropout

    project = tiny(extra='scan = ["off"]', layers="[2]")
    first = cells_of(hlo_audit(project, "run", "--format", "json", pythonpath=(tiny.library,)))
    again = cells_of(hlo_audit(project, "run", "--format", "json", pythonpath=(tiny.library,)))
    assert again["tiny/scan-off/none/L2"]["cached"] is True
    add_layer_dropout(tiny.library)
    edited = cells_of(hlo_audit(project, "run", "--format", "json", pythonpath=(tiny.library,)))
    cell = edited["tiny/scan-off/none/L2"]
    assert cell["cached"] is False
    # Each unrolled block's Dropout(0.0) holds one RNG stream: a key and a count, never drawn.
    assert cell["entry_params"] == first["tiny/scan-off/none/L2"]["entry_params"] + 4
    assert cell["by_role"]["rng_key"] == cell["by_role"]["rng_count"] == 2
    assert cell["groups"]["state.model.layers.*.dropout.rngs.*"] == 4


def test_positional_float_inputs_and_the_mean_square_loss_agree_with_the_callable_target(tmp_path):
    """The example MLP through the nnx target (positional float input, mean-square loss, adamw) keeps the same
    weights and RNG streams as its own callable target (SGD): the target adds only adamw's state."""
    (tmp_path / "nnx.toml").write_text(textwrap.dedent("""
        target = "nnx"
        models = ["mlp"]
        layers = [2, 3]
        [nnx]
        model = "hlo_audit.examples.nnx_mlp:MLP"
        layers = "layers"
        scan = "scan"
        args = { width = 16, rate = 0.0 }
        rng_streams = ["default", "dropout"]
        inputs = ["float32[batch,16]"]
        """))
    (tmp_path / "callable.toml").write_text('target = "hlo_audit.examples.nnx_mlp:lower"\nmodels = ["mlp"]\n'
                                            'quant = ["dropout0"]\nlayers = [2, 3]\n')
    stock = cells_of(hlo_audit_here(tmp_path, "run", "--config", "nnx.toml", "--format", "json"))
    own = cells_of(hlo_audit_here(tmp_path, "run", "--config", "callable.toml", "--format", "json"))
    for scan in ("on", "off"):
        for depth in (2, 3):
            a, b = stock[f"mlp/scan-{scan}/none/L{depth}"], own[f"mlp/scan-{scan}/dropout0/L{depth}"]
            for role in ("weight", "rng_key", "rng_count", "input"):
                assert a["by_role"].get(role) == b["by_role"].get(role), (scan, depth, role)
            assert a["by_role"]["optimizer_state"] == 2 * a["by_role"]["weight"] + 1
            carried = a["rng_streams"]["carried"]
            assert carried == b["rng_streams"]["carried"] == (1 if scan == "on" else depth)  # Dropout(0.0)


# --------------------------------------------------------------------------------------------------------------
# Config errors: one line naming the file and the key, exit 2, at load or at plan time (`list` too)
# --------------------------------------------------------------------------------------------------------------

BAD_NNX = [
    ("[nnx]\nmodle = 'x:y'\n", "nnx.modle: unknown key"),
    ("[nnx]\ninputs = { tokens = 'int33[batch,seq]' }\n", "nnx.inputs.tokens: unknown dtype 'int33'"),
    ("[nnx]\ninputs = { tokens = 'int32[batch,sq]' }\n", "nnx.inputs.tokens: dimension 'sq'"),
    ("[nnx]\nlabels = 'ids'\n", "nnx.labels: 'ids' is not an array input (inputs: tokens)"),
    ("[nnx]\ninputs = { tokens = 'float32[batch,seq]' }\n", "nnx.labels: 'tokens' is float32[batch,seq]: token ids"),
    ("[nnx]\nloss = 'hinge'\n", "nnx.loss: expected one of cross_entropy, mean_square"),
    ("[nnx]\nmodel = 'tinylm.model'\n", "nnx.model: expected 'package.module:Name'"),
    ("[nnx]\nlearning_rate = -1\n", "nnx.learning_rate: expected a finite number > 0"),
    ("[nnx]\nlearning_rate = inf\n", "nnx.learning_rate: expected a finite number > 0"),
    ('quant = ["none", "fp8"]\n', "quant: 'fp8': the nnx target builds 'none'"),
    ("[nnx.quant.bf16]\nfields = { dtype = 'bfloat16' }\n", "nnx.quant.bf16: variant 'bf16' is in no series' quant"),
    ("[nnx.models.other]\nmodel = 'x:y'\n", "nnx.models.other: model 'other' is in no series' models"),
    ("[overrides.tiny]\nnum_layers = 3\n", "overrides: the nnx target sets a model's config fields in"),
    ('step = ["prefill"]\n', "step: the nnx target builds a train step only"),
]
BAD_AT_PLAN = [
    ("[nnx]\nmodel = 'tinylm.model:TinyLm'\n", "nnx.model: 'tinylm.model:TinyLm': tinylm.model has no attribute "
                                               "'TinyLm' (model 'tiny')"),
    ("[nnx]\nmodel = 'tinylm.modle:TinyLM'\n", "nnx.model: 'tinylm.modle:TinyLM': cannot import 'tinylm.modle'"),
    ("[nnx]\nconfig = 'tinylm.model:ModelConfig.tiniest'\n", "nnx.config: 'tinylm.model:ModelConfig.tiniest': "
                                                             "tinylm.model.ModelConfig has no attribute 'tiniest'"),
    ("[nnx]\nlayers = 'num_layer'\n", "nnx.layers: 'num_layer': the object 'tinylm.model:ModelConfig.tiny' returns "
                                      "(ModelConfig) has no field 'num_layer'"),
    ("[nnx]\nfields = { dtyp = 'bfloat16' }\n", "nnx.fields: 'dtyp': the object"),
    ("[nnx]\noptimizer = 'adamww'\n", "nnx.optimizer: optax has no optimizer 'adamww'"),
    ("[nnx]\nrngs = 'key'\n", "nnx.rngs: 'tinylm.model:TinyLM' takes no keyword argument 'key'"),
]


def _replace_keys(config: str, rule: str) -> str:
    """The tiny config with ``rule``'s keys in place of the same keys (a [section] rule is appended)."""
    lines = config.splitlines()
    section = None
    for line in rule.splitlines():
        if line.startswith("["):
            section = line
            continue
        key = line.split("=")[0].strip()
        where = lines.index(section) if section in lines else None
        scope = range(where + 1, len(lines)) if where is not None else range(len(lines))
        hit = next((i for i in scope if lines[i].split("=")[0].strip() == key
                    and (where is not None or not any(lines[j].startswith("[") for j in range(i)))), None)
        if hit is not None:
            lines[hit] = line
        elif where is not None:
            lines.insert(where + 1, line)
        elif section is not None:
            lines += [section, line]
        else:
            lines.insert(0, line)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("rule, message", BAD_NNX + BAD_AT_PLAN)
def test_nnx_config_mistakes_are_one_line_naming_the_key(tiny, monkeypatch, rule, message):
    project = tiny()
    path = project / "hlo-audit.toml"
    path.write_text(_replace_keys(path.read_text(), rule))
    monkeypatch.syspath_prepend(str(tiny.library))
    monkeypatch.chdir(project)
    for command in ("list", "run", "check"):
        result = CliRunner().invoke(app, [command, "--config", str(path)])
        assert result.exit_code == 2, (command, result.output, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith(f"hlo-audit: error: {path}: "), lines[0]
        assert message in lines[0], lines[0]


def test_the_nnx_target_needs_the_models_it_audits(tmp_path):
    path = tmp_path / "hlo-audit.toml"
    path.write_text('target = "nnx"\nlayers = [2]\n[nnx]\nmodel = "tinylm.model:TinyLM"\n')
    result = CliRunner().invoke(app, ["list", "--config", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"hlo-audit: error: {path}: models: the nnx target audits the models a config "
                                     "names: models = ['NAME', ...], each described by [nnx] and [nnx.models.NAME]")


def test_explicit_scan_on_for_a_model_without_a_switch_is_an_error(tiny, monkeypatch):
    project = tiny(extra='scan = ["on", "off"]')
    path = project / "hlo-audit.toml"
    path.write_text(path.read_text().replace('scan = "scan_layers"\n', ""))
    result = CliRunner().invoke(app, ["list", "--config", str(path)])
    assert result.exit_code == 2
    assert "scan: 'on' for model 'tiny', whose description names no scan switch" in result.stderr
    # Left out, scan is what the model supports: off only.
    path.write_text(path.read_text().replace('scan = ["on", "off"]\n', ""))
    monkeypatch.syspath_prepend(str(tiny.library))
    listed = CliRunner().invoke(app, ["list", "--config", str(path), "--format", "json"])
    assert listed.exit_code == 0, listed.stderr
    assert [c["id"] for c in json.loads(listed.stdout)["cells"]] == ["tiny/scan-off/none/L2", "tiny/scan-off/none/L4"]


# --------------------------------------------------------------------------------------------------------------
# Callable targets: resolved at plan time; their function's scan / quant attributes are the defaults
# --------------------------------------------------------------------------------------------------------------


def test_a_misspelled_target_function_is_a_config_error_before_any_cell(tmp_path):
    path = tmp_path / "hlo-audit.toml"
    path.write_text('target = "hlo_audit.examples.nnx_mlp:lowr"\nmodels = ["mlp"]\nquant = ["none"]\n')
    for command in ("list", "run", "check", "scaling"):
        result = CliRunner().invoke(app, [command, "--config", str(path)])
        assert result.exit_code == 2, (command, result.output)
        assert result.stderr.strip() == (f"hlo-audit: error: {path}: target: target "
                                         "'hlo_audit.examples.nnx_mlp:lowr': 'lowr' is not a callable in "
                                         "hlo_audit.examples.nnx_mlp")
        assert result.stdout == ""  # nothing lowered, no table


def test_a_function_s_scan_and_quant_attributes_are_the_defaults(tmp_path, monkeypatch):
    (tmp_path / "unrolled_only.py").write_text(textwrap.dedent("""
        from hlo_audit.examples.nnx_mlp import lower as example

        def lower(cell):
            return example(cell)

        lower.scan = ["off"]
        lower.quant = ["none", "dropout0"]
        lower.full_depth = {"mlp": 8}
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "hlo-audit.toml"
    path.write_text('target = "unrolled_only:lower"\nmodels = ["mlp"]\nlayers = [2]\n')
    listed = CliRunner().invoke(app, ["list", "--config", str(path), "--format", "json"])
    assert listed.exit_code == 0, listed.stderr
    assert [c["id"] for c in json.loads(listed.stdout)["cells"]] == ["mlp/scan-off/dropout0/L2",
                                                                     "mlp/scan-off/none/L2"]
    path.write_text(path.read_text() + 'scan = ["on"]\n')
    refused = CliRunner().invoke(app, ["list", "--config", str(path)])
    assert refused.exit_code == 2
    assert "scan[0]: unrolled_only:lower lowers scan off only (its function's scan attribute), got 'on'" in \
        refused.stderr
