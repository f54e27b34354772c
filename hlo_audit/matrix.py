"""Cells of the audit matrix: one lowering each, with a stable id.

A cell is everything that decides what HLO comes out: target, model, scan on/off, quantization and its AQT
mode, depth, the step (MaxText's train step, or an inference step), batch, sequence and prefill length, the
platform and the device it names (a TPU topology, a CUDA architecture: ``hlo_audit.platforms`` says what a
device name means), the stage (lowered, optimized or compiled) and per-model overrides. Its id is what a golden
file, a pytest item and a report row are named by, so it must never depend on dict order or run order.
"""

from __future__ import annotations

import itertools
import json
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
        """``llama3-8b/scan-off/int8/L2``; step, platform, stage, batch/seq/prefill appear only when not the defaults."""
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


def parse_only(spec: str | None) -> dict[str, set[str]]:
    """``model=llama3-8b,quant=int8,quant=fp8`` -> {"model": {"llama3-8b"}, "quant": {"int8", "fp8"}}."""
    filters: dict[str, set[str]] = {}
    if not spec:
        return filters
    for item in spec.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not value:
            raise MatrixError(f"--only expects key=value[,key=value...], got {item.strip()!r}")
        if key not in FILTER_KEYS:
            raise MatrixError(f"--only: unknown key {key!r} (known: {', '.join(FILTER_KEYS)})")
        filters.setdefault(key, set()).add(value)
    return filters


def matches(cell: Cell, filters: dict[str, set[str]]) -> bool:
    record = cell.record()
    return all(str(record[key]) in values for key, values in filters.items())


def matches_rule(cell: Cell, rule: Mapping[str, object]) -> bool:
    """An exclude rule or a waiver's cell table: every key equals the cell's (``scan`` as on/off)."""
    return matches(cell, {k: {str(v)} for k, v in rule.items()})


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """``2/4`` -> (2, 4): the second of four shards (1-based, as CI matrices count)."""
    if not spec:
        return None
    k, sep, n = spec.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise MatrixError(f"--shard expects K/N with 1 <= K <= N, got {spec!r}")
    return int(k), int(n)


def select(cells: Iterable[Cell], only: str | None = None, shard: str | None = None) -> list[Cell]:
    """Filter by --only, then keep shard K of N.

    Shards are dealt by depth series, longest first and then in id order, each to the shard with the fewest
    cells so far: a series stays whole in one shard, because the RNG-scaling rule needs all its depths, and
    series of different lengths (a train series of two depths, a one-depth inference series) leave the shards
    even.
    """
    filters = parse_only(only)
    chosen = sorted((c for c in cells if matches(c, filters)), key=lambda c: c.id)
    picked = parse_shard(shard)
    if picked is None:
        return chosen
    k, n = picked
    sizes = Counter(c.series for c in chosen)  # in order of each series' first (smallest) id
    load = [0] * n
    mine = set()
    for s, size in sorted(sizes.items(), key=lambda kv: -kv[1]):  # stable: id order among equal lengths
        shard_index = load.index(min(load))
        load[shard_index] += size
        if shard_index == k - 1:
            mine.add(s)
    return [c for c in chosen if c.series in mine]


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
