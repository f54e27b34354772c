"""Load and validate the audit configuration.

Where it comes from, first found wins: ``--config FILE``; ``hlo-audit.toml`` in the working directory;
``[tool.hlo-audit]`` in ``pyproject.toml``; the built-in default matrix. Every error names the file and the
key (``hlo-audit.toml: quant[2]: unknown quantization 'int9'``), so a broken config is one clear line.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hlo_audit import platforms
from hlo_audit.matrix import RULE_KEYS, Axes, Cell, expand, matches_rule
from hlo_audit.stages import STAGES
from hlo_audit.targets.vocab import (AQT_QUANTIZATIONS, DEFAULT_PREFILL, MAXTEXT_QUANTIZATIONS, QUANT_MODES, STEPS,
                                     TE_RECIPES, TRAIN_STEP, is_transformer_engine)

DEFAULT_CONFIG_FILE = "hlo-audit.toml"
# The config keys naming a platform's devices (topology; cuda_arch, gpu, gpus, gpu_target), each read by its platform.
DEVICE_KEYS = platforms.CONFIG_KEYS

# The axes of a series: top-level keys give the first series and the defaults of every [[matrix]] entry.
AXIS_KEYS = ("models", "scan", "quant", "quant_mode", "layers", "step", "batch", "seq", "prefill", "platform",
             *DEVICE_KEYS, "stage", "overrides")

DEFAULTS: dict = {
    "target": "maxtext",
    "models": ["llama3-8b", "qwen3-1.7b", "deepseek3-test"],
    "scan": ["on", "off"],
    "quant": ["none", "int8", "fp8", "nanoo_fp8"],
    "quant_mode": ["train"],
    "layers": [2, 4],
    "step": ["train"],
    "batch": 1,
    "seq": 128,
    "prefill": DEFAULT_PREFILL,
    "platform": "cpu",
    **{key: [] for key in DEVICE_KEYS},
    "stage": "lowered",
    "cache_dir": ".hlo-audit-cache",
    "golden_dir": "golden",
    # The memory rule's ratchet: a compiled cell's bytes of one kind may exceed its golden's by this fraction.
    "memory_tolerance": 0.02,
    # deepseek3-test keeps its first 3 layers dense; at the matrix's shallow depths that would leave no MoE
    # layer (MaxText fails on a negative MoE count when scanned), so the default matrix keeps one dense.
    # Quantized, its MoE layer's megablox Pallas kernel asserts on the test model's small dims
    # ("v=512 bv=1024"), so the grouped matmul goes through jax's ragged_dot instead.
    "overrides": {"deepseek3-test": {"first_num_dense_layers": "1", "megablox": "False"}},
    # Further series, each a table of axis keys over the top-level ones (the built-in default's; a config that
    # sets its own top-level axes and no `matrix` has none of them).
    "matrix": [
        # Transformer Engine recipes, cross-lowered for CUDA on any host for a declared GPU architecture.
        # Attention is pinned: MaxText's "autoselected" resolves to dot_product on a CPU mesh but to tokamax's
        # Pallas-Triton flash kernel on a GPU one, so unpinned the same cell would be another program on a GPU host.
        {"quant": list(TE_RECIPES), "platform": "cuda", "cuda_arch": ["sm_90"],
         "overrides": {"llama3-8b": {"attention": "dot_product"}, "qwen3-1.7b": {"attention": "dot_product"},
                       "deepseek3-test": {"first_num_dense_layers": "1", "megablox": "False",
                                          "attention": "dot_product"}}},
        # MaxText's own HLO gate (its tests/integration/hlo_diff_test.py): the three stock model configs
        # (deepseek3-test keeps its 3 dense layers) through XLA's TPU compiler for v6e-4 (libtpu) at 4 layers,
        # batch 1, seq 128; scanned as that test runs them, and unrolled, where seed 000's leak grew. Stage
        # optimized: the after-optimizations module that test diffs, without the TPU codegen it never reads.
        {"models": ["deepseek3-test", "llama3-8b", "qwen3-1.7b"], "quant": ["none"], "layers": [4],
         "platform": "tpu", "topology": ["v6e-4"], "stage": "optimized", "overrides": {}},
        # Inference: MaxEngine's prefill and decode step, unquantized and AQT int8 (quantizing on every call),
        # then int8 on pre-quantized weights (serve mode), which needs a series of its own. One depth: what a
        # decode step bakes in is gated per cell, and nothing in it scales with depth the way train RNG state did.
        {"models": ["llama3-8b"], "quant": ["none", "int8"], "step": ["prefill", "generate"], "layers": [2]},
        {"models": ["llama3-8b"], "quant": ["int8"], "quant_mode": "serve", "step": ["prefill", "generate"],
         "layers": [2]},
    ],
    # TE's NVFP4 with the Hadamard transform fuses it into the cast only for rows % 64 and columns % 128, and
    # refuses anything else ("eligible for RHT cast fusion"); deepseek3-test's MoE dims (576) do not fit, on any GPU.
    "exclude": [{"model": "deepseek3-test", "quant": "te_nvfp4"}],
    "policy": {},
    "waive": [
        {"rule": "rng_scaling", "quant": "int8",
         "reason": "MaxText's AQT int8 keeps a private RNG stream per quantized dot by design: its "
                   "rng_type jax.uniform draws at apply time (seed 000)"},
        *({"rule": "rng_scaling", "model": "deepseek3-test", "quant": quant,
           "reason": "MaxText 0.2.5 leak found by this gate: MoeBlock's quant_einsums (wi_0, wi_1, wo from "
                     "create_fp8_einsum) keep forked RNG streams that fp8 never draws, 18 u32 per MoE layer; "
                     "drop this waiver when MaxText releases them"} for quant in ("fp8", "nanoo_fp8")),
        *({"rule": "rng_scaling", "quant": quant,
           "reason": "MaxText 0.2.5's TE bridge keeps a forked Rngs per NVFP4 dot, and TE draws it: sr_rng seeds "
                     "the stochastic rounding of the DGRAD quantizer (hlo-audit rng: its params streams are drawn "
                     "by te_dbias_quantize_ffi). Drawn, but it need not be per layer: seed 001 (one shared RNG "
                     "stream for the bridged NVFP4 quantizers) takes llama3-8b unrolled from 2231 to 887 entry "
                     "parameters; drop this waiver when MaxText ships it"} for quant in ("te_nvfp4", "te_nvfp4_no_rht")),
    ],
}
DEFAULT_POLICY = {"count": "fail", "rng_scaling": "fail", "launch_scaling": "fail", "hlo_text": "fail",
                  "missing_golden": "fail",
                  "dead_rng": "warn", "memory": "warn", "stale_waiver": "warn"}
_WAIVER_MATCH_KEYS = frozenset(RULE_KEYS)
_KNOWN_KEYS = frozenset(DEFAULTS)


class ConfigError(ValueError):
    """A broken configuration; the message names the file and the key."""


@dataclass(frozen=True)
class Config:
    source: str  # file the config came from, or "<built-in default>"
    target: str
    series: tuple[Axes, ...]  # the top-level series first, then each [[matrix]] entry
    cache_dir: Path
    golden_dir: Path
    exclude: tuple[Mapping[str, str], ...] = ()
    policy: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_POLICY))
    waivers: tuple[Mapping[str, str], ...] = ()  # each: rule, reason, and cell attributes to match
    memory_tolerance: float = DEFAULTS["memory_tolerance"]

    @property
    def uses_full_depth(self) -> bool:
        return any("full" in axes.layers for axes in self.series)

    def cells(self, full_depth=None, layers_override: list[int | str] | None = None) -> list[Cell]:
        """Expand every series. ``full_depth(model) -> int`` resolves "full" (needed only when used)."""
        by_id: dict[str, Cell] = {}
        for axes in self.series:
            wanted = layers_override or list(axes.layers)
            layers_for = {m: sorted({_resolve_depth(d, m, full_depth) for d in wanted}) for m in axes.models}
            for cell in expand(self.target, axes, layers_for, self._excluded):
                if by_id.setdefault(cell.id, cell) != cell:
                    raise ConfigError(f"{self.source}: matrix: two series give cell {cell.id} different overrides "
                                      f"({dict(by_id[cell.id].overrides)} and {dict(cell.overrides)})")
        return sorted(by_id.values(), key=lambda c: c.id)

    def _excluded(self, cell: Cell) -> bool:
        return any(matches_rule(cell, rule) for rule in self.exclude)


def _resolve_depth(depth: int | str, model: str, full_depth) -> int:
    if depth == "full":
        if full_depth is None:
            raise ConfigError("layers: 'full' needs the target to know the model's depth")
        return int(full_depth(model))
    return int(depth)


def find_config(explicit: str | None = None, cwd: Path | None = None) -> tuple[dict, str, Path]:
    """(raw table, source label, base dir) of the config in force."""
    cwd = cwd or Path.cwd()
    if explicit:
        path = Path(explicit)
        return _read_table(path, explicit_file=True), str(path), path.resolve().parent
    local = cwd / DEFAULT_CONFIG_FILE
    if local.is_file():
        return _read_table(local, explicit_file=True), DEFAULT_CONFIG_FILE, cwd
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file():
        table = _read_table(pyproject, explicit_file=False)
        if table is not None:
            return table, "pyproject.toml [tool.hlo-audit]", cwd
    return {}, "<built-in default>", cwd


def _read_table(path: Path, explicit_file: bool) -> dict | None:
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    if path.name == "pyproject.toml" or "tool" in doc:
        table = doc.get("tool", {}).get("hlo-audit")
        if table is None and not explicit_file:
            return None
        if table is None:
            raise ConfigError(f"{path}: no [tool.hlo-audit] table")
        return table
    return doc


def load_config(explicit: str | None = None, cwd: Path | None = None) -> Config:
    raw, source, base = find_config(explicit, cwd)
    return validate(raw, source, base)


def validate(raw: dict, source: str, base: Path) -> Config:
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KNOWN_KEYS))})")
    merged = {**DEFAULTS, **raw}
    if "matrix" not in raw and any(key in raw for key in AXIS_KEYS):
        merged["matrix"] = []  # the default's further series belong to the default's models and quants
    # The default overrides follow the default models: a config naming its own models starts clean.
    if "overrides" not in raw:
        merged["overrides"] = {m: t for m, t in DEFAULTS["overrides"].items() if m in merged["models"]}

    def fail(key: str, message: str):
        raise ConfigError(f"{source}: {key}: {message}")

    target = _typed(merged, "target", str, fail)
    if target != "maxtext" and ":" not in target:
        fail("target", f"expected 'maxtext' or 'package.module:function', got {target!r}")
    tolerance = merged["memory_tolerance"]
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        fail("memory_tolerance", f"expected a fraction in [0, 1), e.g. 0.02 for 2%, got {tolerance!r}")
    return Config(
        source=source, target=target, series=_series(merged, target, base, fail), memory_tolerance=float(tolerance),
        cache_dir=base / _typed(merged, "cache_dir", str, fail), golden_dir=base / _typed(merged, "golden_dir", str, fail),
        exclude=_exclude(merged["exclude"], fail), policy={**DEFAULT_POLICY, **_policy(merged["policy"], fail)},
        waivers=_waivers(merged["waive"], fail),
    )


def _series(merged: dict, target: str, base: Path, fail) -> tuple[Axes, ...]:
    """The top-level series, then one per [[matrix]] entry (over the top-level axes)."""
    series = [_axes(merged, target, "", base, fail)]
    entries = merged["matrix"]
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        fail("matrix", "expected an array of tables: [[matrix]] quant = [...], platform = ...")
    for i, entry in enumerate(entries):
        bad = sorted(set(entry) - set(AXIS_KEYS))
        if bad:
            fail(f"matrix[{i}].{bad[0]}", f"unknown key (a series sets: {', '.join(AXIS_KEYS)})")
        inherited = {k: v for k, v in merged.items() if k in AXIS_KEYS}
        if "models" in entry and "overrides" not in entry:
            inherited["overrides"] = {m: t for m, t in merged["overrides"].items() if m in entry["models"]}
        series.append(_axes({**inherited, **entry}, target, f"matrix[{i}].", base, fail))
    return tuple(series)


def _exclude(exclude, fail) -> tuple[Mapping[str, str], ...]:
    if not isinstance(exclude, list) or not all(isinstance(r, dict) for r in exclude):
        fail("exclude", "expected an array of tables, e.g. [[tool.hlo-audit.exclude]] model = 'x'")
    for i, rule in enumerate(exclude):
        bad = sorted(set(rule) - _WAIVER_MATCH_KEYS)
        if bad:
            fail(f"exclude[{i}].{bad[0]}", f"unknown key (use {', '.join(RULE_KEYS)})")
    return tuple(exclude)


def _policy(policy, fail) -> dict[str, str]:
    if not isinstance(policy, dict):
        fail("policy", "expected a table of rule = 'fail' | 'warn' | 'off'")
    for rule, action in policy.items():
        if rule not in DEFAULT_POLICY:
            fail(f"policy.{rule}", f"unknown rule (known: {', '.join(DEFAULT_POLICY)})")
        if action not in ("fail", "warn", "off"):
            fail(f"policy.{rule}", f"expected 'fail', 'warn' or 'off', got {action!r}")
    return policy


def _waivers(waivers, fail) -> tuple[Mapping[str, str], ...]:
    if not isinstance(waivers, list) or not all(isinstance(w, dict) for w in waivers):
        fail("waive", "expected an array of tables: [[tool.hlo-audit.waive]] rule = ..., reason = ...")
    for i, waiver in enumerate(waivers):
        if waiver.get("rule") not in DEFAULT_POLICY:
            fail(f"waive[{i}].rule", f"expected one of {', '.join(DEFAULT_POLICY)}, got {waiver.get('rule')!r}")
        if not isinstance(waiver.get("reason"), str) or not waiver["reason"].strip():
            fail(f"waive[{i}].reason", "every waiver needs a reason")
        allowed = _WAIVER_MATCH_KEYS | ({"pattern"} if waiver["rule"] == "dead_rng" else set())
        bad = sorted(set(waiver) - allowed - {"rule", "reason"})
        if "pattern" in waiver and (not isinstance(waiver["pattern"], str) or not waiver["pattern"].strip()):
            fail(f"waive[{i}].pattern", "expected a glob over stream patterns, e.g. 'model.decoder.rngs.*'")
        if bad:
            fail(f"waive[{i}].{bad[0]}", f"unknown key (match on {', '.join(sorted(allowed))})")
    return tuple(waivers)


def _axes(table: dict, target: str, prefix: str, base: Path, fail) -> Axes:
    """One series' axes from a table of axis keys; errors name the key with ``prefix`` (``matrix[1].``)."""

    def bad(key: str, message: str):
        fail(prefix + key, message)

    models = _string_list(table, "models", bad)
    platform = _typed(table, "platform", str, bad)
    if platform not in platforms.PLATFORMS:
        bad("platform", f"expected one of {', '.join(platforms.PLATFORMS)}, got {platform!r}")
    quants = _quants(table, target, platform, bad)
    steps = _one_of(table, "step", STEPS, bad)
    quant_modes = _one_of(table, "quant_mode", QUANT_MODES, bad)
    if target == "maxtext" and "serve" in quant_modes:
        _check_serve_mode(steps, quants, bad)
    batch, seq, prefill = _sizes(table, steps, bad)
    devices = _devices(table, platform, base, bad)
    return Axes(
        models=tuple(models), scans=_scans(table, bad), quants=tuple(quants), layers=_depths(table, bad), batch=batch,
        seq=seq, platform=platform, devices=devices, stage=_stage(table, platform, devices, bad), steps=tuple(steps),
        quant_modes=tuple(quant_modes), prefill=prefill, overrides=_overrides(table, models, bad),
    )


def _scans(table: dict, bad) -> tuple[bool, ...]:
    scans = []
    for i, value in enumerate(_string_list(table, "scan", bad)):
        if value not in ("on", "off"):
            bad(f"scan[{i}]", f"expected 'on' or 'off', got {value!r}")
        scans.append(value == "on")
    return tuple(scans)


def _quants(table: dict, target: str, platform: str, bad) -> list[str]:
    quants = _string_list(table, "quant", bad)
    for i, q in enumerate(quants):
        if target == "maxtext" and q not in MAXTEXT_QUANTIZATIONS:
            bad(f"quant[{i}]", f"unknown quantization {q!r} (MaxText knows: {', '.join(MAXTEXT_QUANTIZATIONS)})")
        if target == "maxtext" and is_transformer_engine(q) and platform != "cuda":
            bad(f"quant[{i}]", f"{q} is a Transformer Engine recipe, which exists only for CUDA: "
                               f"put it in a series with platform = 'cuda' (got {platform!r})")
    return quants


def _depths(table: dict, bad) -> tuple[int | str, ...]:
    layers = table["layers"]
    if not isinstance(layers, list) or not layers:
        bad("layers", "expected a non-empty list of depths (integers >= 1, or 'full')")
    for i, d in enumerate(layers):
        if not (d == "full" or (isinstance(d, int) and not isinstance(d, bool) and d >= 1)):
            bad(f"layers[{i}]", f"expected an integer >= 1 or 'full', got {d!r}")
    return tuple(layers)


def _one_of(table: dict, key: str, known: tuple[str, ...], bad) -> list[str]:
    values = _string_list(table, key, bad, allow_scalar=True)
    for i, value in enumerate(values):
        if value not in known:
            bad(f"{key}[{i}]", f"expected one of {', '.join(known)}, got {value!r}")
    return values


def _check_serve_mode(steps: list[str], quants: list[str], bad) -> None:
    """MaxEngine serves pre-quantized AQT weights; a train step or an unquantized model has no serve mode."""
    if TRAIN_STEP in steps:
        bad("quant_mode", "'serve' is MaxEngine's pre-quantized-checkpoint mode: only inference steps "
                          "(prefill, generate, insert) have it; put it in a series without step 'train'")
    for i, q in enumerate(quants):
        if q not in AQT_QUANTIZATIONS:
            bad(f"quant[{i}]", f"quant_mode 'serve' needs an AQT quantization ({', '.join(AQT_QUANTIZATIONS)}), "
                               f"got {q!r}: put it in a series of its own")


def _sizes(table: dict, steps: list[str], bad) -> tuple[int, int, int]:
    batch, seq, prefill = (_typed(table, key, int, bad) for key in ("batch", "seq", "prefill"))
    if batch < 1 or seq < 1 or prefill < 1:
        bad("batch" if batch < 1 else "seq" if seq < 1 else "prefill", "must be >= 1")
    if prefill > seq and any(step != TRAIN_STEP for step in steps):
        bad("prefill", f"the prompt ({prefill}) must fit the sequence it starts (seq = {seq})")
    return batch, seq, prefill


def _stage(table: dict, platform: str, devices: tuple[str, ...], bad) -> str:
    stage = _typed(table, "stage", str, bad)
    if stage not in STAGES:
        bad("stage", f"expected one of {', '.join(STAGES)}, got {stage!r}")
    for device in devices:
        problem = platforms.get(platform).stage_problem(device, stage)
        if problem:
            bad("stage", problem)
    return stage


def _overrides(table: dict, models: list[str], bad) -> dict[str, dict[str, str]]:
    overrides = table["overrides"]
    if not isinstance(overrides, dict):
        bad("overrides", "expected a table of model -> {key = value}")
    for model, values in overrides.items():
        if model not in models:
            bad(f"overrides.{model}", f"model {model!r} is not in models")
        if not isinstance(values, dict) or not all(isinstance(v, (str, int, float, bool)) for v in values.values()):
            bad(f"overrides.{model}", "expected a table of key = value (strings, numbers or booleans)")
    return {m: {k: _toml_scalar(v) for k, v in t.items()} for m, t in overrides.items()}


def _devices(table: dict, platform: str, base: Path, bad) -> tuple[str, ...]:
    """The series' devices from its platform's own keys (``topology`` for tpu; ``gpu``, ``gpus``... for cuda: the
    platform reads them); ("",) for the host's own."""
    given = {key: table[key] for key in DEVICE_KEYS if table.get(key) not in (None, [], "")}
    owner = platforms.get(platform)
    for key in given:
        if key not in owner.config_keys:
            reader = platforms.by_device_key(key)
            bad(key, f"a {reader.key_words.get(key, reader.device_word)} needs platform = {reader.name!r} "
                     f"(got {platform!r})")
    return owner.config_devices(given, bad, base) or ("",)


def _typed(merged: dict, key: str, kind: type, fail):
    value = merged[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        fail(key, f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _string_list(merged: dict, key: str, fail, allow_scalar: bool = False, allow_empty: bool = False) -> list[str]:
    value = merged[key]
    if allow_scalar and isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not (value or allow_empty):
        fail(key, "expected a non-empty list of strings" + (" (or one string)" if allow_scalar else ""))
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            fail(f"{key}[{i}]", f"expected a non-empty string, got {item!r}")
    if len(set(value)) != len(value):
        fail(key, "has duplicates")
    return list(value)


def _toml_scalar(value) -> str:
    """MaxText takes config values as command-line strings; TOML booleans become True/False."""
    return str(value)
