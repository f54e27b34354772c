"""`hlo-audit explain` on real lowerings: the tree's families, counts, pruning, formats and bad input.

The bridge model (nnx_models, ``bridge="nodraw"``) has, per unrolled layer, an ``nnx.Linear`` and a Linen
``Dense`` wrapped in ``ToNNX`` that keeps a fork of both RNG streams: 2 streams x (key, count) = 4 u32 per
layer. The numbers are checked against ``nnx_models.expected_counts``.
"""

from __future__ import annotations

import json
import re

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

import nnx_models
from hlo_audit.analysed import Param
from hlo_audit.cli import app
from hlo_audit.commands.explain import explain, split_pattern
from nnx_models import ModelSpec

LAYERS = 3


def run(*args):
    # Piped output honors COLUMNS, which xdist workers set to 80: these tests are about the 100-column layout.
    result = CliRunner().invoke(app, ["explain", *map(str, args)], env={"COLUMNS": "100"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.fixture
def bridge_file(write_hlo):
    return write_hlo(ModelSpec(layers=LAYERS, bridge="nodraw"))


def test_tree_puts_the_per_layer_rng_state_first(bridge_file):
    result = run(bridge_file, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "hlo-audit/explain/v1"
    root = doc["tree"]
    expected = nnx_models.expected_counts(ModelSpec(layers=LAYERS, bridge="nodraw"))
    assert root["params"] == expected["total"]
    assert root["by_dtype"] == {"u32": expected["u32"], "f32": expected["f32"]}
    first = root["children"][0]
    assert first["name"] == "state.layers_*.bridge.to_nnx__rngs.*"
    assert (first["params"], first["by_dtype"], first["bytes"]) == (4 * LAYERS, {"u32": 4 * LAYERS}, LAYERS * 2 * (8 + 4))
    assert first["by_role"] == {"rng_count": 2 * LAYERS, "rng_key": 2 * LAYERS}
    # The kernels of both modules in a layer are one family; the module paths are its children.
    kernels = next(c for c in root["children"] if c["name"] == "state.layers_*.*.kernel")
    assert [(c["name"], c["params"]) for c in kernels["children"]] == [("bridge.Dense_0", LAYERS), ("linear", LAYERS)]
    assert sum(c["params"] for c in root["children"]) == root["params"]
    counts = [c["params"] for c in root["children"]]
    assert counts == sorted(counts, reverse=True)


def test_depth_and_top_prune_the_tree(bridge_file):
    root = json.loads(run(bridge_file, "--format", "json", "--depth", "1", "--top", "2").stdout)["tree"]
    assert len(root["children"]) == 2
    assert root["hidden_children"] == 3 and root["hidden_params"] == root["params"] - sum(
        c["params"] for c in root["children"])
    assert all(c["children"] == [] for c in root["children"])
    assert root["children"][1]["hidden_children"] == 2  # the kernel family's two module paths, not shown


def test_table_and_markdown(bridge_file):
    result = run(bridge_file)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    families = [line for line in lines if line.startswith(("├── ", "└── "))]
    assert re.match(rf"[├└]──\s+{4 * LAYERS}\s+state\.layers_\*\.bridge\.to_nnx__rngs\.\*\s+u32:{4 * LAYERS} ",
                    families[0])
    assert len(families) == 5
    assert max(len(line) for line in lines) <= 100
    md = run(bridge_file, "--format", "markdown").stdout
    assert f"  - **{4 * LAYERS}** `state.layers_*.bridge.to_nnx__rngs.*`: u32 {4 * LAYERS}; rng_count" in md


def test_cell_id_is_read_from_the_matrix(tmp_path):
    (tmp_path / "hlo-audit.toml").write_text('target = "hlo_audit.examples.nnx_mlp:lower"\nmodels = ["mlp"]\n'
                                             'quant = ["dropout0"]\nlayers = [2]\n')
    result = run("mlp/scan-off/dropout0/L5", "--config", tmp_path / "hlo-audit.toml", "--format", "json")
    assert result.exit_code == 0, result.output
    root = json.loads(result.stdout)["tree"]
    assert root["name"] == "mlp/scan-off/dropout0/L5"
    rng = root["children"][0]
    assert (rng["name"], rng["params"]) == ("state.layers.*.dropout.rngs.*", 10)  # 5 layers x (key, count)


@pytest.mark.parametrize("source", ["no/such/cell/L2", "mlp/scan-off/int9/L2", "missing.hlo.txt"])
def test_unknown_source_is_one_line(tmp_path, source):
    (tmp_path / "hlo-audit.toml").write_text('target = "hlo_audit.examples.nnx_mlp:lower"\nmodels = ["mlp"]\n')
    result = run(source, "--config", tmp_path / "hlo-audit.toml")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and source in result.stderr and "Traceback" not in result.output


def test_split_pattern_wildcards_the_module_path_inside_a_layer():
    assert split_pattern("state.model.decoder.layers_*.mlp.wi_0.AqtDotGeneral_0.to_nnx__rngs.*") == (
        "state.model.decoder.layers_*.*.AqtDotGeneral_0.to_nnx__rngs.*", ["mlp", "wi_0"])
    assert split_pattern("state.model.decoder.layers.self_attention.query.kernel") == (
        "state.model.decoder.layers.*.kernel", ["self_attention", "query"])
    assert split_pattern("state.layers_*.dropout.rngs.*") == ("state.layers_*.dropout.rngs.*", [])
    assert split_pattern("state.model.token_embedder.embedding") == ("state.model.token_embedder.embedding", [])


def test_one_pattern_family_is_named_by_its_pattern():
    params = [Param(index=i, path=f"state.layers_{i}.linear.kernel", role="weight", dtype="f32", dims=(1,), bytes=4,
                    pattern="state.layers_*.linear.kernel") for i in range(3)]
    (only,) = explain(params, "m").children.values()
    assert (only.name, only.count, only.children) == ("state.layers_*.linear.kernel", 3, {})


def test_dump_folder_explains_the_train_step(dump_folder):
    root = json.loads(run(dump_folder, "--format", "json").stdout)["tree"]
    assert root["name"].endswith("jit_train_step.before_optimizations.txt")
    expected = nnx_models.expected_counts(ModelSpec(dropout_rate=0.5))
    assert root["params"] == expected["total"] and root["by_dtype"]["u32"] == expected["u32"]
    assert root["children"][0]["name"] == "state.layers_*.dropout.rngs.*"


@pytest.mark.parametrize("kind", ["file", "dump-folder", "stdin", "cell-id"])
def test_every_input_kind_fits_100_columns(kind, tmp_path, dump_folder):
    """At COLUMNS=100 no line is wider than 100, whatever the root is named by (a long path breaks at '/')."""
    deep = tmp_path / ("a-folder-name-long-enough-to-push-the-path-past-the-width-" * 2) / "x"
    deep.mkdir(parents=True)
    path = deep / "bridge-model-with-a-long-file-name.hlo.txt"
    path.write_text(nnx_models.hlo_text(ModelSpec(layers=LAYERS, bridge="nodraw")))
    config = tmp_path / "hlo-audit.toml"
    config.write_text('target = "hlo_audit.examples.nnx_mlp:lower"\nmodels = ["mlp"]\nquant = ["dropout0"]\n')
    args, stdin = {"file": ([path], None), "dump-folder": ([dump_folder], None),
                   "stdin": (["-"], path.read_text()),
                   "cell-id": (["mlp/scan-off/dropout0/L3", "--config", config], None)}[kind]
    result = CliRunner().invoke(app, ["explain", *map(str, args), "--depth", "9", "--top", "0"], input=stdin,
                                env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) > 5 and max(cell_len(line) for line in lines) <= 100
    if kind == "file":
        total = nnx_models.expected_counts(ModelSpec(layers=LAYERS, bridge="nodraw"))["total"]
        assert re.sub(r"\s+", "", "".join(lines[:3])).startswith(f"{total}{path}")  # the whole path, in pieces
