"""What a cell's result keeps of its module's analysis, typed: its entry parameters, RNG streams, constants and
(for a GPU program) launches per step.

The HLO core's objects (``hlo.params.EntryParam``, ``hlo.rng_streams.RngReport``, ``hlo.constants.ConstantReport``,
``hlo.launches.LaunchReport``) hold the parsed module; a result outlives it (the results cache, a worker process, a
merged shard), so it keeps these smaller records. Each is built from its analysis object once (``of``) and has one
record schema (``to_record`` / ``from_record``: the results cache's entries and the JSON formats), defined here
beside the type; ``test_analysed`` holds each ``of(x).to_record()`` to the core's own ``x.to_record()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from hlo_audit.hlo.constants import ConstantReport, frozen_rng, golden_summary
from hlo_audit.hlo.launch_groups import LaunchGroup, group_counts
from hlo_audit.hlo.launches import LaunchReport
from hlo_audit.hlo.model_work import ModelWork
from hlo_audit.hlo.params import RNG_ROLES, ROLES, EntryParam
from hlo_audit.hlo.rng_keys import PlacedHazard
from hlo_audit.hlo.rng_streams import VERDICTS, PatternCount, RngReport, Stream
from hlo_audit.usage import EXIT_DIFFERENCE, EXIT_OK

Record = dict[str, Any]  # a record of the results cache's schema (an edge: JSON in and out)


class Role(StrEnum):
    """What an entry parameter holds (``hlo.params.ROLES``)."""

    RNG_KEY = "rng_key"
    RNG_COUNT = "rng_count"
    WEIGHT = "weight"
    OPTIMIZER_STATE = "optimizer_state"
    STEP = "step"
    BATCH_STAT = "batch_stat"
    CACHE = "cache"
    INPUT = "input"
    OTHER = "other"

    @property
    def is_rng(self) -> bool:
        return self.value in RNG_ROLES


assert tuple(Role) == ROLES, "hlo.params.ROLES changed: Role follows it"


class StreamVerdict(StrEnum):
    """What an RNG stream's key does in the step (``hlo.rng_streams``): drawn from, carried (dead state) or unknown."""

    DRAWN = "drawn"
    CARRIED = "carried"
    UNKNOWN = "unknown"


assert tuple(StreamVerdict) == VERDICTS, "hlo.rng_streams.VERDICTS changed: StreamVerdict follows it"


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


# --------------------------------------------------------------------------------------------------------------
# Entry parameters
# --------------------------------------------------------------------------------------------------------------


class _ByName:
    """A parameter record written before the layer prefix was kept: explain finds the layer container by name."""

    def __repr__(self) -> str:
        return "BY_NAME"


BY_NAME: Final = _ByName()


@dataclass(frozen=True)
class Param:
    """One entry parameter as a result keeps it."""

    index: int
    path: str
    role: Role
    dtype: str
    dims: tuple[int, ...]
    bytes: int
    pattern: str
    kind: str | None = None  # the leaf's type, when the tool lowered the step
    # Up to the innermost layer container (``state.layers_*``); None outside layers; BY_NAME when not recorded.
    layer_prefix: str | None | _ByName = None

    def __post_init__(self) -> None:
        if not isinstance(self.role, Role):  # "weight" as a caller may spell it
            object.__setattr__(self, "role", Role(self.role))

    @classmethod
    def of(cls, p: EntryParam) -> Param:
        return cls(index=p.index, path=p.path, role=Role(p.role), dtype=p.dtype, dims=tuple(p.shape.dims),
                   bytes=p.bytes, pattern=p.pattern, kind=p.kind, layer_prefix=p.layer_prefix)

    def to_record(self) -> Record:
        return {"index": self.index, "path": self.path, "role": self.role.value, "dtype": self.dtype,
                "dims": list(self.dims), "bytes": self.bytes, "pattern": self.pattern, "kind": self.kind,
                "layer_prefix": None if self.layer_prefix is BY_NAME else self.layer_prefix}

    @classmethod
    def from_record(cls, r: Mapping) -> Param:
        return cls(index=r["index"], path=r["path"], role=Role(r["role"]), dtype=r["dtype"], dims=tuple(r["dims"]),
                   bytes=r["bytes"], pattern=r["pattern"], kind=r.get("kind"),
                   layer_prefix=r["layer_prefix"] if "layer_prefix" in r else BY_NAME)


# --------------------------------------------------------------------------------------------------------------
# RNG streams
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RngStream:
    path: str
    pattern: str
    verdict: StreamVerdict
    where: str  # drawn: the random-bit site first reached; unknown: where the flow left the analysis
    key: int | None  # the key's entry parameter number
    count: int | None
    params: int
    bytes: int
    increments: int | float  # counter increments per step

    @classmethod
    def of(cls, s: Stream) -> RngStream:
        return cls(path=s.path, pattern=s.pattern, verdict=StreamVerdict(s.verdict), where=s.where,
                   key=s.key.index if s.key else None, count=s.count.index if s.count else None, params=s.params,
                   bytes=s.bytes, increments=_number(s.increments))

    def to_record(self) -> Record:
        return {"path": self.path, "pattern": self.pattern, "verdict": self.verdict.value, "where": self.where,
                "key": self.key, "count": self.count, "params": self.params, "bytes": self.bytes,
                "increments": self.increments}

    @classmethod
    def from_record(cls, r: Mapping) -> RngStream:
        return cls(path=r["path"], pattern=r["pattern"], verdict=StreamVerdict(r["verdict"]), where=r["where"],
                   key=r["key"], count=r["count"], params=r["params"], bytes=r["bytes"], increments=r["increments"])


@dataclass(frozen=True)
class RngPattern:
    """The streams of one pattern: how many of each verdict, and what the carried ones cost."""

    pattern: str
    streams: int
    drawn: int
    carried: int
    unknown: int
    dead_params: int
    dead_increments: int | float
    drawn_increments: int | float
    unknown_increments: int | float
    where: str  # for unknown streams, the first place the analysis lost them
    paths: Mapping[str, tuple[str, ...]]  # verdict -> the streams' paths

    @property
    def verdict(self) -> StreamVerdict:
        """The pattern's worst: carried when any stream is, else unknown when any is, else drawn."""
        return (StreamVerdict.CARRIED if self.carried else StreamVerdict.UNKNOWN if self.unknown
                else StreamVerdict.DRAWN)

    @property
    def increments(self) -> int | float:
        """Counter increments per step of every stream of the pattern."""
        return self.drawn_increments + self.dead_increments + self.unknown_increments

    @classmethod
    def of(cls, p: PatternCount) -> RngPattern:
        return cls.from_record(p.to_record())

    def to_record(self) -> Record:
        return {"pattern": self.pattern, "streams": self.streams, "drawn": self.drawn, "carried": self.carried,
                "unknown": self.unknown, "dead_params": self.dead_params, "dead_increments": self.dead_increments,
                "drawn_increments": self.drawn_increments, "unknown_increments": self.unknown_increments,
                "where": self.where, "paths": {v: list(paths) for v, paths in self.paths.items()}}

    @classmethod
    def from_record(cls, r: Mapping) -> RngPattern:
        return cls(pattern=r["pattern"], streams=r["streams"], drawn=r["drawn"], carried=r["carried"],
                   unknown=r["unknown"], dead_params=r["dead_params"], dead_increments=r["dead_increments"],
                   drawn_increments=r["drawn_increments"], unknown_increments=r["unknown_increments"],
                   where=r["where"], paths={v: tuple(paths) for v, paths in r.get("paths", {}).items()})


def placed_text(source: str, op_name: str, fallback: str) -> str:
    """``model.py:12 (jit(step)/mul)``: where an instruction is, as a record keeps it (its source line, jax's
    op_name); ``fallback`` (its computation and instruction) where neither is known."""
    return " ".join(x for x in (source, f"({op_name})" if op_name else "") if x) or fallback


@dataclass(frozen=True)
class RngKeyHazard:
    """A key drawn from as a literal, or drawn from twice (``hlo.rng_keys``): what it is (``literal key``, ``reused
    key``, ``key reused across loop iterations``), its draws per step, where each draw is (``model.py:12`` and jax's
    op_name, else its computation and instruction) and the state paths its key comes from."""

    kind: str  # literal | reused
    subject: str
    draws: int
    places: tuple[str, ...]
    paths: tuple[str, ...]

    @classmethod
    def of(cls, p: PlacedHazard) -> RngKeyHazard:
        places = tuple(placed_text(place.source, place.op_name, f"{place.computation}/{name}")
                       for place, (_, name) in zip(p.places, p.hazard.sites))
        return cls(kind=p.hazard.kind, subject=p.subject, draws=p.hazard.draws, places=places, paths=p.paths)

    def to_record(self) -> Record:
        return {"kind": self.kind, "subject": self.subject, "draws": self.draws, "places": list(self.places),
                "paths": list(self.paths)}

    @classmethod
    def from_record(cls, r: Mapping) -> RngKeyHazard:
        return cls(kind=r["kind"], subject=r["subject"], draws=r["draws"], places=tuple(r["places"]),
                   paths=tuple(r["paths"]))


@dataclass(frozen=True)
class RngSummary:
    """Every RNG stream of a module by verdict, per pattern and (when kept) one by one (``hlo.rng_streams``)."""

    streams: int
    drawn: int
    carried: int
    unknown: int
    dead_params: int
    dead_bytes: int
    dead_increments: int | float
    drawn_increments: int | float
    unknown_increments: int | float
    increments_exact: bool  # False when a loop's trip count was unknown
    patterns: tuple[RngPattern, ...]
    stream_list: tuple[RngStream, ...] = ()
    # Literal keys drawn from and keys drawn from twice (``hlo.rng_keys``); the record has them only where there are.
    key_hazards: tuple[RngKeyHazard, ...] = ()

    @property
    def exit_code(self) -> int:
        """`rng`'s verdict: a difference when any stream is carried (dead RNG state) or any key is literal or reused."""
        return EXIT_DIFFERENCE if self.carried or self.key_hazards else EXIT_OK

    def of_kind(self, kind: str) -> tuple[RngKeyHazard, ...]:
        return tuple(h for h in self.key_hazards if h.kind == kind)

    def increments(self, verdict: StreamVerdict) -> int | float:
        return {StreamVerdict.DRAWN: self.drawn_increments, StreamVerdict.CARRIED: self.dead_increments,
                StreamVerdict.UNKNOWN: self.unknown_increments}[verdict]

    @property
    def dead_patterns(self) -> tuple[RngPattern, ...]:
        return tuple(p for p in self.patterns if p.carried)

    def verdict_of_param(self) -> dict[int, StreamVerdict]:
        """Entry parameter number -> its stream's verdict (keys and counts of the streams listed)."""
        return {n: s.verdict for s in self.stream_list for n in (s.key, s.count) if n is not None}

    @classmethod
    def of(cls, report: RngReport, keys: tuple[PlacedHazard, ...] = ()) -> RngSummary:
        counts = report.counts()
        return cls(streams=len(report.streams), drawn=counts["drawn"], carried=counts["carried"],
                   unknown=counts["unknown"], dead_params=report.dead_params,
                   dead_bytes=sum(s.bytes for s in report.dead), dead_increments=_number(report.dead_increments),
                   drawn_increments=_number(report.increments_of("drawn")),
                   unknown_increments=_number(report.increments_of("unknown")),
                   increments_exact=report.increments_exact,
                   patterns=tuple(RngPattern.of(p) for p in report.patterns()),
                   stream_list=tuple(RngStream.of(s) for s in report.streams),
                   key_hazards=tuple(RngKeyHazard.of(k) for k in keys))

    def to_record(self, with_streams: bool = True) -> Record:
        record = {"streams": self.streams, "drawn": self.drawn, "carried": self.carried, "unknown": self.unknown,
                  "dead_params": self.dead_params, "dead_bytes": self.dead_bytes,
                  "dead_increments": self.dead_increments, "drawn_increments": self.drawn_increments,
                  "unknown_increments": self.unknown_increments, "increments_exact": self.increments_exact,
                  "patterns": [p.to_record() for p in self.patterns]}
        if with_streams:
            record["stream_list"] = [s.to_record() for s in self.stream_list]
        if self.key_hazards:
            record["key_hazards"] = [k.to_record() for k in self.key_hazards]
        return record

    @classmethod
    def from_record(cls, r: Mapping) -> RngSummary:
        return cls(streams=r["streams"], drawn=r["drawn"], carried=r["carried"], unknown=r["unknown"],
                   dead_params=r["dead_params"], dead_bytes=r["dead_bytes"], dead_increments=r["dead_increments"],
                   drawn_increments=r.get("drawn_increments", 0), unknown_increments=r.get("unknown_increments", 0),
                   increments_exact=r["increments_exact"],
                   patterns=tuple(RngPattern.from_record(p) for p in r["patterns"]),
                   stream_list=tuple(RngStream.from_record(s) for s in r.get("stream_list", ())),
                   key_hazards=tuple(RngKeyHazard.from_record(k) for k in r.get("key_hazards", ())))


# --------------------------------------------------------------------------------------------------------------
# Constants and captured state
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CapturedArray:
    """One array the step closes over (``hlo.constants.CapturedArray``), with what it would be as a parameter."""

    path: str | None
    dtype: str
    dims: tuple[int, ...]
    bytes: int
    role: Role
    pattern: str

    def to_record(self) -> Record:
        return {"path": self.path, "dtype": self.dtype, "dims": list(self.dims), "bytes": self.bytes,
                "role": self.role.value, "pattern": self.pattern}

    @classmethod
    def from_record(cls, r: Mapping) -> CapturedArray:
        return cls(path=r["path"], dtype=r["dtype"], dims=tuple(r["dims"]), bytes=r["bytes"], role=Role(r["role"]),
                   pattern=r["pattern"])


@dataclass(frozen=True)
class CapturedState:
    """What the step captured: counts and bytes overall, by dtype, role and pattern; each array when kept."""

    arrays: int
    bytes: int
    by_dtype: Mapping[str, int]
    bytes_by_dtype: Mapping[str, int]
    by_role: Mapping[str, int]
    groups: Mapping[str, int]
    arrays_list: tuple[CapturedArray, ...] | None = None

    @property
    def by_dtype_most_first(self) -> dict[str, int]:
        """Arrays per dtype, most first (a record read back from the cache has its keys sorted by name)."""
        return dict(sorted(self.by_dtype.items(), key=lambda kv: (-kv[1], kv[0])))

    def to_record(self, with_arrays: bool = True) -> Record:
        record = {"arrays": self.arrays, "bytes": self.bytes, "by_dtype": dict(self.by_dtype),
                  "bytes_by_dtype": dict(self.bytes_by_dtype), "by_role": dict(self.by_role),
                  "groups": dict(self.groups)}
        if with_arrays and self.arrays_list is not None:
            record["arrays_list"] = [a.to_record() for a in self.arrays_list]
        return record

    @classmethod
    def from_record(cls, r: Mapping) -> CapturedState:
        listed = r.get("arrays_list")
        return cls(arrays=r["arrays"], bytes=r["bytes"], by_dtype=r["by_dtype"], bytes_by_dtype=r["bytes_by_dtype"],
                   by_role=r["by_role"], groups=r["groups"],
                   arrays_list=None if listed is None else tuple(CapturedArray.from_record(a) for a in listed))


@dataclass(frozen=True)
class LargeConstant:
    """A constant the size of model state: a literal, or a broadcast of one scalar constant."""

    name: str
    form: str  # literal | broadcast
    dtype: str
    dims: tuple[int, ...]
    bytes: int
    value: str
    paths: tuple[str, ...]

    def to_record(self) -> Record:
        return {"name": self.name, "form": self.form, "dtype": self.dtype, "dims": list(self.dims),
                "bytes": self.bytes, "value": self.value, "paths": list(self.paths)}

    @classmethod
    def from_record(cls, r: Mapping) -> LargeConstant:
        return cls(name=r["name"], form=r["form"], dtype=r["dtype"], dims=tuple(r["dims"]), bytes=r["bytes"],
                   value=r["value"], paths=tuple(r["paths"]))


@dataclass(frozen=True)
class LiteralKey:
    """An RNG key written into the program as a literal (``hlo.rng_flow.literal_keys``)."""

    name: str
    dims: tuple[int, ...]
    site: str
    used: bool  # it feeds an output

    def to_record(self) -> Record:
        return {"name": self.name, "dims": list(self.dims), "site": self.site, "used": self.used}

    @classmethod
    def from_record(cls, r: Mapping) -> LiteralKey:
        return cls(name=r["name"], dims=tuple(r["dims"]), site=r["site"], used=r["used"])


@dataclass(frozen=True)
class CountBytes:
    count: int
    bytes: int


@dataclass(frozen=True)
class FrozenRng:
    """RNG state written into the program (``hlo.constants.frozen_rng``)."""

    literal_keys: int  # keys, a stacked key array counting one per layer
    literal_key_constants: int
    used: int  # of the literal keys, those feeding an output
    sites: tuple[str, ...]
    captured_streams: Mapping[str, int]  # captured RNG streams by pattern, when known


@dataclass(frozen=True)
class Constants:
    """A module's constants by dtype, the large ones, its literal RNG keys and the state it captured (None: not
    known, an HLO file)."""

    constants: int
    constant_bytes: int
    by_dtype: Mapping[str, CountBytes]
    large: tuple[LargeConstant, ...]
    large_bytes: int
    literal_keys: tuple[LiteralKey, ...]
    captured: CapturedState | None

    @property
    def frozen_rng(self) -> FrozenRng:
        frozen = frozen_rng(self.to_record())
        return FrozenRng(literal_keys=frozen["literal_keys"], literal_key_constants=frozen["literal_key_constants"],
                         used=frozen["used"], sites=tuple(frozen["sites"]),
                         captured_streams=frozen["captured_streams"])

    @property
    def bakes_state(self) -> bool:
        """The program holds state as constants: captured arrays, large constants or literal RNG keys."""
        return bool((self.captured is not None and self.captured.arrays) or self.large or self.literal_keys)

    def golden_summary(self) -> Record:
        """What a golden keeps of it (``hlo.constants.golden_summary``: a golden record's ``constants``)."""
        return golden_summary(self.to_record())

    @classmethod
    def of(cls, report: ConstantReport) -> Constants:
        return cls.from_record(report.to_record())

    def to_record(self, with_arrays: bool = True) -> Record:
        return {"constants": self.constants, "constant_bytes": self.constant_bytes,
                "by_dtype": {k: {"count": v.count, "bytes": v.bytes} for k, v in self.by_dtype.items()},
                "large": [c.to_record() for c in self.large], "large_bytes": self.large_bytes,
                "literal_keys": [k.to_record() for k in self.literal_keys],
                "captured": None if self.captured is None else self.captured.to_record(with_arrays)}

    @classmethod
    def from_record(cls, r: Mapping) -> Constants:
        return cls(constants=r["constants"], constant_bytes=r["constant_bytes"],
                   by_dtype={k: CountBytes(v["count"], v["bytes"]) for k, v in r["by_dtype"].items()},
                   large=tuple(LargeConstant.from_record(c) for c in r["large"]), large_bytes=r["large_bytes"],
                   literal_keys=tuple(LiteralKey.from_record(k) for k in r["literal_keys"]),
                   captured=None if r["captured"] is None else CapturedState.from_record(r["captured"]))


# --------------------------------------------------------------------------------------------------------------
# Launches per step (GPU programs)
# --------------------------------------------------------------------------------------------------------------

# What a golden keeps of a result's launches: the counts the ratchet compares, the groups a finding's attribution is
# the difference of.
GOLDEN_LAUNCH_FIELDS = ("total", "scalar", "collectives", "reading_rng", "by_category", "by_kind", "exact",
                        "from_module", "groups")


@dataclass(frozen=True)
class Launches:
    """What one step of a GPU program launches (``hlo.launches.LaunchReport``): kernels, library calls, copies and
    collectives per step, the scalar ones, those reading RNG state, and the launch groups by what they run and read."""

    thunks: int
    total: int
    static: int
    by_category: Mapping[str, int]
    by_kind: Mapping[str, int]
    scalar: int
    collectives: int
    exact: bool
    unknown_trip_counts: tuple[str, ...]
    conditionals: int
    attributed: bool
    from_module: bool
    reading_rng: int
    scalar_groups: tuple[LaunchGroup, ...]
    # hlo.launch_groups.group_counts: "kernel scalar loop_add_fusion [rng_count] ..." -> launches per step
    groups: Mapping[str, int]

    @classmethod
    def of(cls, report: LaunchReport) -> Launches:
        return cls(thunks=report.thunks, total=report.total, static=report.static, by_category=report.by_category,
                   by_kind=report.by_kind, scalar=report.scalar, collectives=report.collectives, exact=report.exact,
                   unknown_trip_counts=tuple(report.unknown_trip_counts), conditionals=report.conditionals,
                   attributed=report.attributed, from_module=report.from_module, reading_rng=report.reading_rng,
                   scalar_groups=tuple(report.groups(scalar_only=True)), groups=group_counts(report))

    def golden_summary(self) -> Record:
        record = self.to_record()
        return {k: record[k] for k in GOLDEN_LAUNCH_FIELDS}

    def to_record(self) -> Record:
        return {"thunks": self.thunks, "total": self.total, "static": self.static,
                "by_category": dict(self.by_category), "by_kind": dict(self.by_kind), "scalar": self.scalar,
                "collectives": self.collectives, "exact": self.exact,
                "unknown_trip_counts": list(self.unknown_trip_counts), "conditionals": self.conditionals,
                "attributed": self.attributed, "from_module": self.from_module, "reading_rng": self.reading_rng,
                "scalar_groups": [g.to_record() for g in self.scalar_groups], "groups": dict(self.groups)}

    @classmethod
    def from_record(cls, r: Mapping) -> Launches:
        return cls(thunks=r["thunks"], total=r["total"], static=r["static"], by_category=r["by_category"],
                   by_kind=r["by_kind"], scalar=r["scalar"], collectives=r["collectives"], exact=r["exact"],
                   unknown_trip_counts=tuple(r["unknown_trip_counts"]), conditionals=r["conditionals"],
                   attributed=r["attributed"], from_module=r["from_module"], reading_rng=r.get("reading_rng", 0),
                   scalar_groups=tuple(LaunchGroup(**g) for g in r.get("scalar_groups", ())),
                   groups=r.get("groups", {}))


@dataclass(frozen=True)
class ModelReach:
    """What of its model a step computes (``hlo.model_work.ModelWork``): its contractions (dots, convolutions,
    kernels), how many of them reach its outputs, whether a value reading both a weight and the step's data reaches
    one (None: not asked), and where a zero cut values off (each placed: ``file:line (op_name)``, else the
    instruction's canonical name)."""

    contractions: int
    reaching: int
    mixes: bool | None = None
    zeroed_at: tuple[str, ...] = ()

    @property
    def computes_none(self) -> bool:
        """The HLO core's verdict (``ModelWork.computes_none``), on what the record keeps."""
        return ModelWork(self.contractions, self.reaching, self.mixes).computes_none

    def to_record(self) -> Record:
        return {"contractions": self.contractions, "reaching": self.reaching, "mixes": self.mixes,
                "zeroed_at": list(self.zeroed_at)}

    @classmethod
    def from_record(cls, record: Record) -> ModelReach:
        return cls(record["contractions"], record["reaching"], record["mixes"], tuple(record["zeroed_at"]))


# Runs of line numbers, each (first, last), sorted: what a cell's lowering ran of a file, or its program names.
LineRuns = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class CodeReach:
    """What of the code under test a cell's lowering reached (``check --changes``, issue 46): ``files``, every file of
    the project (or of an editable install, a folder on PYTHONPATH) it used, its modules' and the files it opened
    (a YAML config); ``ran``, of each module's file the lines that executed (while its lowering ran, or while its
    process imported the target); ``named``, the lines its program's instructions name (any frame of their stacks,
    frameworks' aside). Files inside the project are named relative to it (as the cache names them: a copy of the
    project reads its own), others by their absolute path. ``lines_known``: False where the lowering process could
    not hear lines (Python 3.11: ``files`` alone says what it used)."""

    files: tuple[str, ...]
    ran: Mapping[str, LineRuns]
    named: Mapping[str, LineRuns]
    lines_known: bool = True

    def to_record(self) -> Record:
        return {"files": list(self.files), "ran": _runs_listed(self.ran), "named": _runs_listed(self.named),
                "lines_known": self.lines_known}

    @classmethod
    def from_record(cls, record: Record) -> CodeReach:
        return cls(tuple(record["files"]), _runs_read(record["ran"]), _runs_read(record["named"]),
                   bool(record["lines_known"]))


def _runs_listed(table: Mapping[str, LineRuns]) -> dict[str, list[list[int]]]:
    return {path: [list(run) for run in runs] for path, runs in table.items()}


def _runs_read(table: Mapping[str, list[list[int]]]) -> dict[str, LineRuns]:
    return {str(path): tuple((int(first), int(last)) for first, last in runs) for path, runs in table.items()}
