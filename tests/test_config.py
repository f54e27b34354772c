"""Config loading and validation, matrix expansion, --only and --shard."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hlo_audit.audit import plan
from hlo_audit.cli import app
from hlo_audit.config import ConfigError, load_config
from hlo_audit.matrix import MatrixError, select
from hlo_audit.targets.vocab import MAXTEXT_QUANTIZATIONS
from in_process import cli


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
    # Issue 48: a waiver with no keys (or naming no cells) waived its rule in every cell; an exclude never could.
    ('[[exclude]]\n', "exclude[0]: an empty rule would exclude every cell"),
    ('[[waive]]\n', "waive[0]: an empty waiver would waive every cell"),
    ('[[waive]]\nrule = "count"\nreason = "x"\n', "waive[0]: a waiver naming no cells would waive count in every cell"),
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
    pytest.param('platform = "tpu"\ntopology = "v6e-5"\n', "topology[0]: unknown TPU topology 'v6e-5'",
                 marks=pytest.mark.tpu),  # libtpu names the topologies
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


@pytest.mark.maxtext  # needs MaxText (make compat's environment has none)
def test_layers_option(tmp_path):
    p = plan(only="model=llama3-8b,quant=none,scan=off,platform=cpu,step=train", layers="2,full", cwd=tmp_path)
    assert [c.layers for c in p.cells] == [2, 32]
    with pytest.raises(MatrixError):
        plan(layers="two", cwd=tmp_path)


def test_known_quantizations_match_maxtext():
    pytest.importorskip("maxtext", reason="MaxText is not installed (make compat's environment)")
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


# --------------------------------------------------------------------------------------------------------------
# Issue 22: careless input. Every mistake is one line naming the file (or the option) and exit 2.
# --------------------------------------------------------------------------------------------------------------

EXAMPLE = 'target = "hlo_audit.examples.nnx_mlp:lower"\nmodels = ["mlp"]\nquant = ["none", "dropout0"]\nlayers = [2, 3]\n'


def one_line(result, *must: str) -> str:
    """Exit 2, one line, our prefix, no traceback (typer's runner: a Python exception escaping is a failure)."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"raised {type(result.exception).__name__}: {result.exception}") from result.exception
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hlo-audit: error: ") and "Traceback" not in result.output, lines
    for text in must:
        assert text in lines[0], (text, lines[0])
    return lines[0]


@pytest.mark.parametrize("text", ["", "\n# nothing set yet\n"])
def test_an_empty_config_file_is_an_error_naming_it(tmp_path, text):
    """An empty hlo-audit.toml once selected the built-in 122-cell MaxText matrix without a word."""
    (tmp_path / "hlo-audit.toml").write_text(text)
    with pytest.raises(ConfigError, match="hlo-audit.toml: is empty: set at least `models`"):
        load_config(cwd=tmp_path)
    one_line(cli("list", "--config", tmp_path / "hlo-audit.toml"), "hlo-audit.toml: is empty")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.hlo-audit]\n')
    with pytest.raises(ConfigError, match=r"pyproject.toml: \[tool.hlo-audit\] is empty"):
        load_config(str(tmp_path / "pyproject.toml"))


def test_a_config_path_that_is_not_a_file(tmp_path):
    one_line(cli("list", "--config", "/dev/zero"), "/dev/zero: not a config file (a device or socket)")
    one_line(cli("list", "--config", tmp_path), "is a folder, not a config file")
    (tmp_path / "bin.toml").write_bytes(b'models = ["\xff"]\n')
    one_line(cli("list", "--config", tmp_path / "bin.toml"), "bin.toml: not UTF-8 (byte 11)")


def test_exclude_and_waive_values_may_be_lists_of_alternatives(tmp_path):
    """`[[exclude]] model = ["mlp"]` and `[[waive]] layers = [2]` once were accepted and matched nothing."""
    path = tmp_path / "hlo-audit.toml"
    path.write_text(EXAMPLE.replace('["mlp"]', '["mlp", "wide"]') + '[[exclude]]\nmodel = ["wide"]\nlayers = [3]\n'
                    '[[waive]]\nrule = "rng_scaling"\nlayers = [2, 3]\nquant = ["dropout0", "dropout"]\n'
                    'reason = "kept on purpose"\n')
    config = load_config(str(path))
    ids = [c.id for c in config.cells()]
    assert "wide/scan-off/none/L2" in ids and not any(i.startswith("wide/") and "/L3" in i for i in ids)
    assert len(ids) == 2 * 2 * 2 + 2 * 2  # mlp: 2 scans x 2 quants x 2 depths; wide at L2 only
    waiver = config.waivers[0]
    cells = {c.id: c for c in config.cells()}
    from hlo_audit.matrix import matches_rule

    match = {k: v for k, v in waiver.items() if k not in ("rule", "reason")}
    assert matches_rule(cells["mlp/scan-off/dropout0/L3"], match) and not matches_rule(cells["mlp/scan-off/none/L2"],
                                                                                       match)


@pytest.mark.parametrize("rule,message", [
    ('[[exclude]]\nscan = true\n', "exclude[0].scan: expected 'on' or 'off' (or a list of them), got True"),
    ('[[exclude]]\nlayers = ["2"]\n', "exclude[0].layers: expected an integer depth in 1..1024"),
    ('[[exclude]]\nmodel = []\n', "exclude[0].model: expected a value or a non-empty list of alternatives"),
    ('[[exclude]]\nmodel = [["mlp"]]\n', "exclude[0].model: expected a non-empty string"),
    ('[[exclude]]\nmodel = {a = 1}\n', "exclude[0].model: expected a non-empty string"),
    ('[[exclude]]\n', "exclude[0]: an empty rule would exclude every cell"),
    ('[[waive]]\nrule = ["count"]\nreason = "x"\n', "waive[0].rule: expected one of count"),
    ('[[waive]]\nrule = "count"\nreason = "x"\nquant = 8\n', "waive[0].quant: expected a non-empty string"),
    ('[[waive]]\nrule = "count"\nreason = "x"\nmodel = "m\\u001b[2J"\n', "waive[0].model: expected a non-empty string"),
    ('[policy]\ncount = ["fail"]\n', "policy.count: expected 'fail', 'warn' or 'off'"),
    ('[overrides.mlp]\nwidth = "8\\u0000"\n', "overrides.mlp.width: contains the control character \\x00"),
    ('[overrides.mlp]\n"w\\nidth" = 8\n', "overrides.mlp.w\\nidth: contains the control character \\n"),
    ('"odd\\u001bkey" = 1\n', "unknown key 'odd\\x1bkey'"),
    ('layers = [1000000000]\n', "layers[0]: 1000000000 layers is deeper than any model (MaxText's deepest has 126); "
                                "at most 1024"),
    ('target = "x:y\\u0007"\n', "target: contains the control character \\x07"),
])
def test_config_values_of_the_wrong_kind_are_errors(tmp_path, rule, message):
    path = tmp_path / "hlo-audit.toml"
    key = rule.split(" ")[0]
    base = "".join(line + "\n" for line in EXAMPLE.splitlines() if not line.startswith(key + " "))
    path.write_text(base + rule)
    one_line(cli("list", "--config", path), str(path), message)


@pytest.mark.maxtext  # needs MaxText (make compat's environment has none)
def test_the_full_depth_error_names_the_config_file(tmp_path):
    path = tmp_path / "hlo-audit.toml"
    path.write_text(EXAMPLE.replace('"mlp"', '"mlp", "wide"').replace("layers = [2, 3]", 'layers = [2, "full"]'))
    one_line(cli("list", "--config", path), f"{path}: models: 'wide': cannot resolve layers 'full': target "
                                            "'hlo_audit.examples.nnx_mlp:lower' does not say the full depth of 'wide'")
    # MaxText's own error for a model it does not know, on one line, naming the file.
    path.write_text('models = ["llama9-1t"]\nquant = ["none"]\nscan = ["off"]\nlayers = ["full"]\n')
    line = one_line(cli("list", "--config", path), f"{path}: models: 'llama9-1t': cannot resolve layers 'full'")
    assert "llama3-8b" in line  # MaxText's list of the models it knows


@pytest.mark.parametrize("args,message", [
    (("--layers", "²"), "--layers expects integers >= 1 or 'full', got '²'"),
    (("--layers", "1000000000"), "--layers 1000000000: deeper than any model"),
    (("--layers", "0"), "--layers expects integers >= 1"),
    (("--shard", "1/1000000000000"), "--shard 1/1000000000000: at most 1024 shards"),
    (("--shard", "²/²"), "--shard expects K/N with 1 <= K <= N, got '²/²'"),
    (("--shard", "3/2"), "--shard expects K/N"),
    (("--only", "model=nomatch"), "--only model=nomatch matched no cell; known values of model: mlp"),
    (("--only", "layers=two"), "--only layers=two matched no cell; known values of layers: 2, 3"),
    (("--only", "scan=true"), "--only scan=true matched no cell; known values of scan: off, on"),
    (("--only", "quant==none"), "--only quant==none matched no cell; known values of quant: dropout0, none"),
    (("--only", "quant=none,quant=int9"), "--only quant=int9 matched no cell; known values of quant"),
    (("--only", "id=mlp/scan-on/none/L9"), "known values of id: mlp/scan-off/dropout0/L2, "),
    (("--only", "target=x"), "known values of target: hlo_audit.examples.nnx_mlp:lower"),
    (("--only", "platform=tpu"), "--only platform=tpu matched no cell; known values of platform: cpu"),
])
def test_a_selection_of_no_cell_and_bad_numbers_are_errors(tmp_path, args, message):
    """`check --only model=nomatch` once passed with 0 cells; `--layers ²` raised ValueError; `--shard 1/10^12`
    a MemoryError."""
    path = tmp_path / "hlo-audit.toml"
    path.write_text(EXAMPLE)
    for command in ("list", "check", "golden"):
        if command == "golden" and args[0] == "--shard":
            continue  # golden update takes no --shard
        argv = ["golden", "update"] if command == "golden" else [command]
        one_line(cli(*argv, "--config", path, *args), message)
    assert not (tmp_path / "golden").exists()


def test_only_values_together_must_match_a_cell_and_repeated_only_options_combine(tmp_path):
    path = tmp_path / "hlo-audit.toml"
    path.write_text(EXAMPLE + '[[exclude]]\nquant = "dropout0"\nlayers = 3\n')
    one_line(cli("list", "--config", path, "--only", "quant=dropout0,layers=3"),
             "--only matched no cell: no cell has quant=dropout0 and layers=3")
    # AND across keys, OR within a key, over every --only given.
    p = plan(str(path), only=["quant=none", "layers=2", "quant=dropout0", "scan=on"])
    assert [c.id for c in p.cells] == ["mlp/scan-on/dropout0/L2", "mlp/scan-on/none/L2"]
    assert [c.id for c in plan(str(path), only=["quant=none,scan=off", "layers=3"]).cells] == ["mlp/scan-off/none/L3"]
    # An empty shard is a fine shard (more shards than series), not an empty selection.
    assert plan(str(path), shard="7/7").cells == [] and len(plan(str(path), shard="1/7").cells) in (1, 2)


def test_a_cell_id_names_its_own_depth(tmp_path):
    """`rng .../L0` once blamed a --layers nobody gave."""
    path = tmp_path / "hlo-audit.toml"
    path.write_text(EXAMPLE)
    for depth, message in [("0", "mlp/scan-off/none/L0: depth L0: expected L1 to L1024"),
                           ("99999999", "depth L99999999: expected L1 to L1024")]:
        line = one_line(cli("rng", f"mlp/scan-off/none/L{depth}", "--config", path), message)
        assert "--layers" not in line
    one_line(cli("rng", "mlp/scan-off/int9/L2", "--config", path), "mlp/scan-off/int9/L2: no such cell in the matrix")
