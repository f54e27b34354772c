"""Load and validate the audit configuration.

Where it comes from, first found wins: ``--config FILE``; ``hlo-audit.toml`` in the working directory;
``[tool.hlo-audit]`` in ``pyproject.toml``; the built-in default matrix. Every error names the file and the
key (``hlo-audit.toml: quant[2]: unknown quantization 'int9'``), so a broken config is one clear line.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from hlo_audit import platforms
from hlo_audit.defaults import AXIS_KEYS, DEFAULT_CONFIG_FILE, DEFAULTS, DEVICE_KEYS
from hlo_audit.files import absolute, read_bounded, working_directory
from hlo_audit.lowering import CellConfigError, TargetError
from hlo_audit.matrix import MAX_DEPTH, RULE_KEYS, Axes, Cell, expand, id_part_problem, matches_rule, text_problem
from hlo_audit.policy import Policy
from hlo_audit.rules import registry
from hlo_audit.stages import STAGES
from hlo_audit.targets import nnx_spec
from hlo_audit.targets.vocab import (
    AQT_QUANTIZATIONS,
    MAXTEXT_QUANTIZATIONS,
    QUANT_MODES,
    STEPS,
    TRAIN_STEP,
    is_transformer_engine,
)

_WAIVER_MATCH_KEYS = frozenset(RULE_KEYS)
# A config is a few kilobytes; anything near this is not one (``--config /dev/zero`` must not fill the memory).
MAX_CONFIG_BYTES = 1 << 20


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
    policy: Mapping[str, str] = field(default_factory=registry.default_policy)
    waivers: tuple[Mapping[str, str], ...] = ()  # each: rule, reason, and cell attributes to match
    waivers_built_in: bool = False  # the config wrote no waive list: the waivers are DEFAULTS'
    # Per series: the axes (scan, quant) the config left to their default, which a callable target's function may
    # declare (its `scan` / `quant` attribute) once the plan imports it (``resolve``).
    defaulted: tuple[frozenset[str], ...] = ()
    # target "nnx": model -> its description (targets.nnx_spec), with the library's source digest once resolved.
    nnx: Mapping[str, Mapping] = field(default_factory=dict)
    resolved: bool = False  # the target imported and checked (``resolve``)
    # The gate's policy: ``policy``'s actions, the tolerances set and the ``waivers``, typed (``Policy.of``), built
    # with the config.
    rules: Policy = field(default_factory=lambda: Policy(registry.default_policy()))
    # The project folder: where the config's relative paths start (the config file's folder, or the working
    # directory for a pyproject table or the built-in default). hlo-audit writes goldens only inside it.
    project: Path | None = None

    @property
    def uses_full_depth(self) -> bool:
        return any("full" in axes.layers for axes in self.series)

    def cells(self, full_depth=None, layers_override: list[int | str] | None = None) -> list[Cell]:
        """Expand every series. ``full_depth(model) -> int`` resolves "full" (needed only when used)."""
        by_id: dict[str, Cell] = {}
        for axes in self.series:
            wanted = layers_override or list(axes.layers)
            layers_for = {m: sorted({self._resolve_depth(d, m, full_depth) for d in wanted}) for m in axes.models}
            for cell in expand(self.target, axes, layers_for, self._excluded):
                if by_id.setdefault(cell.id, cell) != cell:
                    raise ConfigError(f"{self.source}: matrix: two series give cell {cell.id} different overrides "
                                      f"({dict(by_id[cell.id].overrides)} and {dict(cell.overrides)})")
        return sorted(by_id.values(), key=lambda c: c.id)

    def _excluded(self, cell: Cell) -> bool:
        return any(matches_rule(cell, rule) for rule in self.exclude)

    def _resolve_depth(self, depth: int | str, model: str, full_depth) -> int:
        if depth != "full":
            return int(depth)
        if full_depth is None:
            raise ConfigError(f"{self.source}: layers: 'full' needs the target to know the model's depth")
        try:
            depth = int(full_depth(model))
        except (CellConfigError, TargetError, ValueError) as exc:  # MaxText's own error for a model it lacks
            raise ConfigError(f"{self.source}: models: {model!r}: cannot resolve layers 'full': "
                              f"{' '.join(str(exc).split())}") from None
        if not 1 <= depth <= MAX_DEPTH:
            raise ConfigError(f"{self.source}: models: {model!r}: the target says its full depth is {depth}; "
                              f"expected 1 to {MAX_DEPTH}")
        return depth


def find_config(explicit: str | None = None, cwd: Path | None = None) -> tuple[dict, str, Path]:
    """(raw table, source label, base dir) of the config in force."""
    if explicit:
        path = Path(explicit)
        base = absolute(path, f"--config {path}").resolve().parent  # a relative path needs the working directory
        return _read_table(path, explicit_file=True), str(path), base
    cwd = cwd or working_directory("finding the config (hlo-audit.toml, pyproject.toml)")
    local = cwd / DEFAULT_CONFIG_FILE
    if local.is_file():
        return _read_table(local, explicit_file=True), DEFAULT_CONFIG_FILE, cwd
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file():
        table = _read_table(pyproject, explicit_file=False)
        if table is not None:
            return table, "pyproject.toml [tool.hlo-audit]", cwd
    return {}, "<built-in default>", cwd


def _read_text(path: Path) -> str:
    """The file's text; a device, a folder or a file too large to be a config is one line naming it."""
    data = read_bounded(path, MAX_CONFIG_BYTES, "a config file", ConfigError, fifo=True)  # --config <(...) too
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start})") from None


def _read_table(path: Path, explicit_file: bool) -> dict | None:
    try:
        doc = tomllib.loads(_read_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    if path.name == "pyproject.toml" or "tool" in doc:
        tool = doc.get("tool", {})
        table = tool.get("hlo-audit") if isinstance(tool, dict) else None
        if table is None and not explicit_file:
            return None
        if table is None:
            raise ConfigError(f"{path}: no [tool.hlo-audit] table")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: tool.hlo-audit: expected a table, got {type(table).__name__}")
        if not table:
            raise ConfigError(f"{path}: [tool.hlo-audit] is empty: set at least `models` (or remove the table to "
                              "use the built-in matrix)")
        return table
    if not doc:
        # An empty file would silently select the built-in 122-cell MaxText matrix: say so instead.
        raise ConfigError(f"{path}: is empty: set at least `models` (or delete the file to use the built-in matrix)")
    return doc


def load_config(explicit: str | None = None, cwd: Path | None = None) -> Config:
    raw, source, base = find_config(explicit, cwd)
    return validate(raw, source, base)


def validate(raw: dict, source: str, base: Path) -> Config:
    # The top-level keys: the defaults', and the tolerances a config sets there as well as in [policy].
    known = frozenset(DEFAULTS) | registry.top_level_tolerance_keys()
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    merged = {**DEFAULTS, **raw}
    if "matrix" not in raw and any(key in raw for key in AXIS_KEYS):
        merged["matrix"] = []  # the default's further series belong to the default's models and quants
    stock_nnx = raw.get("target") == nnx_spec.TARGET
    # The default overrides follow the default models: a config naming its own models starts clean.
    if "overrides" not in raw:
        merged["overrides"] = {} if stock_nnx else {m: t for m, t in DEFAULTS["overrides"].items()
                                                    if m in merged["models"]}
    if stock_nnx:
        # A library's models are not MaxText's: no MaxText quantizations.
        merged["quant"] = raw.get("quant", ["none"])
    if raw.get("target", "maxtext") != "maxtext":
        # The default waivers are written for MaxText 0.2.5's known leaks: another target starts with none (else
        # each would be a stale_waiver advisory in every check of a user's own model).
        merged["waive"] = raw.get("waive", [])

    def fail(key: str, message: str):
        # A TOML key may hold any character: shown escaped, so the error stays one line.
        key = "".join(ascii(ch)[1:-1] if text_problem(ch) else ch for ch in key)
        raise ConfigError(f"{source}: {key}: {message}")

    target = _typed(merged, "target", str, fail)
    if target not in ("maxtext", nnx_spec.TARGET) and ":" not in target:
        fail("target", f"expected 'maxtext' or 'package.module:function' (or 'nnx', the stock NNX target), "
                       f"got {target!r}")
    if problem := text_problem(target):
        fail("target", problem)
    if target == nnx_spec.TARGET and "models" not in raw:
        fail("models", "the nnx target audits the models a config names: models = ['NAME', ...], each described "
                       "by [nnx] and [nnx.models.NAME]")
    if raw.get("nnx") and target != nnx_spec.TARGET:
        fail("nnx", f"only target = 'nnx' reads the [nnx] table (target is {target!r})")
    top_level = {key: _fraction(key, raw[key], fail) for key in sorted(registry.top_level_tolerance_keys())
                 if key in raw}
    golden_dir, cache_dir = _folders(merged, base, fail)
    series = _series(merged, target, base, fail)
    entries = merged["matrix"]
    defaulted = tuple(frozenset(k for k in DEFAULTABLE_AXES if k not in raw and k not in entry)
                      for entry in [{}, *entries])
    specs: dict[str, dict] = {}
    if target == nnx_spec.TARGET:
        series, defaulted, specs = _nnx_series(merged, series, defaulted, fail)
    exclude = _exclude(merged["exclude"], fail)
    actions, tolerances = _policy(merged["policy"], top_level, fail)
    policy = {**registry.default_policy(), **actions}
    waivers, built_in = _waivers(merged["waive"], fail), "waive" not in raw and bool(merged["waive"])
    return Config(
        source=source, target=target, series=series,
        cache_dir=cache_dir, golden_dir=golden_dir, exclude=exclude, policy=policy,
        waivers=waivers, waivers_built_in=built_in, defaulted=defaulted, nnx=specs, project=base,
        rules=Policy.of(policy, waivers, built_in, source, tolerances),
    )


# Axes whose default a callable target's function may declare (its `scan` / `quant` attribute).
DEFAULTABLE_AXES = ("scan", "quant")


def _nnx_series(merged: dict, series: tuple[Axes, ...], defaulted: tuple[frozenset[str], ...],
                fail) -> tuple[tuple[Axes, ...], tuple[frozenset[str], ...], dict[str, dict]]:
    """target "nnx": each series split into one per model, carrying the model's description in its cells'
    overrides; scan defaults to what the model supports (on and off where its description names a scan switch,
    off where it does not), and an explicit scan 'on' for a model without one is an error."""
    if any(values for axes in series for values in axes.overrides.values()):
        fail("overrides", "the nnx target sets a model's config fields in [nnx.models.NAME] fields = {...}, or in a "
                          "variant's [nnx.quant.NAME], not in overrides")
    models = list(dict.fromkeys(m for axes in series for m in axes.models))
    quants = list(dict.fromkeys(q for axes in series for q in axes.quants))
    try:
        specs = nnx_spec.validate(merged["nnx"], models, quants)
    except nnx_spec.SpecError as exc:
        fail(exc.key, str(exc))
    split, flags = [], []
    for i, (axes, given) in enumerate(zip(series, defaulted)):
        prefix = "" if i == 0 else f"matrix[{i - 1}]."
        if any(step != TRAIN_STEP for step in axes.steps):
            fail(prefix + "step", f"the nnx target builds a train step only, got {', '.join(axes.steps)}")
        if any(mode != "train" for mode in axes.quant_modes):
            fail(prefix + "quant_mode", "quant_mode is AQT's (MaxText's); the nnx target's variants are quant's values")
        for model in axes.models:
            scans = axes.scans
            if "scan" in given:
                scans = (True, False) if nnx_spec.supports_scan(specs[model]) else (False,)
            elif True in scans and not nnx_spec.supports_scan(specs[model]):
                fail(prefix + "scan", f"'on' for model {model!r}, whose description names no scan switch: set "
                                      f"scan = 'FIELD' (the config field or keyword that turns layer scan on) in "
                                      f"[nnx.models.{model}], or leave scan out (it defaults to what each model "
                                      "supports)")
            split.append(replace(axes, models=(model,), scans=scans,
                                 overrides={model: {nnx_spec.SPEC_KEY: nnx_spec.to_json(specs[model])}}))
            flags.append(given)
    return tuple(split), tuple(flags), specs


def _folders(merged: dict, base: Path, fail) -> tuple[Path, Path]:
    """golden_dir and cache_dir: each a folder of its own, inside neither the other nor above the project.

    ``golden update`` rebuilds the golden folder and swaps it in whole, and ``--prune`` removes goldens from it:
    the project folder itself (``""`` or ``"."``), a folder above it, or one holding the cache would put files
    that are not goldens in its reach.
    """
    folders = {}
    for key in ("golden_dir", "cache_dir"):
        value = _typed(merged, key, str, fail)
        if not value.strip():
            fail(key, f"must name a folder, got {value!r}")
        if problem := text_problem(value):
            fail(key, problem)
        path, here = (base / value).resolve(), base.resolve()
        if path == here or path in here.parents:
            where = "the project folder" if path == here else "a folder above the project folder"
            fail(key, f"{value!r} is {where} ({here}); give it a folder of its own, e.g. {DEFAULTS[key]!r}")
        folders[key] = path
    golden, cache = folders["golden_dir"], folders["cache_dir"]
    if golden == cache or golden in cache.parents or cache in golden.parents:
        fail("cache_dir", f"{merged['cache_dir']!r} and golden_dir {merged['golden_dir']!r} overlap ({cache} and "
                          f"{golden}): the cache may not hold goldens, nor the golden folder the cache")
    return base / merged["golden_dir"], base / merged["cache_dir"]


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
        if not rule:
            fail(f"exclude[{i}]", "an empty rule would exclude every cell; name what it excludes (model = ...)")
        _match_values(rule, f"exclude[{i}].", fail)
    return tuple(exclude)


def _match_values(rule: Mapping, prefix: str, fail) -> None:
    """An exclude rule's or waiver's cell values: a value, or a non-empty list of alternatives (any one matches).

    Values are compared with the cell's record as ``--only`` spells it, so each must be of that kind: a depth is
    an integer, ``scan`` is 'on' or 'off', the rest are strings. Anything else (a boolean, a table, a nested list)
    could never match, and an inert rule is worse than an error.
    """
    for key in sorted(set(rule) & _WAIVER_MATCH_KEYS):
        values = rule[key] if isinstance(rule[key], list) else [rule[key]]
        if not values:
            fail(prefix + key, "expected a value or a non-empty list of alternatives, got []")
        for value in values:
            if key == "layers":
                ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_DEPTH
                want = f"an integer depth in 1..{MAX_DEPTH}"
            elif key == "scan":
                ok, want = value in ("on", "off"), "'on' or 'off'"
            else:
                ok = isinstance(value, str) and bool(value) and text_problem(value) is None
                want = "a non-empty string without control characters"
            if not ok:
                fail(prefix + key, f"expected {want} (or a list of them), got {value!r}")


def _policy(policy, top_level: Mapping[str, float], fail) -> tuple[dict[str, str], dict[str, float]]:
    """``[policy]``: each rule's action (``rule = 'fail' | 'warn' | 'off'``) and tolerance (``rule_tolerance =
    0.05``), every key a rule's spec declares (``rules.registry``); with the tolerances set at the top level, as
    (actions, rule -> tolerance)."""
    if not isinstance(policy, dict):
        fail("policy", "expected a table of rule = 'fail' | 'warn' | 'off'")
    rules, tolerance_keys = registry.default_policy(), registry.tolerance_keys()
    actions, tolerances = {}, {}
    for key, value in policy.items():
        if key in tolerance_keys:
            if key in top_level:
                fail(f"policy.{key}", f"set at the top level too ({key} = {top_level[key]!r}): set it once")
            tolerances[tolerance_keys[key].name] = _fraction(f"policy.{key}", value, fail)
            continue
        if key not in rules:
            fail(f"policy.{key}", f"unknown rule (known: {', '.join(rules)}; tolerances: {', '.join(tolerance_keys)})")
        if not isinstance(value, str) or value not in ("fail", "warn", "off"):
            fail(f"policy.{key}", f"expected 'fail', 'warn' or 'off', got {value!r}")
        actions[key] = value
    tolerances.update({tolerance_keys[key].name: value for key, value in top_level.items()})
    return actions, tolerances


def _fraction(key: str, value, fail) -> float:
    """A rule's tolerance: a fraction in [0, 1) (its spec says what a good one looks like)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        example = registry.tolerance_keys()[key.removeprefix("policy.")].tolerance.example
        fail(key, f"expected a fraction in [0, 1), e.g. {example}, got {value!r}")
    return float(value)


def _waivers(waivers, fail) -> tuple[Mapping[str, str], ...]:
    if not isinstance(waivers, list) or not all(isinstance(w, dict) for w in waivers):
        fail("waive", "expected an array of tables: [[tool.hlo-audit.waive]] rule = ..., reason = ...")
    for i, waiver in enumerate(waivers):
        rules = registry.default_policy()
        if not waiver:
            fail(f"waive[{i}]", "an empty waiver would waive every cell; name its rule, its reason and the cells it "
                                "waives (model = ...)")
        if not isinstance(waiver.get("rule"), str) or waiver["rule"] not in rules:
            fail(f"waive[{i}].rule", f"expected one of {', '.join(rules)}, got {waiver.get('rule')!r}")
        if not isinstance(waiver.get("reason"), str) or not waiver["reason"].strip():
            fail(f"waive[{i}].reason", "every waiver needs a reason")
        spec = registry.spec_of(waiver["rule"])
        # A rule of changed lines (unreached) is waived by path alone; the others by cells, dead_rng's by pattern too.
        allowed = {"path"} if spec.path_waivers else (
            _WAIVER_MATCH_KEYS | ({"pattern"} if spec.pattern_waivers else set()))
        bad = sorted(set(waiver) - allowed - {"rule", "reason"})
        if "pattern" in waiver and (not isinstance(waiver["pattern"], str) or not waiver["pattern"].strip()):
            fail(f"waive[{i}].pattern", "expected a glob over stream patterns, e.g. 'model.decoder.rngs.*'")
        if "path" in waiver and (not isinstance(waiver["path"], str) or not waiver["path"].strip()):
            fail(f"waive[{i}].path", "expected a glob over repository paths, e.g. 'src/legacy/*.py'")
        if bad:
            fail(f"waive[{i}].{bad[0]}", f"unknown key (match on {', '.join(sorted(allowed))})")
        if spec.path_waivers and "path" not in waiver:
            fail(f"waive[{i}]", f"a waiver of {waiver['rule']} names the changed files it waives: path = "
                                "'src/legacy/*.py'")
        if not set(waiver) & allowed:  # as an exclude with no keys: a waiver must say which cells it covers
            fail(f"waive[{i}]", f"a waiver naming no cells would waive {waiver['rule']} in every cell; name the "
                                "cells it waives (model = ..., quant = ...: a list of values matches any of them)")
        if not spec.path_waivers:
            _match_values(waiver, f"waive[{i}].", fail)
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
        if d != "full" and d > MAX_DEPTH:
            bad(f"layers[{i}]", f"{d} layers is deeper than any model (MaxText's deepest has 126); at most "
                                f"{MAX_DEPTH}, or 'full' for the model's real depth")
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
        for key, value in values.items():
            # Overrides go to MaxText as `key=value` arguments and into the cache key; not into the id.
            if problem := text_problem(key) or text_problem(str(value)):
                bad(f"overrides.{model}.{ascii(key)[1:-1]}", problem)
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
        # Every axis value given as a string is one part of the cell id, and so of its golden's path.
        if problem := id_part_problem(item):
            fail(f"{key}[{i}]", f"{item!r} {problem}")
    if len(set(value)) != len(value):
        fail(key, "has duplicates")
    return list(value)


def _toml_scalar(value) -> str:
    """MaxText takes config values as command-line strings; TOML booleans become True/False."""
    return str(value)
