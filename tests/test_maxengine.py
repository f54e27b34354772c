"""MaxText 0.2.5's inference steps (MaxEngine prefill / generate / insert), lowered on this CPU from abstract
shapes: llama3-8b, 2 layers, batch 1, prefill 64, target 128, one device. The numbers are issue 13's.

One matrix run, shared by every test here: unrolled unquantized, int8 and int8 in AQT's serve mode, and
scanned int8, each step. It runs in one process so a config's engine is built once for its three steps.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest

from hlo_audit.cache import Cache, entry_files
from in_process import Ran, hlo_audit_here

# Long (`make test-long`, a CI step of its own): building one engine per config is a minute of lowering, the largest
# single setup of the suite; `make audit` and `golden update` check the same generate cells against their goldens.
pytestmark = [pytest.mark.maxtext, pytest.mark.long, pytest.mark.xdist_group("maxengine")]

ROOT = Path(__file__).resolve().parents[1]
STEPS = '["prefill", "generate", "insert"]'
CONFIG = f"""
models = ["llama3-8b"]
scan = ["off"]
quant = ["none", "int8"]
layers = [2]
step = {STEPS}
golden_dir = "{ROOT / 'golden'}"

[[matrix]]
quant = ["int8"]
quant_mode = "serve"
step = {STEPS}

[[matrix]]
quant = ["int8"]
scan = ["on"]
step = {STEPS}
"""


def hlo_audit(project: Path, *args, env: dict | None = None) -> Ran:
    """The CLI in this process (tests/in_process.py), 200 columns wide."""
    return hlo_audit_here(project, *args, env={"COLUMNS": "200", **(env or {})})


@pytest.fixture(scope="session")
def engine_cells(tmp_path_factory, worker_id):
    """The run, once per pytest run. pytest 9 ignores xdist_group (xdist 3.8 renames items through a node id
    pytest no longer reads), so both workers may get tests of this module: the first lowers, the other waits
    on a lock and reads every cell from the cache they share."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    project = shared / "maxengine"
    with open(shared / "maxengine.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        project.mkdir(exist_ok=True)
        (project / "hlo-audit.toml").write_text(CONFIG)
        proc = hlo_audit(project, "run", "--format", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return project, {c["id"]: c for c in json.loads(proc.stdout)["cells"]}


def cell(mode: str, step: str, scan: str = "off") -> str:
    return f"llama3-8b/scan-{scan}/{mode}/L2/{step}"


# Issue 13's table: entry parameters by dtype, per step and mode.
TABLE = {
    ("none", "off"): ({"f32": 21, "s32": 2}, {"f32": 21, "bf16": 8, "s32": 11}, {"s32": 17, "bf16": 12, "f32": 4}),
    ("int8", "off"): ({"f32": 21, "s32": 2}, {"f32": 21, "bf16": 8, "s32": 11}, {"s32": 17, "bf16": 12, "f32": 4}),
    ("int8-serve", "off"): ({"f32": 7, "s32": 2}, {"f32": 7, "bf16": 8, "s32": 11}, {"s32": 17, "bf16": 12, "f32": 4}),
    ("int8", "on"): ({"f32": 12, "s32": 2}, {"f32": 12, "bf16": 4, "s32": 7}, {"s32": 12, "bf16": 6, "f32": 4}),
}


def test_entry_parameters_reproduce_the_measured_table(engine_cells):
    _, cells = engine_cells
    for (mode, scan), row in TABLE.items():
        for step, by_dtype in zip(("prefill", "generate", "insert"), row):
            c = cells[cell(mode, step, scan)]
            assert c["status"] == "ok", c["message"]
            assert c["by_dtype"] == by_dtype, c["id"]
            assert c["entry_params"] == sum(by_dtype.values())
            assert c["rng_params"] == 0  # MaxEngine passes no RNG state in: it closes over it


def test_serve_mode_captures_the_quantized_weights_with_their_bytes(engine_cells):
    _, cells = engine_cells
    for step in ("prefill", "generate"):
        captured = cells[cell("int8-serve", step)]["constants"]["captured"]
        # 7 quantized dots x 2 layers: an int8 kernel and a bf16 scale each, and each dot's RNG stream.
        assert captured["by_dtype"] == {"u32": 28, "bf16": 14, "s8": 14}
        assert captured["bytes_by_dtype"] == {"bf16": 172_032, "s8": 436_207_616, "u32": 168}
        assert captured["groups"]["model.decoder.layers_*.mlp.wi_0.AqtDotGeneral_0.qrhs.frozen.qvalue"] == 2
        wi_0 = next(a for a in captured["arrays_list"]
                    if a["path"] == "model.decoder.layers_0.mlp.wi_0.AqtDotGeneral_0.qrhs.frozen.qvalue")
        assert (wi_0["dtype"], wi_0["dims"], wi_0["bytes"], wi_0["role"]) == ("s8", [4096, 14336], 58_720_256, "weight")
    # Quantizing on every call (train mode), the dots keep full-precision kernels as parameters: only their
    # RNG streams are captured. Unquantized, nothing that the step reads is.
    assert cells[cell("int8", "prefill")]["constants"]["captured"]["by_dtype"] == {"u32": 28}
    assert cells[cell("none", "generate")]["constants"]["captured"]["arrays"] == 0
    # Placeholder weights (a model not loaded from a checkpoint) are equal splats: the module holds five
    # state-sized int8 broadcasts (one per shape) where a real checkpoint's would be fourteen literals.
    large = cells[cell("int8-serve", "prefill")]["constants"]["large"]
    assert [(c["form"], c["dtype"], c["value"]) for c in large] == [("broadcast", "s8", "0")] * 5


def test_rng_says_the_keys_are_literals_in_every_mode(engine_cells):
    project, _ = engine_cells
    expected = {("none", "off"): 0, ("int8", "off"): 14, ("int8-serve", "off"): 14, ("int8", "on"): 14}
    for (mode, scan), keys in expected.items():
        proc = hlo_audit(project, "rng", cell(mode, "generate", scan), "--format", "json")
        frozen = json.loads(proc.stdout)["frozen"]
        assert frozen["literal_keys"] == keys, (mode, scan)
        assert sum(frozen["captured_streams"].values()) == keys
        # AQT's dots fold and split their literal key, and nothing in an inference step reads the bits.
        assert frozen["used"] == 0
    # Scanned, one u32[2, 2] literal holds both layers' keys of a dot, reaching random bits inside the loop.
    proc = hlo_audit(project, "rng", cell("int8", "prefill", "on"))
    out = " ".join(proc.stdout.split())
    assert ("14 RNG keys are literals in the program: a literal key never advances; 14 only feed random bits no "
            "output reads (dead RNG state, baked in)") in out
    assert "model.decoder.layers.mlp.wi_0.AqtDotGeneral_0.to_nnx__rngs.* 2" in out


def test_explain_and_report_show_what_serve_mode_bakes_in(engine_cells):
    project, _ = engine_cells
    proc = hlo_audit(project, "explain", cell("int8-serve", "prefill"), "--format", "json")
    doc = json.loads(proc.stdout)
    assert doc["tree"]["params"] == 9
    families = {c["name"]: c for c in doc["captured_tree"]["children"]}
    assert families["model.decoder.layers_*.*.qvalue"]["by_dtype"] == {"s8": 14}
    assert families["model.decoder.layers_*.*.scale.0"]["bytes"] == 172_032
    report = hlo_audit(project, "report", "--only", "quant_mode=serve,step=prefill")
    out = " ".join(report.stdout.split())
    assert "state baked in as constants" in out
    assert "llama3-8b/scan-off/int8-serve/L2/prefill 56 416.2 MiB u32:28 bf16:14 s8:14 5 14 0" in out


def test_committed_inference_goldens_pass_the_gate(engine_cells):
    """The repository's goldens of the default matrix's inference cells that the run above lowered."""
    project, _ = engine_cells
    proc = hlo_audit(project, "check", "--only", "step=prefill,step=generate", "--format", "json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, [f for f in doc["findings"] if f["severity"] in ("regression", "error")]
    verdicts = {f["cell"]: f["severity"] for f in doc["findings"] if f["severity"] != "stale"}  # train goldens
    assert len(verdicts) == 8 and set(verdicts.values()) == {"ok"}


def test_moving_the_rest_state_into_the_arguments_shows_in_the_gate_and_in_diff(engine_cells, tmp_path):
    """As the train step takes its state: fewer captured constants, more entry parameters, with paths."""
    project, _ = engine_cells
    serve_prefill = cell("int8-serve", "prefill")
    golden = project / f"golden-{tmp_path.name}"  # written inside the project that writes it (issue 37)
    assert hlo_audit(project, "golden", "update", "--only", f"id={serve_prefill}",
                     "--config", str(_config(project, golden, "maxtext", project / ".hlo-audit-cache"))).returncode == 0
    injected = _config(tmp_path, golden, "injected_maxtext:lower", tmp_path / "cache")
    env = {"HLO_AUDIT_INJECT": "rest-as-args"}
    proc = hlo_audit(tmp_path, "check", "--config", str(injected), "--only", f"id={serve_prefill}", env=env)
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 1, out + proc.stderr[-3000:]
    assert "entry parameters golden 9 -> now 65: bf16 +14, s8 +14, u32 +28 (input +28, rng_count +14, rng_key +14)" in out, \
        proc.stderr[-3000:]
    assert "+2 rest.decoder.layers_*.mlp.wi_0.AqtDotGeneral_0.qrhs.frozen.qvalue (input +2)" in out
    assert "captured arrays 56 -> 0 (436,379,816 -> 0 bytes): bf16 -14, s8 -14, u32 -28; literal RNG keys 14 -> 0" in out
    # The same change between the two modules' texts, which know nothing of the trace.
    (old,) = _texts(project, serve_prefill, tmp_path)
    (new,) = _texts(tmp_path, serve_prefill, tmp_path, "cache")
    diff = hlo_audit(tmp_path, "diff", str(old), str(new), "--max-lines", "0")
    out = " ".join(diff.stdout.split())
    assert diff.returncode == 1 and "entry parameters: 9 -> 65" in out
    # Paths read from the text alone, as the cell reads them: jax's mangled names blurred the Variable's `.value`
    # into the key after it (`frozen.value_qvalue_value`); the tool's text is told the path (issue 26).
    assert "+2 input s8 rest.decoder.layers_*.mlp.wi_0.AqtDotGeneral_0.qrhs.frozen.qvalue" in out
    assert "baked-in state: large constants 5 -> 0 (155,189,248 -> 0 bytes): s8 -5; literal RNG keys 14 -> 0" in out


def _config(folder: Path, golden: Path, target: str, cache: Path) -> Path:
    path = folder / f"{target.split(':')[0]}.toml"
    path.write_text(CONFIG.replace(f'golden_dir = "{ROOT / "golden"}"', f'golden_dir = "{golden}"\ncache_dir = "{cache}"')
                    .replace("models =", f'target = "{target}"\nmodels =', 1))
    return path


def _texts(project: Path, cell_id: str, into: Path, cache: str = ".hlo-audit-cache") -> list[Path]:
    """The cached HLO text of one cell (its entries' headers name the cell), written to a file in ``into``."""
    entry = entry_files(project / cache).get(cell_id, {})
    if "hlo" not in entry:
        return []
    text = Cache(project / cache).hlo_text(entry["hlo"].name.removesuffix(".hlo.txt"))
    path = into / f"{project.name}-{cache.strip('.')}.hlo.txt"
    path.write_text(text)
    return [path]
