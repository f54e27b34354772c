"""Config loading and validation, matrix expansion, --only and --shard."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hlo_audit.audit import plan
from hlo_audit.cli import app
from hlo_audit.config import MAXTEXT_QUANTIZATIONS, ConfigError, load_config
from hlo_audit.matrix import MatrixError, select


def test_builtin_default_matrix(tmp_path):
    p = plan(cwd=tmp_path)
    assert p.config.source == "<built-in default>"
    ids = [c.id for c in p.cells]
    assert len(ids) == len(set(ids)) == 3 * 2 * 9 * 2
    assert "llama3-8b/scan-off/int8/L2" in ids
    # Transformer Engine recipes exist only for CUDA, and their ids say so.
    assert "llama3-8b/scan-off/te_nvfp4/L2/cuda" in ids
    assert all(c.platform == "cuda" for c in p.cells if c.quant.startswith("te_"))
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
    assert config.overrides == {}  # the default deepseek override follows the default models only
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
    chosen = select(cells, "model=llama3-8b,quant=int8,scan=off")
    assert [c.id for c in chosen] == ["llama3-8b/scan-off/int8/L2", "llama3-8b/scan-off/int8/L4"]
    assert len(select(cells, "quant=int8,quant=fp8")) == 3 * 2 * 2 * 2
    shards = [select(cells, None, f"{k}/3") for k in (1, 2, 3)]
    assert sorted(c.id for s in shards for c in s) == sorted(c.id for c in cells)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    for bad, message in [("model", "expects key=value"), ("colour=red", "unknown key 'colour'")]:
        with pytest.raises(MatrixError, match=message):
            select(cells, bad)
    with pytest.raises(MatrixError, match="K/N"):
        select(cells, None, "4/3")


def test_layers_option(tmp_path):
    p = plan(only="model=llama3-8b,quant=none,scan=off", layers="2,full", cwd=tmp_path)
    assert [c.layers for c in p.cells] == [2, 32]
    with pytest.raises(MatrixError):
        plan(layers="two", cwd=tmp_path)


def test_known_quantizations_match_maxtext():
    from maxtext.configs.types import QuantizationType

    assert set(MAXTEXT_QUANTIZATIONS) == {q.value or "none" for q in QuantizationType}
