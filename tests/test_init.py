"""`hlo-audit init`: a user's repository under the gate in one command.

The acceptance test of issue 21: in an empty folder with an NNX model library installed, `init` gives a config, a
workflow and goldens; `check` passes there, and fails once the library's model gains a per-layer Dropout(0.0).
Run on a library written into the test's folder (tests/nnx_library.py) and on google-tunix's Qwen3 (a copy of the
installed package, edited as a contributor would). The workflow is read back as YAML and its commands run here:
the shards and the merge give the check's verdict.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hlo_audit.cli import app
from in_process import Ran, hlo_audit_here
from nnx_library import add_layer_dropout, write_library

REPO = Path(__file__).resolve().parents[1]


def hlo_audit(folder: Path, *args: str, pythonpath: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    """A process of its own, with ``pythonpath`` (a library's folder) first: the library is imported anew by every
    command, as a user's runs import it after an edit."""
    path = os.pathsep.join([*map(str, pythonpath), str(REPO), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path}, timeout=900)


def one_error_line(result: subprocess.CompletedProcess | Ran) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture
def library(tmp_path) -> Path:
    return write_library(tmp_path / "site")


@pytest.fixture
def empty(tmp_path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    return folder


def test_init_gives_config_workflow_and_goldens_and_check_fails_on_a_layer_dropout(library, empty, monkeypatch):
    """Before the library changes, the commands run in this process with the test's own copy of the library
    imported; after the edit, each in a process of its own that imports the edited library anew, as a user's CI
    does."""
    for name in [m for m in sys.modules if m == "tinylm" or m.startswith("tinylm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(library))
    made = hlo_audit_here(empty, "init", "--nnx", "tinylm.model:TinyLM", "--nnx-config",
                          "tinylm.model:ModelConfig.tiny")
    assert made.returncode == 0, made.stderr[-3000:]
    assert made.stdout.splitlines()[:3] == ["wrote hlo-audit.toml", "wrote .github/workflows/hlo-audit.yml",
                                            "note: .hlo-audit-cache/ will hold the lowering cache: add it to "
                                            ".gitignore"]
    # The config, read off the model: depth field, scan switch, the call's token ids as labels.
    config = tomllib.loads((empty / "hlo-audit.toml").read_text())
    assert config["target"] == "nnx" and config["models"] == ["tiny"] and config["layers"] == [2, 4]
    assert config["nnx"]["models"]["tiny"] == {
        "model": "tinylm.model:TinyLM", "config": "tinylm.model:ModelConfig.tiny", "layers": "num_layers",
        "scan": "scan_layers", "rngs": "rngs", "inputs": {"tokens": "int32[batch,seq]"}, "labels": "tokens"}
    assert config["nnx"]["optimizer"] == "adamw"
    # Goldens for every cell: scan on and off (the model has the switch), depths 2 and 4.
    goldens = sorted(str(p.relative_to(empty / "golden")) for p in (empty / "golden").rglob("*.json"))
    assert goldens == [f"tiny/scan-{s}/none/L{d}.json" for s in ("off", "on") for d in (2, 4)]
    assert (empty / "golden/tiny/scan-off/none/L2.hlo.txt").is_file()
    _workflow_is_sharded_and_merged(empty / ".github/workflows/hlo-audit.yml", shards=2)

    passed = hlo_audit_here(empty, "check")
    assert passed.returncode == 0, passed.stdout[-3000:]
    assert "hlo-audit check passed: 4 cells: 4 ok" in passed.stdout
    # The workflow's own commands, run here: each shard's JSON, then the merge.
    _shards_and_merge(empty, 2, expect=0, check=hlo_audit_here)

    add_layer_dropout(library)  # the library's model changes; the cache is warm from the runs above
    failed = hlo_audit(empty, "check", pythonpath=(library,))
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert "hlo-audit check FAILED: 4 cells: 4 regression" in failed.stdout
    assert "state.model.layers.*.dropout.rngs.* (rng_count +2, rng_key +2)" in failed.stdout
    assert "RNG parameters grow by 2 per layer in an unrolled model" in failed.stdout
    _shards_and_merge(empty, 2, expect=1, check=lambda folder, *args: hlo_audit(folder, *args, pythonpath=(library,)))

    again = one_error_line(hlo_audit_here(empty, "init", "--nnx", "tinylm.model:TinyLM"))
    assert again == (f"hlo-audit: error: init: hlo-audit.toml, .github/workflows/hlo-audit.yml, golden/ already "
                     f"there in {empty}: init writes only what is not (edit the config by hand, or remove them first)")


def _workflow_is_sharded_and_merged(path: Path, shards: int) -> dict:
    doc = yaml.safe_load(path.read_text())
    check, merge = doc["jobs"]["check"], doc["jobs"]["merge"]
    assert check["strategy"]["matrix"]["shard"] == list(range(1, shards + 1))
    assert check["strategy"]["fail-fast"] is False
    runs = [s.get("run", "") for s in check["steps"]]
    assert any(f"hlo-audit check --shard ${{{{ matrix.shard }}}}/{shards} --format json" in r for r in runs), runs
    cache = next(s for s in check["steps"] if s.get("uses", "").startswith("actions/cache"))["with"]
    assert cache["path"].split() == [".hlo-audit-cache", "~/.cache/hlo-audit"]  # the entries and the key marking them
    # Per shard, per commit (it rotates), restored from any earlier run of the shard (entries verify themselves).
    assert "${{ matrix.shard }}" in cache["key"] and cache["key"].endswith("${{ github.sha }}")
    assert cache["restore-keys"].strip() == cache["key"].removesuffix("${{ github.sha }}")
    assert merge["needs"] == "check" and merge["if"] == "always()"
    assert any("hlo-audit merge shard-*.json" in s.get("run", "") for s in merge["steps"])
    install = next(s for s in check["steps"] if s.get("name") == "Install")["run"]
    assert 'pip install "hlo-audit==' in install and '"jax==' in install and '"flax==' in install
    return doc


def _shards_and_merge(folder: Path, shards: int, expect: int, check) -> None:
    """Each shard's check (run by ``check``), then the merge (in this process: it reads the shards' JSON)."""
    reports, texts = [], []
    for k in range(1, shards + 1):
        shard = check(folder, "check", "--shard", f"{k}/{shards}", "--format", "json")
        assert shard.returncode in (0, 1), shard.stderr[-2000:]
        texts.append(shard.stdout)
        reports.append(f"shard-{k}.json")
    # Written once every shard ran: a report left in the project folder is a file of the tree the next shard judges
    # (as each CI job's checkout holds its own report only).
    for report, text in zip(reports, texts):
        (folder / report).write_text(text)
    merged = hlo_audit_here(folder, "merge", *reports, "--junit", "hlo-audit.xml")
    assert merged.returncode == expect, merged.stdout[-2000:]
    for report in [*reports, "hlo-audit.xml"]:
        (folder / report).unlink()


@pytest.mark.tunix
@pytest.mark.xdist_group("tunix")
@pytest.mark.long  # make test's 15 minutes: test_nnx_target audits tunix's models in make test
def test_init_on_tunix_qwen3_and_check_fails_after_its_decoder_layer_gains_a_dropout(tmp_path, empty):
    """google-tunix's own Qwen3, from a copy of the installed package (so the edit is the library's source, as a
    contributor's branch would change it), described by init from its signatures and a forward pass."""
    import tunix

    site = tmp_path / "tunix-copy"
    shutil.copytree(Path(tunix.__file__).parent, site / "tunix", ignore=shutil.ignore_patterns("__pycache__"))
    made = hlo_audit(empty, "init", "--nnx", "tunix.models.qwen3.model:Qwen3", "--nnx-config",
                     "tunix.models.qwen3.model:ModelConfig.qwen3_0p6b", pythonpath=(site,))
    assert made.returncode == 0, made.stderr[-3000:]
    spec = tomllib.loads((empty / "hlo-audit.toml").read_text())["nnx"]["models"]["qwen3_0p6b"]
    assert spec["inputs"] == {"input_tokens": "int32[batch,seq]", "positions": "int32[batch,seq]", "cache": "none",
                              "attention_mask": "bool[batch,seq,seq]"}
    assert spec["labels"] == "input_tokens" and spec["output"] == 0 and "scan" not in spec  # tunix has no scan
    install = yaml.safe_load((empty / ".github/workflows/hlo-audit.yml").read_text())["jobs"]["check"]["steps"]
    assert '"google-tunix==' in next(s for s in install if s.get("name") == "Install")["run"]
    assert hlo_audit(empty, "check", pythonpath=(site,)).returncode == 0

    model = site / "tunix/models/qwen3/model.py"
    source = model.read_text()
    anchor_init = "    self.post_attention_layernorm = RMSNorm(\n"
    anchor_call = "    outputs = residual + outputs\n"
    assert source.count(anchor_init) == 1 and source.count(anchor_call) == 1
    model.write_text(source.replace(anchor_init, "    self.dropout = nnx.Dropout(0.0, rngs=rngs)\n" + anchor_init)
                     .replace(anchor_call, "    outputs = self.dropout(outputs)\n" + anchor_call))
    failed = hlo_audit(empty, "check", pythonpath=(site,))
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert "state.model.layers.*.dropout.rngs.* (rng_count +2, rng_key +2)" in failed.stdout
    assert "RNG parameters grow by 2 per layer in an unrolled model" in failed.stdout


def test_init_for_a_callable_target(empty):
    made = hlo_audit_here(empty, "init", "--callable", "hlo_audit.examples.nnx_mlp:lower", "--model", "mlp",
                          "--layers", "2,3")
    assert made.returncode == 0, made.stderr[-2000:]
    config = tomllib.loads((empty / "hlo-audit.toml").read_text())
    assert config == {"target": "hlo_audit.examples.nnx_mlp:lower", "models": ["mlp"], "layers": [2, 3],
                      "quant": ["none"]}
    checked = hlo_audit_here(empty, "check", "--format", "json")
    assert checked.returncode == 0 and json.loads(checked.stdout)["totals"]["cells_by_verdict"] == {"ok": 4}


@pytest.mark.maxtext  # needs MaxText (make compat's environment has none)
def test_init_for_a_maxtext_checkout_installs_the_checkout_over_the_release(empty):
    """A MaxText contributor's tree: the config names their models, the workflow installs MaxText's release with
    what its train step imports, then their checkout over it (--no-deps), so the gate lowers their branch."""
    (empty / "pyproject.toml").write_text('[project]\nname = "maxtext"\nversion = "0.2.5"\n')
    (empty / ".gitignore").write_text("build/\n.hlo-audit-cache/\n")
    made = hlo_audit_here(empty, "init", "--maxtext", "--model", "llama3-8b", "--quant", "none,int8", "--no-golden")
    assert made.returncode == 0, made.stderr
    assert "note: .hlo-audit-cache/" not in made.stdout  # the cache is ignored already
    assert made.stdout.splitlines()[-1].startswith("next: hlo-audit golden update")
    config = tomllib.loads((empty / "hlo-audit.toml").read_text())
    assert {k: config[k] for k in ("target", "models", "quant", "layers")} == {
        "target": "maxtext", "models": ["llama3-8b"], "quant": ["none", "int8"], "layers": [2, 4]}
    install = next(s for s in yaml.safe_load((empty / ".github/workflows/hlo-audit.yml").read_text())["jobs"]
                   ["check"]["steps"] if s.get("name") == "Install")["run"].splitlines()
    install = [line for line in install if not line.startswith("#")]  # where hlo-audit came from, if no runner can
    assert install[1].startswith('pip install "hlo-audit[maxtext]==') and '"maxtext==' in install[1]
    assert install[2].startswith("pip install --no-deps -e .")
    listed = hlo_audit_here(empty, "list", "--format", "json")
    assert len(json.loads(listed.stdout)["cells"]) == 8 and not (empty / "golden").exists()


def test_init_nnx_asks_for_what_it_cannot_read_off_the_model(empty):
    """The example MLP takes a width and a float input: init says which option settles each, then describes it
    (mean-square loss: no token ids to predict)."""
    args = ["init", "--nnx", "hlo_audit.examples.nnx_mlp:MLP", "--no-golden"]
    assert "init --arg: hlo_audit.examples.nnx_mlp:MLP needs 'width': give --arg width=VALUE" in \
        one_error_line(hlo_audit_here(empty, *args))
    assert "init --input: cannot tell what hlo_audit.examples.nnx_mlp:MLP's call takes as 'x'" in \
        one_error_line(hlo_audit_here(empty, *args, "--arg", "width=16", "--arg", "rate=0.0"))
    assert not list(empty.iterdir())  # nothing written while it asks
    made = hlo_audit_here(empty, *args, "--arg", "width=16", "--arg", "rate=0.0", "--input", "x=float32[batch,16]",
                          "--model", "mlp")
    assert made.returncode == 0, made.stderr
    spec = tomllib.loads((empty / "hlo-audit.toml").read_text())["nnx"]["models"]["mlp"]
    assert spec == {"model": "hlo_audit.examples.nnx_mlp:MLP", "layers": "layers", "scan": "scan", "rngs": "rngs",
                    "args": {"width": 16, "rate": 0.0}, "inputs": {"x": "float32[batch,16]"}}
    run = hlo_audit_here(empty, "run", "--format", "json", "--only", "layers=2")
    assert run.returncode == 0 and {c["status"] for c in json.loads(run.stdout)["cells"]} == {"ok"}


@pytest.mark.parametrize("setup, args, message", [
    (None, ("init",), "init: name the target: one of --nnx package.module:Factory, --callable"),
    (None, ("init", "--maxtext", "--callable", "a:b"), "init: name the target: one of"),
    ("hlo-audit.toml", ("init", "--maxtext"), "init: hlo-audit.toml already there in"),
    ("golden/", ("init", "--maxtext"), "init: golden/ already there in"),
    ("pyproject", ("init", "--maxtext"), "init: pyproject.toml [tool.hlo-audit] already there in"),
    (None, ("init", "--callable", "hlo_audit.examples.nnx_mlp:lower"), "init --callable: name the models"),
    (None, ("init", "--callable", "hlo_audit.examples.nnx_mlp:lowr", "--model", "m"),
     "init: the config it would write is refused: hlo-audit.toml: target: target "
     "'hlo_audit.examples.nnx_mlp:lowr': 'lowr' is not a callable"),
    (None, ("init", "--nnx", "nowhere.model:Model"), "init --nnx: 'nowhere.model:Model': cannot import 'nowhere.model'"),
    (None, ("init", "--maxtext", "--layers", "2,x"), "--layers expects integers >= 1 or 'full', got 'x'"),
    (None, ("init", "--maxtext", "--layers", "full"), "init --layers: give depths such as 2,4"),
    (None, ("init", "--maxtext", "--quant", "int9"), "quant[0]: unknown quantization 'int9'"),
])
def test_init_refuses_in_one_line_and_writes_nothing(empty, setup, args, message):
    before = {"hlo-audit.toml": "models = ['x']\n", "golden/": None,
              "pyproject": '[project]\nname = "x"\n[tool.hlo-audit]\nmodels = ["x"]\n'}
    if setup == "golden/":
        (empty / "golden").mkdir()
    elif setup:
        (empty / ("pyproject.toml" if setup == "pyproject" else setup)).write_text(before[setup])
    existing = sorted(p.name for p in empty.iterdir())
    line = one_error_line(hlo_audit_here(empty, *args))
    assert message in line, line
    assert sorted(p.name for p in empty.iterdir()) == existing


# Every path init would write is checked before any is (issue 27: tracebacks, and hlo-audit.toml left behind). These
# refusals come before any target is imported: run in this process.
CALLABLE = ("init", "--callable", "hlo_audit.examples.nnx_mlp:lower", "--model", "mlp")
IN_THE_WAY = {
    ".github is a file": (".github", "file", "init: .github is not a folder, where init writes "
                                             ".github/workflows/hlo-audit.yml; nothing was written"),
    ".github links nowhere": (".github", "dangling", "init: .github is not a folder, where init writes "
                                                     ".github/workflows/hlo-audit.yml; nothing was written"),
    "hlo-audit.toml links nowhere": ("hlo-audit.toml", "dangling", "init: hlo-audit.toml already there in "),
    "the cache folder is a file": (".hlo-audit-cache", "file", "init: .hlo-audit-cache is not a folder, where init's "
                                                               "golden update writes; nothing was written"),
}


def init_here(folder: Path, monkeypatch, *args: str):
    monkeypatch.chdir(folder)
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("case", IN_THE_WAY)
def test_init_checks_every_path_before_writing_any(empty, monkeypatch, case):
    name, kind, message = IN_THE_WAY[case]
    if kind == "file":
        (empty / name).write_text("a file\n")
    else:
        (empty / name).symlink_to("nowhere")
    result = init_here(empty, monkeypatch, *CALLABLE)
    lines = result.stderr.splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"hlo-audit: error: {message}"), (
        result.exit_code, result.output)
    assert [p.name for p in empty.iterdir()] == [name]


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` where no file can be created, for whoever runs the tests: mode 0555, and for root (whom modes do
    not stop) the immutable attribute; skipped where neither can be set."""
    mode = folder.stat().st_mode
    folder.chmod(0o555)
    immutable = False
    try:
        if os.access(folder, os.W_OK) and shutil.which("chattr"):
            immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        if os.access(folder, os.W_OK):
            pytest.skip("no way to make a folder read-only here")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(mode)


@pytest.mark.parametrize("where", [".", ".github"])
def test_init_in_a_read_only_folder_is_one_line_and_writes_nothing(empty, monkeypatch, where):
    (empty / ".github").mkdir()
    with read_only(empty / where):
        result = init_here(empty, monkeypatch, *CALLABLE)
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1, result.output
    line = result.stderr.strip()
    target = "hlo-audit.toml" if where == "." else ".github/workflows/hlo-audit.yml"
    assert line == (f"hlo-audit: error: init: cannot create {target} in {empty if where == '.' else where}: "
                    "permission denied (a read-only folder or filesystem); nothing was written")
    assert [p.name for p in empty.iterdir()] == [".github"] and not any((empty / ".github").iterdir())
