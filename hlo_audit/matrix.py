"""Cells of the audit matrix: one lowering each, with a stable id.

A cell is everything that decides what HLO comes out: target, model, scan on/off, quantization and its AQT
mode, depth, the step (MaxText's train step, or an inference step), batch, sequence and prefill length, the
platform and the device it names (a TPU topology, a CUDA architecture: ``hlo_audit.platforms`` says what a
device name means), the stage (lowered, optimized or compiled) and per-model overrides. Its id is what a golden
file, a pytest item and a report row are named by, so it must never depend on dict order or run order.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields

from hlo_audit import platforms
from hlo_audit.targets.vocab import DEFAULT_PREFILL, TRAIN_STEP

# The record's keys for the device, as every v1 JSON document and `--only` name it: each platform's own keys (a
# named GPU shows under `gpu`, with its architecture under `cuda_arch`; the first non-empty key is the device).
DEVICE_RECORD_KEYS = ("topology", "gpu", "cuda_arch")
assert set(DEVICE_RECORD_KEYS) == set(platforms.RECORD_KEYS), "a platform's record key is missing here"
# The axes a cell is named by, as its record, `--only`, exclude rules and waivers spell them.
AXES = ("model", "scan", "quant", "quant_mode", "layers", "step", "platform", *DEVICE_RECORD_KEYS, "stage")
# `--only` keys: every axis, the id and the target.
FILTER_KEYS = (*AXES, "id", "target")
# What a config's exclude rule or waiver may match on.
RULE_KEYS = AXES


class MatrixError(ValueError):
    """A bad --only / --shard / --layers value; the message names it."""


@dataclass(frozen=True, order=True)
class Cell:
    model: str
    scan: bool
    quant: str
    layers: int
    target: str = "maxtext"
    batch: int = 1
    seq: int = 128
    platform: str = "cpu"
    stage: str = "lowered"
    overrides: tuple[tuple[str, str], ...] = field(default=())
    step: str = "train"
    # What the platform names the exact device by: a TPU topology compiled for (MaxText's names: v6e-4), named GPUs
    # compiled for (h100, 8xh100: hlo_audit.platforms.cuda), a CUDA architecture declared to the compiler stack
    # (sm_90); "" for the host's own devices.
    device: str = ""
    # AQT's mode: "train" quantizes full-precision weights on every call; "serve" runs on weights quantized
    # ahead of time (MaxEngine with checkpoint_is_quantized). Part of the id, as `int8-serve`, when not "train".
    quant_mode: str = "train"
    prefill: int = DEFAULT_PREFILL  # inference steps: the prompt length prefilled (train cells keep the default)

    @property
    def scan_label(self) -> str:
        return "on" if self.scan else "off"

    @property
    def platform_label(self) -> str:
        """``cpu``, ``cuda-sm_90``, ``tpu-v6e-4``: the platform with the device it names, if any."""
        return platforms.of(self).label(self.device)

    @property
    def device_fields(self) -> dict[str, str]:
        """The device under its record key (``topology``, ``cuda_arch``): every key of DEVICE_RECORD_KEYS, "" when
        the cell names none."""
        return {**dict.fromkeys(DEVICE_RECORD_KEYS, ""), **platforms.of(self).record_fields(self.device)}

    @property
    def quant_label(self) -> str:
        """``int8``, or ``int8-serve`` for AQT's serve mode: the quantization as ids and labels show it."""
        return self.quant if self.quant_mode == "train" else f"{self.quant}-{self.quant_mode}"

    @property
    def is_inference(self) -> bool:
        return self.step != TRAIN_STEP

    @property
    def id(self) -> str:
        """``llama3-8b/scan-off/int8/L2``; step, platform, stage, batch/seq/prefill appear only when not the
        defaults."""
        return self.id_with_depth(f"L{self.layers}")

    def id_with_depth(self, depth: str) -> str:
        """The id with ``depth`` in place of ``L<layers>``: ``llama3-8b/scan-off/int8/L2,4`` names a series' row."""
        parts = [self.model, f"scan-{self.scan_label}", self.quant_label, depth]
        if self.is_inference:
            parts.append(self.step)
        if self.platform_label != "cpu":
            parts.append(self.platform_label)
        if self.stage != "lowered":
            parts.append(self.stage)
        custom_prefill = self.is_inference and self.prefill != DEFAULT_PREFILL
        if self.batch != 1 or self.seq != 128 or custom_prefill:
            parts.append(f"b{self.batch}s{self.seq}" + (f"p{self.prefill}" if custom_prefill else ""))
        return "/".join(parts)

    def series_id(self, depths: Sequence[int] | None = None) -> str:
        """``llama3-8b/scan-off/int8/L*``, or with the series' depths: ``.../L2,4``."""
        return self.id_with_depth("L*" if depths is None else "L" + ",".join(map(str, depths)))

    @property
    def id_without_scan(self) -> str:
        """``llama3-8b/int8/L2``: the label of a scan on / scan off pair."""
        return "/".join(part for part in self.id.split("/") if part != f"scan-{self.scan_label}")

    def key_without(self, name: str) -> tuple:
        """Every field but ``name``, in field order: cells equal in it differ only in that axis."""
        return tuple(getattr(self, f.name) for f in fields(self) if f.name != name)

    @property
    def series(self) -> tuple:
        """Everything but the depth: cells of one series differ only in layers (depth scaling)."""
        return self.key_without("layers")

    def record(self) -> dict:
        """The cell's identity as report rows and JSON name it (scan as on/off, the device under its record key)."""
        return {"id": self.id, "target": self.target, "model": self.model, "scan": self.scan_label,
                "quant": self.quant, "quant_mode": self.quant_mode, "layers": self.layers, "step": self.step,
                "platform": self.platform, **self.device_fields, "stage": self.stage, "batch": self.batch,
                "seq": self.seq, "prefill": self.prefill}

    @classmethod
    def from_record(cls, record: Mapping) -> "Cell":
        """The cell a ``record()`` names (a merged shard's cells); its overrides are not in the record."""
        device = next((record[k] for k in DEVICE_RECORD_KEYS if record.get(k)), "")
        return cls(model=record["model"], scan=record["scan"] == "on", quant=record["quant"], layers=record["layers"],
                   target=record["target"], batch=record["batch"], seq=record["seq"], platform=record["platform"],
                   stage=record["stage"], step=record["step"], device=device,
                   # Shards written before the AQT-mode and prefill axes existed lack them: the defaults.
                   quant_mode=record.get("quant_mode", "train"), prefill=record.get("prefill", DEFAULT_PREFILL))

    def key_material(self) -> str:
        """Canonical JSON of every field (the cache key starts from this)."""
        return json.dumps({**asdict(self), "overrides": [list(kv) for kv in self.overrides]}, sort_keys=True)


# Depths beyond any real decoder stack (MaxText's deepest, llama3.1-405b, has 126 layers; deepseek3-671b 61) are
# mistakes: an unrolled lowering of 10^9 layers runs until it is killed. 1024 leaves 8x headroom for models to come.
MAX_DEPTH = 1024
# More shards than series leaves shards empty; a CI matrix has far fewer jobs (GitHub Actions: 256 per workflow).
MAX_SHARDS = 1024
# Shown of an --only key's known values before "and N more" (a matrix has ~120 ids).
KNOWN_VALUES_SHOWN = 12


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot go into a file name, a terminal line or a report as it is, or None.

    Control and format characters (NUL, ESC, BEL, newlines, bidirectional overrides) would reach every sink the
    value is printed to; the id's parts name files, so they are refused where they are configured.
    """
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return f"contains the control character {ascii(ch)[1:-1]}"
    return None


def id_part_problem(value: str) -> str | None:
    """Why ``value`` (a model name, a quantization...) cannot be one part of a cell id, or None.

    A cell id names its golden files (``golden/<id>.json``), so a part is one path component: no ``/`` or
    ``\\``, not ``.`` / ``..`` nor hidden (the golden reader skips dot folders); it is also one token of
    ``--only id=...,key=...`` and of ``hlo-audit rng <cell id>``, so no whitespace and no comma.
    """
    if not value:
        return "is empty"
    if problem := text_problem(value):
        return problem
    for ch, why in (("/", "each part of a cell id is one folder or file name under golden_dir"),
                    ("\\", "each part of a cell id is one folder or file name under golden_dir"),
                    (",", "a comma separates --only values")):
        if ch in value:
            return f"contains {ch!r} ({why})"
    if value.startswith("."):
        return "starts with '.' (a cell id's parts name folders; '.', '..' and hidden folders are refused)"
    if any(ch.isspace() for ch in value):
        return "contains whitespace (a cell id is one word on a command line)"
    return None


def parse_only(spec: str | Sequence[str] | None) -> dict[str, set[str]]:
    """``model=llama3-8b,quant=int8,quant=fp8`` -> {"model": {"llama3-8b"}, "quant": {"int8", "fp8"}}.

    Several specs (``--only`` given more than once) combine as one: AND across keys, OR within a key.
    """
    filters: dict[str, set[str]] = {}
    specs = [spec] if isinstance(spec, str) else list(spec or ())
    for one in specs:
        for item in one.split(","):
            key, sep, value = item.strip().partition("=")
            if not sep or not value:
                raise MatrixError(f"--only expects key=value[,key=value...], got {item.strip()!r}")
            if key not in FILTER_KEYS:
                raise MatrixError(f"--only: unknown key {key!r} (known: {', '.join(FILTER_KEYS)})")
            filters.setdefault(key, set()).add(value)
    return filters


def matches(cell: Cell, filters: Mapping[str, Iterable[str]]) -> bool:
    record = cell.record()
    return all(str(record[key]) in values for key, values in filters.items())


def matches_rule(cell: Cell, rule: Mapping[str, object]) -> bool:
    """An exclude rule or a waiver's cell table: every key equals the cell's (``scan`` as on/off); a list value
    is a list of alternatives (``quant = ["fp8", "nanoo_fp8"]``)."""
    return matches(cell, {k: {str(x) for x in v} if isinstance(v, (list, tuple)) else {str(v)}
                          for k, v in rule.items()})


def known_values(cells: Iterable[Cell], key: str) -> list[str]:
    """The values ``key`` takes over ``cells``, as ``--only`` spells them (depths in numeric order)."""
    values = {str(c.record()[key]) for c in cells} - {""}
    return sorted(values, key=lambda v: (int(v),) if key == "layers" else (0, v))


def _listed(values: list[str]) -> str:
    shown = ", ".join(values[:KNOWN_VALUES_SHOWN]) or "none"
    more = len(values) - KNOWN_VALUES_SHOWN
    return shown + (f" and {more} more (see `hlo-audit list`)" if more > 0 else "")


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """``2/4`` -> (2, 4): the second of four shards (1-based, as CI matrices count)."""
    if not spec:
        return None
    m = re.fullmatch(r"([0-9]+)/([0-9]+)", spec.strip())
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise MatrixError(f"--shard expects K/N with 1 <= K <= N, got {spec!r}")
    k, n = int(m.group(1)), int(m.group(2))
    if n > MAX_SHARDS:
        raise MatrixError(f"--shard {spec}: at most {MAX_SHARDS} shards (more shards than depth series are empty)")
    return k, n


def selection(cells: Iterable[Cell], only: str | Sequence[str] | None = None) -> list[Cell]:
    """The cells ``--only`` keeps, in id order. A selection of no cell is an error, never an empty pass: each
    value given must match some cell (``layers=two``, ``scan=true``, ``quant==none`` name the key's known
    values), and so must the values together."""
    universe = sorted(cells, key=lambda c: c.id)
    filters = parse_only(only)
    for key, values in filters.items():
        known = known_values(universe, key)
        for value in sorted(set(values) - set(known)):
            raise MatrixError(f"--only {key}={value} matched no cell; known values of {key}: {_listed(known)}")
    chosen = [c for c in universe if matches(c, filters)]
    if not chosen:
        given = " and ".join(f"{k}={'|'.join(sorted(v))}" for k, v in filters.items())
        raise MatrixError(f"--only matched no cell: no cell has {given} (see `hlo-audit list`)" if filters
                          else "the matrix has no cell (every combination is excluded?)")
    return chosen


def shard_of(chosen: Sequence[Cell], k: int, n: int) -> list[Cell]:
    """Shard ``k`` of ``n`` of a selection.

    Shards are dealt by depth series, longest first and then in id order, each to the shard with the fewest
    cells so far: a series stays whole in one shard, because the RNG-scaling rule needs all its depths, and
    series of different lengths (a train series of two depths, a one-depth inference series) leave the shards
    even. A shard may be empty when there are more shards than series.
    """
    chosen = sorted(chosen, key=lambda c: c.id)
    sizes = Counter(c.series for c in chosen)  # in order of each series' first (smallest) id
    load = [0] * n
    mine = set()
    for s, size in sorted(sizes.items(), key=lambda kv: -kv[1]):  # stable: id order among equal lengths
        shard_index = load.index(min(load))
        load[shard_index] += size
        if shard_index == k - 1:
            mine.add(s)
    return [c for c in chosen if c.series in mine]


def select(cells: Iterable[Cell], only: str | Sequence[str] | None = None, shard: str | None = None) -> list[Cell]:
    """Filter by --only (``selection``), then keep shard K of N (``shard_of``)."""
    chosen = selection(cells, only)
    picked = parse_shard(shard)
    return chosen if picked is None else shard_of(chosen, *picked)


def fingerprint(cells: Iterable[Cell]) -> str:
    """A hash of the cells' ids: what every shard of one run records, so ``merge`` can tell the run's shards apart
    from another matrix's."""
    return hashlib.sha256("\n".join(sorted(c.id for c in cells)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Axes:
    """One series of the matrix: the values of each axis whose cross product gives its cells."""

    models: tuple[str, ...]
    scans: tuple[bool, ...]
    quants: tuple[str, ...]
    layers: tuple[int | str, ...]  # ints, or "full" for the model's real depth
    batch: int = 1
    seq: int = 128
    platform: str = "cpu"
    devices: tuple[str, ...] = ("",)  # the devices the platform names ("": the host's own)
    stage: str = "lowered"
    steps: tuple[str, ...] = ("train",)
    quant_modes: tuple[str, ...] = ("train",)
    prefill: int = DEFAULT_PREFILL
    overrides: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # model -> MaxText key -> value


def expand(target: str, axes: Axes, layers_for: Mapping[str, Sequence[int]], excluded) -> list[Cell]:
    """The cross product of one series, minus excluded combinations, in a stable order."""
    cells = []
    for model in axes.models:
        model_overrides = tuple(sorted((k, str(v)) for k, v in axes.overrides.get(model, {}).items()))
        for scan, quant, quant_mode, layers, step, device in itertools.product(
                axes.scans, axes.quants, axes.quant_modes, layers_for[model], axes.steps, axes.devices):
            # A train step prefills nothing: its cells keep the default, so a series' prefill never splits them.
            prefill = axes.prefill if step != TRAIN_STEP else DEFAULT_PREFILL
            cell = Cell(model=model, scan=scan, quant=quant, layers=layers, target=target, batch=axes.batch,
                        seq=axes.seq, platform=axes.platform, stage=axes.stage, overrides=model_overrides,
                        step=step, device=device, quant_mode=quant_mode, prefill=prefill)
            if not excluded(cell):
                cells.append(cell)
    return sorted(set(cells), key=lambda c: c.id)
