"""Config loading and validation, matrix expansion, --only and --shard."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hlo_audit.audit import plan
from hlo_audit.cli import app
from hlo_audit.config import ConfigError, load_config
from hlo_audit.targets.vocab import MAXTEXT_QUANTIZATIONS
from hlo_audit.matrix import MatrixError, select


def test_builtin_default_matrix(tmp_path):
    p = plan(cwd=tmp_path)
    assert p.config.source == "<built-in default>"
    ids = [c.id for c in p.cells]
    # Train steps: 3 models x 2 scans x (4 quantizations + 5 TE recipes) x 2 depths, less deepseek3-test's te_nvfp4
    # (its MoE dims do not fit TE's RHT cast fusion: excluded by default); the TPU series (3 models x 2 scans);
    # inference: prefill and generate of llama3-8b at depth 2, scanned or not, unquantized, int8 and int8 serve.
    assert len(ids) == len(set(ids)) == 3 * 2 * 9 * 2 - 2 * 2 + 3 * 2 + 2 * 2 * 3
    assert "deepseek3-test/scan-off/te_nvfp4_no_rht/L2/cuda-sm_90" in ids
    assert "deepseek3-test/scan-off/te_nvfp4/L2/cuda-sm_90" not in ids
    assert "llama3-8b/scan-off/int8/L2" in ids
    assert "llama3-8b/scan-on/int8-serve/L2/generate" in ids and "llama3-8b/scan-off/none/L2/prefill" in ids
    # Transformer Engine recipes exist only for CUDA: a series of their own, whose ids name the architecture.
    assert "llama3-8b/scan-off/te_nvfp4/L2/cuda-sm_90" in ids
    assert all(c.platform == "cuda" and c.device == "sm_90" for c in p.cells if c.quant.startswith("te_"))
    # MaxText's own HLO gate: its three stock configs through XLA's TPU compiler for v6e-4 at 4 layers, scanned
    # and unrolled, up to the after-optimizations module that gate diffs (stage optimized).
    tpu = [c for c in p.cells if c.platform == "tpu"]
    assert sorted(c.id for c in tpu if c.scan) == [f"{m}/scan-on/none/L4/tpu-v6e-4/optimized"
                                                   for m in ("deepseek3-test", "llama3-8b", "qwen3-1.7b")]
    assert len(tpu) == 6 and all(c.stage == "optimized" and not c.overrides for c in tpu)  # stock deepseek3-test
    assert all(c.platform == "cpu" for c in p.cells if not c.quant.startswith("te_") and c not in tpu)
    deepseek = next(c for c in p.cells if c.model == "deepseek3-test")
    assert dict(deepseek.overrides) == {"first_num_dense_layers": "1", "megablox": "False"}


def test_config_from_file_and_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.hlo-audit]\nmodels = ["llama3-8b"]\n'
                                             'quant = ["none", "int8"]\nscan = ["off"]\nlayers = [2, 4, 8]\n')
    config = load_config(cwd=tmp_path)
    assert config.source == "pyproject.toml [tool.hlo-audit]"
    assert [c.id for c in config.cells()] == [
        "llama3-8b/scan-off/int8/L2", "llama3-8b/scan-off/int8/L4", "llama3-8b/scan-off/int8/L8",
        "llama3-8b/scan-off/none/L2", "llama3-8b/scan-off/none/L4", "llama3-8b/scan-off/none/L8"]
    assert config.series[0].overrides == {}  # the default deepseek override follows the default models only
    assert len(config.series) == 1  # a config with its own axes does not inherit the default's further series
    (tmp_path / "hlo-audit.toml").write_text('models = ["qwen3-1.7b"]\nlayers = [3]\nquant = ["fp8"]\n')
    assert load_config(cwd=tmp_path).source == "hlo-audit.toml"  # wins over pyproject.toml


@pytest.mark.parametrize("text,message", [
    ('modles = ["x"]\n', "unknown key 'modles'"),
    ('quant = ["none", "int9"]\n', "quant[1]: unknown quantization 'int9'"),
    ('scan = ["maybe"]\n', "scan[0]: expected 'on' or 'off'"),
    ('layers = [0]\n', "layers[0]: expected an integer >= 1 or 'full'"),
    ('layers = "2"\n', "layers: expected a non-empty list"),
    ('batch = "one"\n', "batch: expected int"),
    ('platform = "gpu"\n', "platform: expected one of cpu, cuda, rocm, tpu"),
    ('target = "nonsense"\n', "target: expected 'maxtext' or 'package.module:function'"),
    ('models = ["a", "a"]\n', "models: has duplicates"),
    ('[overrides.ghost]\nx = 1\n', "overrides.ghost: model 'ghost' is not in models"),
    ('[[exclude]]\ncolour = "red"\n', "exclude[0].colour: unknown key"),
    ('models = [\n', "not valid TOML"),
    ('[policy]\ncount = "maybe"\n', "policy.count: expected 'fail', 'warn' or 'off'"),
    ('[policy]\nvibes = "off"\n', "policy.vibes: unknown rule"),
    ('[[waive]]\nrule = "count"\nquant = "int8"\n', "waive[0].reason: every waiver needs a reason"),
    ('[[waive]]\nrule = "colour"\nreason = "x"\n', "waive[0].rule: expected one of"),
    ('[policy]\ndead_rng = "loud"\n', "policy.dead_rng: expected 'fail', 'warn' or 'off'"),
    ('[[waive]]\nrule = "count"\npattern = "x.*"\nreason = "x"\n', "waive[0].pattern: unknown key"),
    ('[[waive]]\nrule = "dead_rng"\npattern = ""\nreason = "x"\n', "waive[0].pattern: expected a glob"),
    ('memory_tolerance = 2\n', "memory_tolerance: expected a fraction in [0, 1)"),
    ('[policy]\nmemory = "loud"\n', "policy.memory: expected 'fail', 'warn' or 'off'"),
    ('platform = "tpu"\ntopology = "v6e-5"\n', "topology[0]: unknown TPU topology 'v6e-5'"),
    ('topology = "v6e-4"\n', "topology: a TPU topology needs platform = 'tpu'"),
])
def test_bad_config_names_file_and_key(tmp_path, text, message):
    path = tmp_path / "hlo-audit.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert str(path) in str(info.value) and message in str(info.value)
    result = CliRunner().invoke(app, ["list", "--config", str(path)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and message in result.output and "Traceback" not in result.output


def test_dead_rng_policy_defaults_to_warn_and_takes_pattern_waivers(tmp_path):
    assert load_config(cwd=tmp_path).policy["dead_rng"] == "warn"
    (tmp_path / "hlo-audit.toml").write_text('[policy]\ndead_rng = "fail"\n[[waive]]\nrule = "dead_rng"\n'
                                             'pattern = "model.decoder.rngs.*"\nreason = "kept for init"\n')
    config = load_config(cwd=tmp_path)
    assert config.policy["dead_rng"] == "fail"
    assert config.waivers == ({"rule": "dead_rng", "pattern": "model.decoder.rngs.*", "reason": "kept for init"},)


def test_missing_config_file(tmp_path):
    result = CliRunner().invoke(app, ["list", "--config", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2 and "nope.toml: no such file" in result.output


def test_only_and_shard(tmp_path):
    cells = plan(cwd=tmp_path).cells
    chosen = select(cells, "model=llama3-8b,quant=int8,scan=off,step=train")
    assert [c.id for c in chosen] == ["llama3-8b/scan-off/int8/L2", "llama3-8b/scan-off/int8/L4"]
    assert len(select(cells, "quant=int8,quant=fp8,step=train")) == 3 * 2 * 2 * 2
    shards = [select(cells, None, f"{k}/3") for k in (1, 2, 3)]
    assert sorted(c.id for s in shards for c in s) == sorted(c.id for c in cells)
    series = [len({c.series for c in shard}) for shard in shards]  # shards are dealt whole series
    assert max(series) - min(series) <= 1
    for bad, message in [("model", "expects key=value"), ("colour=red", "unknown key 'colour'")]:
        with pytest.raises(MatrixError, match=message):
            select(cells, bad)
    with pytest.raises(MatrixError, match="K/N"):
        select(cells, None, "4/3")


def test_layers_option(tmp_path):
    p = plan(only="model=llama3-8b,quant=none,scan=off,platform=cpu,step=train", layers="2,full", cwd=tmp_path)
    assert [c.layers for c in p.cells] == [2, 32]
    with pytest.raises(MatrixError):
        plan(layers="two", cwd=tmp_path)


def test_known_quantizations_match_maxtext():
    from maxtext.configs.types import QuantizationType

    assert set(MAXTEXT_QUANTIZATIONS) == {q.value or "none" for q in QuantizationType}


def test_series_inherit_top_level_axes_and_name_their_platform(tmp_path):
    path = tmp_path / "hlo-audit.toml"
    path.write_text('models = ["llama3-8b", "deepseek3-test"]\nscan = ["off"]\nquant = ["none"]\nlayers = [2]\n'
                    '[overrides.deepseek3-test]\nfirst_num_dense_layers = 1\n'
                    '[[matrix]]\nquant = ["te_mxfp8"]\nplatform = "cuda"\ncuda_arch = ["sm_90", "sm_100"]\n'
                    '[[matrix]]\nmodels = ["deepseek3-test"]\nscan = ["on"]\nlayers = [4]\nplatform = "tpu"\n'
                    'topology = "v6e-4"\nstage = "compiled"\noverrides = {}\n'
                    '[[matrix]]\nmodels = ["llama3-8b"]\nstep = ["prefill", "generate"]\n'
                    '[[matrix]]\nmodels = ["llama3-8b"]\nquant = ["int8"]\nquant_mode = "serve"\nstep = "prefill"\n'
                    'prefill = 32\n')
    cells = {c.id: c for c in load_config(str(path)).cells()}
    assert sorted(cells) == [
        "deepseek3-test/scan-off/none/L2", "deepseek3-test/scan-off/te_mxfp8/L2/cuda-sm_100",
        "deepseek3-test/scan-off/te_mxfp8/L2/cuda-sm_90", "deepseek3-test/scan-on/none/L4/tpu-v6e-4/compiled",
        "llama3-8b/scan-off/int8-serve/L2/prefill/b1s128p32", "llama3-8b/scan-off/none/L2",
        "llama3-8b/scan-off/none/L2/generate", "llama3-8b/scan-off/none/L2/prefill",
        "llama3-8b/scan-off/te_mxfp8/L2/cuda-sm_100", "llama3-8b/scan-off/te_mxfp8/L2/cuda-sm_90"]
    # A series inherits the top-level overrides of its models unless it sets its own (the TPU one: stock model).
    assert dict(cells["deepseek3-test/scan-off/te_mxfp8/L2/cuda-sm_90"].overrides) == {"first_num_dense_layers": "1"}
    assert cells["deepseek3-test/scan-on/none/L4/tpu-v6e-4/compiled"].overrides == ()
    tpu = cells["deepseek3-test/scan-on/none/L4/tpu-v6e-4/compiled"]
    assert (tpu.platform, tpu.device, tpu.stage, tpu.platform_label) == ("tpu", "v6e-4", "compiled", "tpu-v6e-4")
    # --only and exclude rules reach the new axes.
    assert [c.id for c in select(cells.values(), "cuda_arch=sm_100,model=llama3-8b")] == [
        "llama3-8b/scan-off/te_mxfp8/L2/cuda-sm_100"]
    assert len(select(cells.values(), "step=prefill")) == 2
    assert len(select(cells.values(), "topology=v6e-4")) == 1
    # AQT's serve mode and the prompt length are part of an inference cell: id, --only, and prefill only there.
    serve = cells["llama3-8b/scan-off/int8-serve/L2/prefill/b1s128p32"]
    assert (serve.quant, serve.quant_mode, serve.prefill, serve.quant_label) == ("int8", "serve", 32, "int8-serve")
    assert [c.id for c in select(cells.values(), "quant_mode=serve")] == [serve.id]
    assert cells["llama3-8b/scan-off/none/L2/prefill"].prefill == 64


@pytest.mark.parametrize("text,message", [
    ('quant = ["te_nvfp4"]\n', "quant[0]: te_nvfp4 is a Transformer Engine recipe, which exists only for CUDA"),
    ('topology = "v6e-4"\n', "topology: a TPU topology needs platform = 'tpu'"),
    ('platform = "tpu"\ntopology = ["v6e"]\n', "topology[0]: expected a TPU topology such as 'v6e-4'"),
    ('platform = "cuda"\ncuda_arch = "hopper"\n', "cuda_arch[0]: expected a GPU architecture such as 'sm_90'"),
    ('cuda_arch = "sm_90"\n', "cuda_arch: a CUDA architecture needs platform = 'cuda'"),
    ('step = ["decode"]\n', "step[0]: expected one of train, prefill, generate, insert"),
    ('[[matrix]]\ncolour = "red"\n', "matrix[0].colour: unknown key"),
    ('[[matrix]]\nplatform = "tpu"\nquant = ["int9"]\n', "matrix[0].quant[0]: unknown quantization 'int9'"),
    ('matrix = "tpu"\n', "matrix: expected an array of tables"),
    ('quant = ["int8"]\nquant_mode = "convert"\nstep = "prefill"\n', "quant_mode[0]: expected one of train, serve"),
    ('quant = ["int8"]\nquant_mode = "serve"\n', "quant_mode: 'serve' is MaxEngine's pre-quantized-checkpoint mode"),
    ('quant = ["none", "int8"]\nquant_mode = ["train", "serve"]\nstep = "generate"\n',
     "quant[0]: quant_mode 'serve' needs an AQT quantization (int8, intmp), got 'none'"),
    ('step = "prefill"\nprefill = 256\n', "prefill: the prompt (256) must fit the sequence it starts (seq = 128)"),
    ('[[matrix]]\nprefill = 0\n', "matrix[0].prefill: must be >= 1"),
])
def test_bad_series_names_file_and_key(tmp_path, text, message):
    path = tmp_path / "hlo-audit.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert str(path) in str(info.value) and message in str(info.value)


def test_two_series_may_not_give_one_cell_two_configurations(tmp_path):
    path = tmp_path / "hlo-audit.toml"
    path.write_text('models = ["llama3-8b"]\nscan = ["off"]\nquant = ["none"]\nlayers = [2]\n'
                    '[[matrix]]\noverrides = {llama3-8b = {mlp_dim = 64}}\n')
    with pytest.raises(ConfigError, match="two series give cell llama3-8b/scan-off/none/L2 different overrides"):
        load_config(str(path)).cells()
