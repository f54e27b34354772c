"""`hlo-audit init`'s workflow and `--set` (issue 26, items 8 and 9).

The workflow is read back as YAML: every job installs the hlo-audit that wrote it (pinned to the same version), and
its shards are dealt by depth series, none empty (one series, one shard). `--set NAME=VALUE` writes the model's
config fields, typed as TOML types them; bad input is one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml

import hlo_audit
from in_process import hlo_audit_here
from nnx_library import write_library

PIN = f'"hlo-audit=={hlo_audit.__version__}"'


@pytest.fixture
def empty(tmp_path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    return folder


@pytest.fixture
def tinylm(tmp_path, monkeypatch) -> Path:
    """The test suite's own model library, imported fresh from this test's copy."""
    site = write_library(tmp_path / "site")
    for name in [m for m in sys.modules if m == "tinylm" or m.startswith("tinylm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(site))
    return site


def one_error_line(result) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def installs(doc: dict) -> list[str]:
    """Every `pip install` line of every job's steps."""
    lines = []
    for job in doc["jobs"].values():
        for step in job["steps"]:
            lines += [line for line in step.get("run", "").splitlines() if "pip install" in line]
    return lines


def shards_listed(folder: Path, shards: int) -> list[list[dict]]:
    """The cells `hlo-audit list --shard K/N` gives for each K: what each of the workflow's check jobs runs."""
    listed = []
    for k in range(1, shards + 1):
        ran = hlo_audit_here(folder, "list", "--format", "json", "--shard", f"{k}/{shards}")
        assert ran.returncode == 0, ran.stderr
        listed.append(json.loads(ran.stdout)["cells"])
    return listed


def test_every_job_installs_the_hlo_audit_that_wrote_the_workflow(empty):
    made = hlo_audit_here(empty, "init", "--callable", "hlo_audit.examples.nnx_mlp:lower", "--model", "mlp",
                          "--no-golden")
    assert made.returncode == 0, made.stderr
    doc = yaml.safe_load((empty / ".github/workflows/hlo-audit.yml").read_text())
    lines = installs(doc)
    check = [line for line in lines if '"jax==' in line]
    merge = [s["run"] for s in doc["jobs"]["merge"]["steps"] if "pip install" in s.get("run", "")]
    assert len(check) == 1 and len(merge) == 1, lines
    # One version, the running one, in both jobs; no other mention of hlo-audit that pip could resolve elsewhere.
    for line in (*check, *merge):
        assert PIN in line, line
        assert re.findall(r"hlo-audit[^\s\"]*", line) == [f"hlo-audit=={hlo_audit.__version__}"], line


def write_target(folder: Path, name: str, scans: list[str]) -> None:
    """A callable target whose function declares the scans it lowers (so the config's series are known)."""
    (folder / f"{name}.py").write_text(textwrap.dedent(f"""\
        def lower(cell):
            raise NotImplementedError  # init never lowers with --no-golden
        lower.scan = {scans!r}
    """))


@pytest.mark.parametrize("scans, models, asked, expect", [
    (["off"], ["m"], None, 1),  # one series: one shard, not the default 2 with one empty
    (["off", "on"], ["a", "b"], "3", 3),  # four series over three shards: none empty, none split
    (["off", "on"], ["a"], "8", 2),
])
def test_shards_are_dealt_by_series_and_none_is_empty(empty, monkeypatch, scans, models, asked, expect):
    name = f"series_target_{len(scans)}_{len(models)}_{asked}"
    write_target(empty, name, scans)
    monkeypatch.syspath_prepend(str(empty))
    args = ["init", "--callable", f"{name}:lower", *[a for m in models for a in ("--model", m)], "--layers", "2,4",
            "--no-golden", *(("--shards", asked) if asked else ())]
    made = hlo_audit_here(empty, *args)
    assert made.returncode == 0, made.stderr
    asked_for = int(asked or 2)
    note = f"note: the workflow checks in {expect} shard{'s' if expect > 1 else ''}, not {asked_for}"
    assert (note in made.stdout) == (expect < asked_for), made.stdout
    doc = yaml.safe_load((empty / ".github/workflows/hlo-audit.yml").read_text())
    assert doc["jobs"]["check"]["strategy"]["matrix"]["shard"] == list(range(1, expect + 1))
    runs = " ".join(s.get("run", "") for s in doc["jobs"]["check"]["steps"])
    assert f"--shard ${{{{ matrix.shard }}}}/{expect} " in runs
    listed = shards_listed(empty, expect)
    assert all(listed), [len(cells) for cells in listed]  # no shard without a cell
    series_of = [{c["id"].rsplit("/L", 1)[0] for c in cells} for cells in listed]
    assert sum(len(s) for s in series_of) == len(set().union(*series_of)) == len(scans) * len(models)
    assert sum(len(cells) for cells in listed) == 2 * len(scans) * len(models)  # both depths of every series


TINY = ("init", "--nnx", "tinylm.model:TinyLM", "--nnx-config", "tinylm.model:ModelConfig.tiny")


def test_set_writes_the_config_fields_typed_and_the_cells_lower_with_them(tinylm, empty):
    made = hlo_audit_here(empty, *TINY, "--set", "embed_dim=48", "--set", "dtype=bfloat16", "--no-golden")
    assert made.returncode == 0, made.stderr
    text = (empty / "hlo-audit.toml").read_text()
    spec = tomllib.loads(text)["nnx"]["models"]["tiny"]
    assert spec["fields"] == {"embed_dim": 48, "dtype": "bfloat16"}
    assert "embed_dim = 48" in text  # an int in the file, not "48"
    lowered = hlo_audit_here(empty, "lower", "tiny/scan-off/none/L2")
    assert lowered.returncode == 0, lowered.stderr[-2000:]
    # The embedding table is vocab x embed_dim: 256 x 48 (parameters stay f32), computed in bf16, as --set said.
    assert "state__model____embed____embedding___value.1 = f32[256,48]{1,0} parameter(0)" in lowered.stdout
    assert "[256,32]" not in lowered.stdout and "bf16[1,128,48]" in lowered.stdout


@pytest.mark.parametrize("extra, message", [
    (("--set", "embed_dim"), "--set expects NAME=VALUE, got 'embed_dim'"),
    (("--set", "embed_dim="), "--set expects NAME=VALUE, got 'embed_dim='"),
    (("--set", "embedding_dim=64"), "init --set: embedding_dim: the object tinylm.model:ModelConfig.tiny returns "
                                    "(ModelConfig) has no field 'embedding_dim' (its fields: num_layers, vocab_size, "
                                    "embed_dim, hidden_dim, scan_layers, dtype)"),
    (("--set", "embed_dim=[64,"), "--set embed_dim=[64,: not a value (an int, float, true/false, or a string"),
    (("--set", 'embed_dim="64'), "--set embed_dim=\"64: not a value"),
    (("--set", "embed_dim=sixty"), 'init --set: embed_dim="sixty": embed_dim holds int (32), not str'),
    (("--set", "embed_dim=64.5"), "init --set: embed_dim=64.5: embed_dim holds int (32), not float"),
    (("--set", "embed_dim=true"), "init --set: embed_dim=true: embed_dim holds int (32), not bool"),
    (("--set", "dtype=bfloat17"), "init --set: dtype=bfloat17: dtype holds a dtype: give one's name (bfloat16, "
                                  "float32)"),
    (("--set", "num_layers=4"), "init --set: num_layers: each cell sets it (--layers, scan): leave it out"),
    (("--set", "scan_layers=true"), "init --set: scan_layers: each cell sets it"),
    (("--set", "embed_dim=64", "--set", "embed_dim=32"), "--set embed_dim: given twice"),
    (("--set", "embed_dim=2026-01-01"), "--set embed_dim=2026-01-01: a date: give an int, float, true/false or a "
                                        "string"),
    (("--set", "embed_dim={a = 1}"), "--set embed_dim={a = 1}: a dict"),
])
def test_set_refuses_bad_input_in_one_line_and_writes_nothing(tinylm, empty, extra, message):
    line = one_error_line(hlo_audit_here(empty, *TINY, *extra, "--no-golden"))
    assert message in line, line
    assert not list(empty.iterdir())


@pytest.mark.parametrize("args, message", [
    (("--nnx", "hlo_audit.examples.nnx_mlp:MLP", "--arg", "width=16", "--arg", "rate=0.0", "--input",
      "x=float32[batch,16]", "--set", "width=32"),
     "init --set: sets fields of the model's config object: give --nnx-config (the callable that returns it), or "
     "--arg for the factory's keyword arguments"),
    (("--callable", "hlo_audit.examples.nnx_mlp:lower", "--model", "mlp", "--set", "width=32"),
     "init --set: a callable target's function builds its model's config itself"),
])
def test_set_where_there_is_no_config_object_says_what_to_use(empty, args, message):
    line = one_error_line(hlo_audit_here(empty, "init", *args, "--no-golden"))
    assert message in line, line
    assert not list(empty.iterdir())


@pytest.mark.maxtext
def test_set_for_maxtext_writes_each_models_overrides_over_the_defaults(empty):
    made = hlo_audit_here(empty, "init", "--maxtext", "--model", "llama3-8b", "--model", "deepseek3-test",
                          "--set", "attention=dot_product", "--set", "max_target_length=64", "--no-golden")
    assert made.returncode == 0, made.stderr
    config = tomllib.loads((empty / "hlo-audit.toml").read_text())
    assert config["overrides"] == {
        "llama3-8b": {"attention": "dot_product", "max_target_length": 64},
        "deepseek3-test": {"first_num_dense_layers": "1", "megablox": "False", "attention": "dot_product",
                           "max_target_length": 64}}
    doc = yaml.safe_load((empty / ".github/workflows/hlo-audit.yml").read_text())
    install = installs(doc)
    assert f'"hlo-audit[maxtext]=={hlo_audit.__version__}"' in install[1] and PIN in install[-1], install
    (empty / "hlo-audit.toml").unlink()
    (empty / ".github/workflows/hlo-audit.yml").unlink()
    line = one_error_line(hlo_audit_here(empty, "init", "--maxtext", "--set", "atention=dot_product", "--no-golden"))
    assert line.startswith("hlo-audit: error: init --set atention: MaxText's config has no key 'atention'"), line


# --------------------------------------------------------------------------------------------------------------
# TOML strings (issue 34): every control character escaped, by the one writer every scaffold uses
# --------------------------------------------------------------------------------------------------------------


def test_every_string_is_written_as_toml_reads_it_back():
    """Every code point below U+00A0 (C0, DEL, C1), quotes, backslashes, a line separator and non-ASCII text: written
    by ``toml_value`` (keys by ``toml_key``), read back by tomllib as they were. JSON's escapes alone left DEL raw:
    ``TOMLDecodeError: Illegal character '\\x7f'``."""
    from hlo_audit.scaffold.base import toml_key, toml_value

    texts = [chr(n) for n in range(0xA0)] + ['a"b\\c', "a\x7fb", "x\u2028y", "héllo wörld", "\t\n\r"]
    for text in texts:
        assert tomllib.loads(f"v = {toml_value(text)}")["v"] == text, repr(text)
        assert tomllib.loads(f"{toml_key(text)} = 1") == {text: 1}, repr(text)
    nested = {"k": ["a\x7fb"]}
    assert tomllib.loads("v = " + toml_value(nested))["v"] == nested


def test_a_string_that_is_not_utf8_is_one_line_and_nothing_written(empty):
    from hlo_audit.scaffold.base import toml_value
    from hlo_audit.usage import InputError

    with pytest.raises(InputError, match=r"init: 'a\\udcffb' is not UTF-8 text"):
        toml_value("a\udcffb")


@pytest.mark.parametrize("model", ["m\x7fx", "m\x85x"])
def test_a_control_character_in_an_option_is_one_line_and_nothing_written(empty, model):
    """The config init would write holds the model's name escaped, so validation reads it and refuses it by name
    (before: a TOMLDecodeError traceback for DEL)."""
    line = one_error_line(hlo_audit_here(empty, "init", "--callable", "hlo_audit.examples.nnx_mlp:lower", "--model",
                                         model, "--no-golden"))
    assert line.startswith("hlo-audit: error: init: the config it would write is refused: hlo-audit.toml: "
                           "models[0]:") and "contains the control character" in line, line
    assert not list(empty.iterdir())


@pytest.mark.maxtext
def test_set_with_a_control_character_for_maxtext_is_one_line(empty):
    """The issue's case: `init --set 'run_name="a\\u007fb"'` wrote DEL raw and read it back: a traceback."""
    line = one_error_line(hlo_audit_here(empty, "init", "--maxtext", "--set", 'run_name="a\\u007fb"', "--no-golden"))
    assert "overrides.llama3-8b.run_name: contains the control character \\x7f" in line, line
    assert not list(empty.iterdir())


def test_set_with_a_raw_control_character_names_it(empty):
    """`init --set 'name="a<DEL>b"'` (the issue's case, the character raw): one line naming the character, not "not
    a value", and nothing written."""
    line = one_error_line(hlo_audit_here(empty, "init", "--callable", "hlo_audit.examples.nnx_mlp:lower", "--set",
                                         'name="a\x7fb"', "--no-golden"))
    assert line == "hlo-audit: error: --set name: the value contains the control character \\x7f; a config's values hold none", line
    assert not list(empty.iterdir())
