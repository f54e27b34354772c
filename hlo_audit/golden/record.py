"""The golden record: what a cell looked like when a human last accepted it, and its JSON schema.

Per cell ``golden/<cell id>.json``: entry parameters by dtype and role, path-pattern groups, opcode histogram, the
state captured as constants, the depth series' per-layer slopes, a compiled cell's memory and cost, a GPU cell's
launches per step (kernels by kind, scalar, collectives, and by what they run and read), the content digests of its
Pallas / Mosaic / Triton kernels by name (``kernels``, only where it runs any: the text drops their bodies), and the
environment fingerprint (jax, jaxlib, flax, maxtext, libtpu for a TPU topology, platform, stage). Per cell (since
issue 26; a series' shallowest depth before), ``golden/<cell id>.hlo.txt``: the normalized module, named by the
summary's ``"hlo"`` key.
Keys are sorted and every item sits on its own line, so a PR diff of a golden reads like the change.

A summary is hlo-audit's when it is a JSON object whose ``"cell"`` is the id its path spells and which holds every
``REQUIRED_KEYS`` entry (``record_problem``): that marker is inside each file, not in a manifest beside them, so a
hand edit or a ``git checkout`` of one file keeps it and two pull requests that update different cells never
conflict over a shared list. The JSON is read into a ``GoldenRecord`` and written from one here, and nowhere else.

Each summary says which format wrote it (``"format"``, ``GOLDEN_FORMAT``; a summary without one is format 1, written
before formats were recorded): a record of the current format holds everything this version writes for its cell, so
one that lacks a part is damaged; an older one may lack parts the rules compare, and says so
(``golden.health``) until ``golden update`` rewrites it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hlo_audit.analysed import GOLDEN_LAUNCH_FIELDS
from hlo_audit.hlo.params import ParamCounts, ParamSummary
from hlo_audit.hlo.rng_keys import PlacedHazard, hazard_record_problem
from hlo_audit.hlo.text import HloParseError, parse_module
from hlo_audit.host_cost import HostFigure, figure_problem, leaves_per_call
from hlo_audit.matrix import Cell
from hlo_audit.results import LoweredCell
from hlo_audit.scaling import Series

SUMMARY_SUFFIX = ".json"
HLO_SUFFIX = ".hlo.txt"
REQUIRED_KEYS = ("entry_params", "by_dtype", "by_role", "groups", "environment")
# The format this version writes. 3: every lowered cell keeps its call's state leaves (``call_leaves``, issue 48: the
# host_cost rule's count, without which a deleted host figure turned the rule off). 2: every cell keeps its text
# (issue 26) and its kernels' digests (issue 25), and the summary says its format. 1: a summary without ``"format"``
# (a series' deeper depths kept no text, kernels no digests).
GOLDEN_FORMAT = 3
FIRST_FORMAT = 1
# hlo.constants.golden_summary's record: what a golden keeps of the state captured as constants, compared by
# hlo.diff.captured_delta (the HLO core's schema, passed back to it).
CapturedRecord = Mapping[str, Any]
Json = dict[str, Any]  # a golden summary as JSON has it (the edge: files in and out)


@dataclass(frozen=True)
class Increments:
    """RNG counter increments per step, by stream verdict and by stream pattern."""

    by_verdict: Mapping[str, int | float]
    by_pattern: Mapping[str, int | float]


@dataclass(frozen=True)
class GoldenLaunches:
    """What a golden keeps of a GPU cell's launches per step (``analysed.GOLDEN_LAUNCH_FIELDS``)."""

    total: int = 0
    scalar: int = 0
    collectives: int = 0
    reading_rng: int = 0
    by_category: Mapping[str, int] | None = None
    by_kind: Mapping[str, int] | None = None
    exact: bool | None = None
    from_module: bool | None = None
    groups: Mapping[str, int] | None = None


@dataclass(frozen=True)
class Slopes:
    """The depth series' per-layer slopes (entry parameters, by dtype and role; a GPU series' launches)."""

    depths: tuple[int, ...]
    total: float
    by_dtype: Mapping[str, float]
    by_role: Mapping[str, float]
    launches: Mapping[str, float] | None = None

    @property
    def rng_per_layer(self) -> float:
        return sum(self.by_role.get(k, 0) for k in ("rng_key", "rng_count"))


@dataclass(frozen=True)
class GoldenRecord(ParamCounts):
    """A golden summary as read: its entry parameters' counts (``ParamCounts``, what the cell's summary counts), and
    every other part it keeps."""

    cell: str
    environment: Mapping[str, str | None]
    hlo: str | None = None  # the text's file name (None: a golden written before every cell kept its text)
    opcodes: Mapping[str, int] | None = None
    memory: Mapping[str, int] | None = None
    cost: Mapping[str, float] | None = None
    constants: CapturedRecord | None = None  # None: written before captured state was recorded
    by_dtype_role: Mapping[str, int] | None = None  # "dtype:role" -> parameters
    groups_by_role: Mapping[str, Mapping[str, int]] | None = None
    rng_increments: Increments | None = None
    launches: GoldenLaunches | None = None
    slopes: Slopes | None = None
    # Kernel name -> content digests (hlo.kernels); None: the cell runs no kernel, or a golden written before they
    # were kept (not compared: no finding).
    kernels: Mapping[str, tuple[str, ...]] | None = None
    format: int = GOLDEN_FORMAT  # the format that wrote it (FIRST_FORMAT: a summary that names none)
    # The step's host work per call (``host_cost.HostFigure``, written by ``measure --record``); None: never recorded,
    # and the host_cost rule compares nothing.
    host: HostFigure | None = None
    # The step's timings when it was recorded (``measure.StepTiming``'s record, as written; read by ``measure``).
    measured: Mapping[str, Any] | None = None
    # The leaves the step's call flattens per call (``LoweredCell.call_leaves``), what the host_cost rule compares;
    # None: a golden of an older format, or a cell whose lowering did not say.
    call_leaves: int | None = None
    # The sizes the cell's config gave its target mesh (``LoweredCell.mesh_sizes``): its shardings' side of the
    # sharding rule's split arithmetic; None: the target said none, or a golden written before they were kept.
    mesh_sizes: Mapping[str, int | None] | None = None
    # The literal and reused keys of the program before XLA's passes, where the cell's stage text is XLA's and shows no
    # draw (``LoweredCell.key_hazards``): what the key rule compares with; None: a text that says them (stage lowered),
    # or a golden written before they were kept (nothing compared).
    key_hazards: tuple[PlacedHazard, ...] | None = None

    @property
    def leaves_per_call(self) -> int | None:
        """What it records of its call's state leaves: its count, else (an older golden) its host figure's; None:
        neither (the host_cost rule compares nothing, and the part it lacks is ``golden.health``'s)."""
        return leaves_per_call(self.call_leaves, self.host)

    @property
    def joint_counts(self) -> dict[tuple[str, str], int] | None:
        """(dtype, role) -> parameters; None for goldens written before they were recorded."""
        if self.by_dtype_role is None:
            return None
        return {tuple(key.split(":", 1)): n for key, n in self.by_dtype_role.items()}

    def as_result(self, cell: Cell) -> LoweredCell:
        """An ok result of ``cell`` with this golden's counts (a depth of a series this run did not lower)."""
        return LoweredCell(cell=cell, summary=ParamSummary(
            entry_params=self.entry_params, by_dtype=self.by_dtype, by_role=self.by_role, groups=self.groups,
            bytes_by_role={}))

    @classmethod
    def of(cls, result: LoweredCell, series: Series | None, with_hlo: bool) -> GoldenRecord:
        """What a golden keeps of an ok result, its series (None: a series of one depth) and whether it keeps the
        text."""
        s = result.summary
        return cls(
            cell=result.cell.id, entry_params=s.entry_params, by_dtype=s.by_dtype, by_role=s.by_role, groups=s.groups,
            environment=result.environment, hlo=Path(result.cell.id + HLO_SUFFIX).name if with_hlo else None,
            opcodes=result.opcodes, memory=result.memory, cost=result.cost,
            constants=result.constants.golden_summary() if result.constants is not None else None,
            by_dtype_role={f"{dtype}:{role}": n for (dtype, role), (n, _) in result.by_dtype_role().items()}
            if result.params else None,
            groups_by_role=result.groups_by_role() if result.params else None,
            rng_increments=Increments(
                {verdict: result.rng.increments(verdict) for verdict in _VERDICTS},
                {p.pattern: p.increments for p in result.rng.patterns}) if result.rng is not None else None,
            launches=GoldenLaunches(**result.launches.golden_summary()) if result.launches is not None else None,
            slopes=None if series is None else Slopes(
                depths=series.depths, total=series.total.slope,
                by_dtype={k: v.slope for k, v in series.by_dtype.items()},
                by_role={k: v.slope for k, v in series.by_role.items()},
                launches={k: v.slope for k, v in series.launches.items()} if series.launches else None),
            kernels=result.kernels_by_name, host=result.host, call_leaves=result.call_leaves,
            mesh_sizes=result.mesh_sizes,
            key_hazards=result.key_hazards)

    def to_json(self) -> Json:
        record = {"cell": self.cell, "entry_params": self.entry_params, "by_dtype": self.by_dtype,
                  "by_role": self.by_role, "groups": self.groups, "opcodes": self.opcodes,
                  "environment": self.environment, "hlo": self.hlo, "format": self.format}
        for key in ("memory", "cost", "constants", "by_dtype_role", "groups_by_role"):
            if getattr(self, key) is not None:
                record[key] = getattr(self, key)
        if self.rng_increments is not None:
            record["rng_increments"] = {"by_verdict": self.rng_increments.by_verdict,
                                        "by_pattern": self.rng_increments.by_pattern}
        if self.launches is not None:
            record["launches"] = {k: v for k, v in vars(self.launches).items() if v is not None}
        if self.slopes is not None:
            record["slopes"] = {"depths": list(self.slopes.depths), "total": self.slopes.total,
                                "by_dtype": self.slopes.by_dtype, "by_role": self.slopes.by_role}
            if self.slopes.launches is not None:
                record["slopes"]["launches"] = self.slopes.launches
        if self.kernels is not None:
            record["kernels"] = {name: list(digests) for name, digests in self.kernels.items()}
        if self.host is not None:
            record["host"] = self.host.to_record()
        if self.measured is not None:
            record["measured"] = dict(self.measured)
        if self.call_leaves is not None:
            record["call_leaves"] = self.call_leaves
        if self.mesh_sizes is not None:
            record["mesh_sizes"] = dict(self.mesh_sizes)
        if self.key_hazards is not None:
            record["key_hazards"] = [h.to_record() for h in self.key_hazards]
        if self.opcodes is None:
            del record["opcodes"]
        return record

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> GoldenRecord:
        """A summary ``record_problem`` accepted; keys it does not check are read as found."""
        increments, launches, slopes = record.get("rng_increments"), record.get("launches"), record.get("slopes")
        return cls(
            cell=record["cell"], entry_params=record["entry_params"], by_dtype=record["by_dtype"],
            by_role=record["by_role"], groups=record["groups"], environment=record["environment"],
            hlo=record.get("hlo"), opcodes=record.get("opcodes"), memory=record.get("memory"),
            cost=record.get("cost"), constants=record.get("constants"), by_dtype_role=record.get("by_dtype_role"),
            groups_by_role=record.get("groups_by_role"),
            rng_increments=None if increments is None else Increments(increments["by_verdict"],
                                                                      increments["by_pattern"]),
            launches=None if launches is None else GoldenLaunches(
                **{k: v for k, v in launches.items() if k in GOLDEN_LAUNCH_FIELDS}),
            slopes=None if slopes is None else Slopes(
                depths=tuple(slopes.get("depths", ())), total=slopes.get("total", 0),
                by_dtype=slopes.get("by_dtype", {}), by_role=slopes.get("by_role", {}),
                launches=slopes.get("launches")),
            kernels=None if record.get("kernels") is None else {
                name: tuple(digests) for name, digests in record["kernels"].items()},
            format=record.get("format", FIRST_FORMAT),
            host=None if record.get("host") is None else HostFigure.from_record(record["host"]),
            measured=record.get("measured"), call_leaves=record.get("call_leaves"),
            mesh_sizes=record.get("mesh_sizes"),
            key_hazards=None if record.get("key_hazards") is None else tuple(
                PlacedHazard.from_record(h) for h in record["key_hazards"]))


_VERDICTS = ("drawn", "carried", "unknown")


@dataclass(frozen=True)
class Golden:
    cell_id: str
    record: GoldenRecord | None  # None when damaged
    hlo: str | None
    # The summary cannot be used (not UTF-8, not JSON, not a golden summary, another cell's): why, naming the
    # file. Nothing else is compared; the gate reports it as a missing golden, and `golden update` rewrites it.
    damaged: str | None = None
    # The summary names a text that is missing or unreadable: why. The counts still gate.
    text_problem: str | None = None
    summary: Path | None = None  # the summary's path, where one was read
    # The summary carries hlo-audit's marker but its keys claim what hlo-audit never writes (a key twice, an unknown
    # key, a malformed or impossible value: ``record.claim_problem``): ``damaged`` says why, naming file and key; a
    # check refuses it (exit 2, ``gate.Gate.judge``), ``golden update`` rewrites it.
    invalid: bool = False

    @property
    def environment(self) -> Mapping[str, str | None]:
        return self.record.environment if self.record is not None else {}

    @property
    def names_text(self) -> bool:
        return self.record is not None and self.record.hlo is not None

    def text_parse_problem(self) -> str | None:
        """Why the golden text is not an HLO module hlo-audit reads, or None (parsed only when asked: the gate asks
        when the text differs from the cell's, to tell a damaged golden from a changed program)."""
        if self.hlo is None:
            return None
        try:
            parse_module(self.hlo, str(self.cell_id) + HLO_SUFFIX)
        except (HloParseError, RecursionError) as exc:
            return f"golden text {self.cell_id}{HLO_SUFFIX} is not a module hlo-audit reads: {exc}"
        return None

    def text_damage(self, now_text: str | None) -> str | None:
        """Why this golden's text cannot be compared with ``now_text`` (the cell's canonical text): the text it names
        is missing or not UTF-8, or it differs and is not a module hlo-audit reads (parsed only then: a changed
        program is told from a damaged golden); None where it can."""
        return self.text_problem or (self.text_parse_problem() if self.hlo != now_text else None)


def dumps(record: Mapping[str, Any]) -> str:
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


class DuplicateKey(ValueError):
    """A JSON object that names one key twice (``json`` keeps the last; a reviewer reads the first)."""

    def __init__(self, key: str):
        super().__init__(f"key {key!r} appears twice (json keeps the last, a reader sees the first)")
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(key)
        seen[key] = value
    return seen


class NonFinite(ValueError):
    """NaN or Infinity: ``json`` reads them, hlo-audit never writes them."""


def _no_constant(name: str):
    raise NonFinite(f"{name} is no number a golden holds")


def loads(text: str) -> Any:
    """A golden summary's JSON, strictly: a key twice in one object (``DuplicateKey``) or NaN / Infinity
    (``NonFinite``) refused; ``loads_lenient`` reads it as ``json`` would (last key wins)."""
    return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)


def loads_lenient(text: str) -> Any:
    return json.loads(text)


def _is_int(v, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_counts(value) -> bool:
    return isinstance(value, dict) and all(_is_int(v) for v in value.values())


def _is_number_table(value, low: float | None = None) -> bool:
    return isinstance(value, dict) and all(_is_number(v) and (low is None or v >= low) for v in value.values())


def _constants_ok(value) -> bool:
    """The parts of a golden's ``constants`` the count ratchet reads (``hlo.diff.captured_delta``)."""
    def side(d):
        return isinstance(d, dict) and _is_counts(d.get("by_dtype")) and _is_counts(d.get("bytes_by_dtype"))
    if not isinstance(value, dict) or not side(value.get("large")):
        return False
    keys = value.get("literal_keys")
    captured = value.get("captured")
    return _is_int(keys) and (captured is None or (side(captured) and _is_counts(captured.get("groups"))))


def _shaped(value, fields: Mapping[str, Any], required: tuple[str, ...] = ()) -> str | None:
    """Why ``value`` is not an object of exactly ``fields`` (name -> check) with ``required`` among them: the
    first key that is unknown, missing or malformed, as ``.key`` for the message; None where it is."""
    if not isinstance(value, dict):
        return ""
    unknown = next((k for k in value if k not in fields), None)
    if unknown is not None:
        return f".{unknown}"
    missing = next((k for k in required if k not in value), None)
    if missing is not None:
        return f".{missing}"
    return next((f".{k}" for k, ok in fields.items() if k in value and not ok(value[k])), None)


def _spread_ok(v) -> bool:
    return isinstance(v, list) and len(v) == 3 and all(_is_number(x) and x >= 0 for x in v) and v[0] <= v[1] <= v[2]


def _optional_bytes(v) -> bool:
    return v is None or _is_int(v)


def _counts_by_key(v) -> bool:
    return isinstance(v, dict) and all(_is_counts(x) for x in v.values())


_LAUNCH_FIELDS = {"total": _is_int, "scalar": _is_int, "collectives": _is_int, "reading_rng": _is_int,
                  "by_category": _is_counts, "by_kind": _is_counts, "groups": _is_counts,
                  "exact": lambda v: isinstance(v, bool), "from_module": lambda v: isinstance(v, bool)}
_SLOPE_FIELDS = {"depths": lambda v: isinstance(v, list) and bool(v) and all(_is_int(d, 1) for d in v),
                 "total": _is_number, "by_dtype": _is_number_table, "by_role": _is_number_table,
                 "launches": lambda v: v is None or _is_number_table(v)}
_HOST_FIELDS = {"caller": lambda v: v in ("nnx.jit", "jax.jit"), "leaves": _is_int, "per_call_us": _spread_ok,
                "machine": lambda v: isinstance(v, str)}
_MEASURED_FIELDS = {"cell": lambda v: isinstance(v, str), "caller": lambda v: isinstance(v, str), "leaves": _is_int,
                    "compile_s": lambda v: _is_number(v) and v >= 0, "blocked_ms": _spread_ok, "queued_ms": _spread_ok,
                    "host_ms": _spread_ok, "argument_bytes": _optional_bytes, "temp_bytes": _optional_bytes,
                    "runtime_peak_bytes": _optional_bytes, "device": lambda v: isinstance(v, str)}
# Nested objects: their keys and each key's check (``_shaped``), and the keys they must have.
_NESTED = {
    "rng_increments": ({"by_verdict": _is_number_table, "by_pattern": _is_number_table}, ("by_verdict", "by_pattern")),
    "launches": (_LAUNCH_FIELDS, ()),
    "slopes": (_SLOPE_FIELDS, ("depths", "total", "by_dtype", "by_role")),
    "host": (_HOST_FIELDS, ("caller", "leaves", "per_call_us")),
    "measured": (_MEASURED_FIELDS, ("cell", "caller", "leaves", "compile_s", "blocked_ms", "queued_ms", "host_ms")),
}

# What each key of a summary must be for the gate and the report to read it; optional keys may be absent.
_SUMMARY_KEYS = {
    "entry_params": _is_int,
    "by_dtype": _is_counts, "by_role": _is_counts, "groups": _is_counts,
    "environment": lambda v: isinstance(v, dict) and all(v2 is None or isinstance(v2, str) for v2 in v.values()),
}
_OPTIONAL_KEYS = {
    "opcodes": _is_counts, "by_dtype_role": _is_counts, "memory": lambda v: _is_number_table(v, 0),
    "cost": _is_number_table, "constants": _constants_ok, "groups_by_role": _counts_by_key,
    "kernels": lambda v: isinstance(v, dict) and all(
        isinstance(d, list) and all(isinstance(x, str) for x in d) for d in v.values()),
    "format": lambda v: _is_int(v, FIRST_FORMAT),
    "host": lambda v: figure_problem(v) is None, "measured": lambda v: isinstance(v, dict), "call_leaves": _is_int,
    "mesh_sizes": lambda v: isinstance(v, dict) and all(isinstance(k, str) and (s is None or _is_int(s, 1))
                                                         for k, s in v.items()),
    "hlo": lambda v: v is None or isinstance(v, str), "cell": lambda v: isinstance(v, str),
    "key_hazards": lambda v: isinstance(v, list) and all(hazard_record_problem(h) is None for h in v),
}
KNOWN_KEYS = frozenset({*_SUMMARY_KEYS, *_OPTIONAL_KEYS, *_NESTED})
# The most state leaves a host figure may claim per entry parameter of its cell (+ a margin for a few small ones):
# the leaves are the step's arguments, whose arrays are the entry's parameters (jax prunes only unused ones).
HOST_LEAVES_PER_PARAM, HOST_LEAVES_MARGIN = 4, 64


def is_marked(record, cell_id: str) -> bool:
    """Whether ``record`` carries hlo-audit's marker for ``cell_id``: an object whose ``"cell"`` is the id its path
    spells, holding every required key (module doc)."""
    return isinstance(record, dict) and record.get("cell") == cell_id and all(k in record for k in REQUIRED_KEYS)


def claim_problem(record: Mapping[str, Any]) -> str | None:
    """Why a marked summary is not one hlo-audit could have written (its claims checked, not trusted), naming the
    key: unknown keys, a malformed value at any depth, or figures that cannot be (counts that do not add up to the
    entry's parameters, a host figure of more state leaves than the entry could pass); None where it is sound."""
    unknown = next((k for k in record if k not in KNOWN_KEYS), None)
    if unknown is not None:
        return f"unknown key {unknown!r} (hlo-audit writes {', '.join(sorted(KNOWN_KEYS))})"
    for key, ok in (*_SUMMARY_KEYS.items(), *((k, v) for k, v in _OPTIONAL_KEYS.items() if k in record)):
        if not ok(record[key]):
            return f"{key!r} is malformed"
    for key, (fields, required) in _NESTED.items():
        where = _shaped(record[key], fields, required) if key in record else None
        if where is not None:
            return f"{key + where!r} is malformed"
    problem = _environment_problem(record["environment"])
    if problem is not None:
        return problem
    total = record["entry_params"]
    for key in ("by_dtype", "by_role", "by_dtype_role"):
        if key in record and sum(record[key].values()) != total:
            return f"{key!r} adds up to {sum(record[key].values())}, not its entry_params {total}"
    host = record.get("host")
    if host is not None and host["leaves"] > HOST_LEAVES_PER_PARAM * total + HOST_LEAVES_MARGIN:
        return (f"'host.leaves' is {host['leaves']}: no figure of a step whose entry has {total} parameters "
                "(its leaves are those parameters' arrays)")
    return None


def _environment_problem(environment: Mapping[str, str | None]) -> str | None:
    """Why a golden's environment is not as hlo-audit writes it: a name or version with stray whitespace, or empty
    (``"0.12.0.1 "`` differs from the running jax's ``0.12.0.1`` and would read as another compiler stack, relaxing
    the text rules, issue 48); None where every entry is clean. Which keys it may hold is the running stack's to say
    (``stack.environment_problem``)."""
    for key, value in environment.items():
        for said in (key, value):
            if said is not None and (not said.strip() or said != said.strip() or not said.isprintable()):
                return f"'environment.{key.strip()}' is malformed: {said!r} has stray whitespace, or nothing"
    return None


def record_problem(record, cell_id: str) -> str | None:
    """Why ``record`` is not hlo-audit's golden summary of ``cell_id``, or None: the marker (``is_marked``) and every
    key's claim (``claim_problem``)."""
    return summary_problem(record, cell_id)[0]


def summary_problem(record, cell_id: str) -> tuple[str | None, bool]:
    """(why ``record`` is not hlo-audit's golden summary of ``cell_id``, or None; whether it carries the marker, so
    that the problem is in a golden's keys: a claim the check refuses, exit 2, where the rest is damage to report)."""
    if not isinstance(record, dict):
        return f"not a golden summary: a JSON {type(record).__name__}, not an object", False
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        return f"not a golden summary: missing {missing[0]!r}", False
    if record.get("cell") != cell_id:
        return (f"not the golden of {cell_id}: its \"cell\" is {record.get('cell')!r}" if "cell" in record
                else "not a golden summary: missing 'cell'"), False
    if isinstance(record.get("format"), int) and record["format"] > GOLDEN_FORMAT:
        return (f"written by a newer hlo-audit (golden format {record['format']}; this one reads formats up to "
                f"{GOLDEN_FORMAT})"), False
    problem = claim_problem(record)
    if problem is not None:
        return f"not a golden summary: {problem}", True
    hlo = record.get("hlo")
    if hlo is not None and hlo != Path(cell_id + HLO_SUFFIX).name:
        return f"not a golden summary: 'hlo' must be null or {Path(cell_id + HLO_SUFFIX).name!r}, got {hlo!r}", True
    return None, True
