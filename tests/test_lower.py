"""`hlo-audit lower CELL [-o FILE]`: a cell's module exactly as hlo-audit lowered and cached it, so that
`hlo-audit diff golden/<cell>.hlo.txt FILE` is the review step for any target; and a module read from XLA's own
dump of the same step reads identical to it (the header's SPMD flags of a one-partition module say nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hlo_audit.cache import Cache
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.text import parse_module
from in_process import Ran, hlo_audit_here
from projects import config
from xla_oracle import our_counts, xla_counts

REPO = Path(__file__).resolve().parents[1]
CONFIG = config(quant=["none", "dropout0", "int8"], layers=[2, 3])


def hlo_audit(folder: Path, *args: str, env: dict | None = None) -> Ran:
    return hlo_audit_here(folder, *args, env=env)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lower")
    (folder / "hlo-audit.toml").write_text(CONFIG)
    update = hlo_audit(folder, "golden", "update")
    assert update.returncode == 0, update.stderr
    return folder


def test_lower_writes_the_cached_module_and_diff_against_its_golden_is_the_review_step(project):
    cell = "mlp/scan-off/dropout0/L2"
    out = hlo_audit(project, "lower", cell, "-o", "lowered.hlo.txt")
    assert out.returncode == 0 and out.stdout == "", out.stderr
    text = (project / "lowered.hlo.txt").read_text()
    # Exactly the text the cache holds for the cell (what every count and the golden came from).
    run = json.loads(hlo_audit(project, "run", "--only", f"id={cell}", "--format", "json").stdout)
    cached = [Cache(project / ".hlo-audit-cache").hlo_text(key) for key in _keys(project)]
    assert text in cached and run["cells"][0]["entry_params"] == analyze(text, cell).summary.entry_params == 9
    # XLA's own parser reads it as hlo-audit does (it is XLA's printer's text, not the canonical one).
    assert xla_counts(text)["entry_params"] == our_counts(text)["entry_params"] == 9
    # Against its golden: the same module.
    same = hlo_audit(project, "diff", f"golden/{cell}.hlo.txt", "lowered.hlo.txt")
    assert same.returncode == 0 and same.stdout.startswith("verdict: identical-after-normalization"), same.stdout
    # Against another cell's golden (no dropout): the verdict names the RNG state, exit 1.
    other = hlo_audit(project, "diff", "golden/mlp/scan-off/none/L2.hlo.txt", "lowered.hlo.txt")
    assert other.returncode == 1 and other.stdout.startswith("verdict: rng-state-only"), other.stdout
    # To stdout, the same text; --normalized: the golden's canonical text byte for byte (a plain `diff` reads it).
    assert hlo_audit(project, "lower", cell).stdout == text
    canonical = hlo_audit(project, "lower", cell, "--normalized")
    assert canonical.stdout == (project / "golden" / f"{cell}.hlo.txt").read_text()
    # Any depth of a configured series, lowered now when it is not in the cache (and the same with --no-cache).
    deep = hlo_audit(project, "lower", "mlp/scan-off/dropout0/L5")
    assert deep.returncode == 0 and analyze(deep.stdout, "L5").summary.entry_params == 5 * 4 + 1
    assert hlo_audit(project, "lower", "mlp/scan-off/dropout0/L5", "--no-cache").stdout == deep.stdout


def _keys(project: Path) -> list[str]:
    return [p.name.removesuffix(".lowering.json") for p in (project / ".hlo-audit-cache").rglob("*.lowering.json")]


@pytest.mark.parametrize("args, code, message", [
    (("mlp/scan-off/none/L9x",), 2, "is neither a file nor a cell id"),
    (("mlp/scan-off/fp8/L2",), 2, "mlp/scan-off/fp8/L2: no such cell in the matrix of hlo-audit.toml"),
    (("mlp/scan-off/int8/L2",), 1, "mlp/scan-off/int8/L2: unavailable: nnx_mlp has no quantization 'int8'"),
    (("mlp/scan-off/none/L2", "-o", "."), 2, "--output"),
])
def test_lower_errors_are_one_line(project, args, code, message):
    result = hlo_audit(project, "lower", *args)
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""


def test_a_dump_of_the_same_step_reads_identical_to_its_golden(project):
    """XLA's `--xla_dump_to` module before optimizations carries PJRT's compile options in its header
    (allow_spmd_sharding_propagation_to_parameters/_to_output, one flag per parameter and output), which jax's
    lowering has not: before the fix `diff` called the same step `changed (attributes)`, two header lines as long
    as the parameter list. (The step without RNG state: a step that splits RNG keys carries Sharding custom-calls,
    which XLA's compile rewrites from Shardy's form; there a dump differs in more than its header, and `lower` is
    the module to diff.)"""
    dump = project / "dump"
    script = textwrap.dedent("""
        from hlo_audit.examples.nnx_mlp import lower
        from hlo_audit.matrix import Cell
        lower(Cell(model="mlp", scan=False, quant="none", layers=2, target="x")).lower(
            lowering_platforms=("cpu",)).compile()
        """)
    made = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}",
                               "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert made.returncode == 0, made.stderr[-2000:]
    (before,) = dump.glob("*jit_train_step.before_optimizations.txt")
    header = before.read_text().splitlines()[0]
    assert "allow_spmd_sharding_propagation_to_parameters={true,true," in header  # what the dump adds
    assert "allow_spmd" not in (project / "golden/mlp/scan-off/none/L2.hlo.txt").read_text()
    result = hlo_audit(project, "diff", "golden/mlp/scan-off/none/L2.hlo.txt", str(dump))
    assert result.returncode == 0 and result.stdout.startswith("verdict: identical-after-normalization"), \
        result.stdout[:3000]


def test_the_spmd_flags_stay_where_the_module_is_partitioned():
    """Four partitions (a TPU v6e-4 module): sharding propagation runs and the flags say which arguments it may
    reshard, so the canonical text keeps them (the committed TPU goldens are canonical as they are)."""
    golden = REPO / "golden/llama3-8b/scan-on/none/L4/tpu-v6e-4/optimized.hlo.txt"
    text = golden.read_text()
    assert "num_partitions=4" in text.splitlines()[0] and "allow_spmd_sharding_propagation_to_output={false," in text
    assert analyze(text, str(golden)).normalized == text
    one = "HloModule m, allow_spmd_sharding_propagation_to_output={true}\n\nENTRY %e (p: f32[2]) -> f32[2] {\n" \
          "  ROOT %p = f32[2]{0} parameter(0)\n}\n"
    assert "allow_spmd" not in analyze(one, "one").normalized
    assert parse_module(one).header_attrs["allow_spmd_sharding_propagation_to_output"] == "{true}"
    four = one.replace("HloModule m,", "HloModule m, num_partitions=4,")
    assert "allow_spmd_sharding_propagation_to_output={true}" in analyze(four, "four").normalized
