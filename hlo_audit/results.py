"""What running a cell produces: one frozen ``CellResult`` per cell, of its kind (lowered, unavailable, failed), typed
from the lowering to the formatters.

A result is made once, where the cell ran (``run``), and read everywhere after; it leaves the process as a record
only through ``to_record`` / ``from_record`` (the results cache's entries, a worker process's answer), defined here
beside the type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from hlo_audit.analysed import CodeReach, Constants, Launches, ModelReach, Param, RngSummary, Role
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.locations import Places, places_from_record, places_to_record
from hlo_audit.hlo.params import ParamSummary, roles_by_pattern
from hlo_audit.hlo.rng_keys import PlacedHazard
from hlo_audit.host_cost import HostFigure, leaves_per_call
from hlo_audit.matrix import Cell
from hlo_audit.usage import InputError

Record = dict[str, Any]  # a record of the results cache's schema (an edge: JSON in and out)


class Status(StrEnum):
    """Whether a cell lowered here: ok, unavailable on this host (said why), or failed (said why)."""

    OK = "ok"
    UNAVAILABLE = "unavailable"
    ERROR = "error"


def summary_of(record: Mapping) -> ParamSummary:
    """A summary from its record (a result's, or the counts a golden or a shard's JSON keeps of it)."""
    return ParamSummary(entry_params=record["entry_params"], by_dtype=record["by_dtype"], by_role=record["by_role"],
                        groups=record["groups"], bytes_by_role=record.get("bytes_by_role", {}))


@dataclass(frozen=True, kw_only=True)
class CellResult:
    """What running one cell gave, always one of three kinds, whose class is its status: ``LoweredCell`` (the analysis
    of its program), ``UnavailableCell`` (this host cannot lower it, said why) or ``FailedCell`` (said why). What only
    a lowered cell has is only on ``LoweredCell``: a reader narrows by kind (``isinstance``, or ``ok`` where it reads
    nothing of the analysis) before reading it."""

    status: ClassVar[Status]
    cell: Cell
    message: str = ""  # why it did not lower; a lowered cell's note (what its target said of the lowering)
    key: str = ""  # its cache key ("": none, a target that did not load)
    # What the lowering warned (jax's "Some donated buffers were not usable", ...), each warning once, as
    # ``warning_text`` shortens it: captured per cell (never printed as it happens), summarized once per run.
    warnings: tuple[str, ...] = ()
    # Why this run lowered the cell instead of serving it (the first recorded input that changed, or why its inputs
    # cannot be keyed: "unservable: runs a subprocess at model.py:12"); "" where it was served or not looked up.
    relowered_because: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if type(self) is CellResult:
            raise TypeError("a CellResult is made as its kind: LoweredCell, UnavailableCell or FailedCell")

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def refused(self) -> bool:
        """The target refused the cell (``Unavailable``, or its model's configuration rejected it)."""
        return False

    def to_record(self) -> Record:
        """The results cache's record (without what is transient: cached, the texts), one schema for every kind: a
        cell that did not lower writes the analysis fields empty, as its records always were
        (``LoweredCell.to_record`` fills them in place)."""
        record = {
            "cell": {**asdict(self.cell), "overrides": [list(kv) for kv in self.cell.overrides]},
            "status": self.status.value, "message": self.message,
            "summary": None, "params": [], "opcodes": {}, "rng": None, "memory": None, "cost": None, "constants": None,
            "launches": None, "environment": {}, "hlo_sha256": "", "lower_seconds": 0.0, "key": self.key,
        }
        if self.warnings:
            record["warnings"] = list(self.warnings)
        return record

    @classmethod
    def from_record(cls, record: Mapping, cached: bool = False) -> CellResult:
        """The result of its record's kind (its ``status``); a cell that did not lower reads none of the analysis.
        ``cached``: read from the results cache (which keeps only lowered cells)."""
        cell = record["cell"]
        common = {"cell": Cell(**{**cell, "overrides": tuple(tuple(kv) for kv in cell["overrides"])}),
                  "message": record["message"], "key": record["key"], "warnings": tuple(record.get("warnings", ()))}
        status = Status(record["status"])
        if status is Status.UNAVAILABLE:
            return UnavailableCell(**common)
        if status is Status.ERROR:
            return FailedCell(**common)
        return LoweredCell(
            **common, cached=cached, summary=summary_of(record["summary"]),
            params=tuple(Param.from_record(p) for p in record["params"]), opcodes=record["opcodes"],
            rng=None if record["rng"] is None else RngSummary.from_record(record["rng"]),
            memory=record["memory"], cost=record["cost"],
            constants=None if record["constants"] is None else Constants.from_record(record["constants"]),
            launches=None if record["launches"] is None else Launches.from_record(record["launches"]),
            kernels_by_name=None if record.get("kernels_by_name") is None else {
                k: tuple(v) for k, v in record["kernels_by_name"].items()},
            places=None if record.get("places") is None else places_from_record(record["places"]),
            host=None if record.get("host") is None else HostFigure.from_record(record["host"]),
            call_leaves=record.get("call_leaves"), mesh_sizes=record.get("mesh_sizes"),
            environment=record["environment"], hlo_sha256=record["hlo_sha256"],
            lower_seconds=record["lower_seconds"],
            model=None if record.get("model") is None else ModelReach.from_record(record["model"]),
            reach=None if record.get("reach") is None else CodeReach.from_record(record["reach"]),
            key_hazards=None if record.get("key_hazards") is None else tuple(
                PlacedHazard.from_record(h) for h in record["key_hazards"]))


@dataclass(frozen=True, kw_only=True)
class UnavailableCell(CellResult):
    """A cell this host cannot lower (``lowering.Unavailable``: no such platform, a target without it), said why."""

    status: ClassVar[Status] = Status.UNAVAILABLE

    @property
    def refused(self) -> bool:
        return True


@dataclass(frozen=True, kw_only=True)
class FailedCell(CellResult):
    """A cell whose lowering or analysis failed (or whose target did not load), said why."""

    status: ClassVar[Status] = Status.ERROR
    # An error that is the model's own configuration rejecting the cell (``CellConfigError``: MaxText's gemma4-e2b
    # refuses scan on), not a crash: with ``unavailable``, what `init` writes as an [[exclude]] (``refused``).
    config_refused: bool = False

    @property
    def refused(self) -> bool:
        return self.config_refused


@dataclass(frozen=True, kw_only=True)
class LoweredCell(CellResult):
    """A cell that lowered here: what its analysis keeps of the program (``run.analyze_lowering``), typed."""

    status: ClassVar[Status] = Status.OK
    summary: ParamSummary  # entry parameters in all, by dtype, role and path pattern
    params: tuple[Param, ...] = ()
    opcodes: Mapping[str, int] = field(default_factory=dict)  # "opcode:dtype" -> count over the module
    rng: RngSummary | None = None
    memory: Mapping[str, int] | None = None  # optimized and compiled cells: bytes by MEMORY_KINDS key
    cost: Mapping[str, float] | None = None  # optimized and compiled cells: flops, transcendentals, bytes_accessed
    constants: Constants | None = None
    launches: Launches | None = None  # GPU cells of stage optimized and compiled: what one step launches
    # Pallas / Mosaic / Triton kernels by name, each name's content digests (hlo.kernels.kernel_digests); None: none
    kernels_by_name: Mapping[str, tuple[str, ...]] | None = None
    # What the exact HLO text depends on besides the model: versions, toolchain, platform, stage.
    environment: Mapping[str, str] = field(default_factory=dict)
    hlo_sha256: str = ""
    lower_seconds: float = 0.0
    cached: bool = False  # served from the results cache, not lowered by this run
    text: str | None = field(default=None, repr=False, compare=False)  # HLO text when just lowered
    # The canonical text (text-derived paths) when just analysed: what goldens keep, computed with the parse.
    normalized: str | None = field(default=None, repr=False, compare=False)
    # Where in the model each instruction of the canonical text comes from, where the stage printed its text without
    # metadata (lowered): (computation, instruction) by their canonical names -> (jax's op_name, source file:line).
    # What places a change on this side (``hlo.changes.Place``); None where the text says it or nothing does.
    places: Places | None = field(default=None, repr=False)
    # The step's host work per call, where it was measured (``measure.host_figure``: `measure`, and `check` for a
    # cell whose golden records one); None elsewhere.
    host: HostFigure | None = None
    # How many leaves the step's call flattens (``Lowering.call_leaves``: its arguments' leaves, those
    # jax pruned from the entry included); None where jax did not say (a text read from a file).
    call_leaves: int | None = None
    # The sizes the cell's config gives its target mesh (``Lowering.mesh_sizes``); None where the target said none.
    mesh_sizes: dict[str, int | None] | None = None
    # What of its model the step computes (``analysed.ModelReach``: its contractions, those reaching its outputs);
    # None: a result read from a check report, which keeps no analysis.
    model: ModelReach | None = None
    # What of the code under test its lowering reached (``analysed.CodeReach``: files used, lines run, lines its
    # program names), for ``check --changes``; None where not recorded (a text read from a file, a check report).
    reach: CodeReach | None = field(default=None, repr=False)
    # The literal and reused keys of jax's module before XLA's passes, where the stage's text is XLA's and shows no draw
    # (``Lowering.key_hazards``): what its golden keeps to compare with; None where the text says them (stage lowered).
    key_hazards: tuple[PlacedHazard, ...] | None = None

    @property
    def leaves_per_call(self) -> int | None:
        """The state leaves its call flattens: its lowering's count, else its measured figure's; None: neither."""
        return leaves_per_call(self.call_leaves, self.host)

    def canonical_text(self) -> str:
        """The cell's canonical text, what its golden keeps. ``run.run_cells`` gives every ok result its own: computed
        with the analysis, or read from the cache with the result and verified there (a truncated or foreign text is
        a miss, never a golden)."""
        if self.normalized is not None:
            return self.normalized
        if self.text is None:
            raise InputError(f"{self.cell.id}: its canonical text is not known (a result not from run_cells); "
                             "run the cell again")
        # Text-derived paths on both sides of the comparison, so golden and check always agree on names.
        return analyze(self.text, self.cell.id).normalized

    @property
    def entry_params(self) -> int:
        return self.summary.entry_params

    def count(self, kind: str, name: str) -> int:
        """by_dtype / by_role lookup, 0 when absent."""
        return getattr(self.summary, kind).get(name, 0)

    def by_dtype_role(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(dtype, role) -> (parameters, bytes)."""
        counts: dict[tuple[str, str], tuple[int, int]] = {}
        for p in self.params:
            n, size = counts.get((p.dtype, p.role.value), (0, 0))
            counts[p.dtype, p.role.value] = (n + 1, size + p.bytes)
        return counts

    def groups_by_role(self) -> dict[str, dict[str, int]]:
        """Each path pattern's parameters by role (``...to_nnx__rngs.*``: rng_key 42, rng_count 42)."""
        return roles_by_pattern(self.params)

    @property
    def captured(self):
        """What the step closes over (``analysed.CapturedState``); None when not known."""
        return self.constants.captured if self.constants else None

    @property
    def kernels(self) -> int | None:
        """Launches per step (GPU cells of stage optimized and compiled), None where nothing is known of them."""
        return self.launches.total if self.launches else None

    @property
    def rng_params(self) -> int:
        return self.count("by_role", Role.RNG_KEY) + self.count("by_role", Role.RNG_COUNT)

    def to_record(self) -> Record:
        """Every kind's record with the analysis in its fields' places, then what only some cells have, before the
        warnings: ``kernels_by_name`` only where the cell runs kernels, ``places`` only where the stage gives them,
        ``host`` only where it was measured, ``call_leaves`` only where jax said it and ``model`` where the cell was
        analysed, so a record without them reads as before."""
        record = super().to_record()
        warnings = record.pop("warnings", None)
        record.update({
            "summary": asdict(self.summary), "params": [p.to_record() for p in self.params],
            "opcodes": dict(self.opcodes), "rng": None if self.rng is None else self.rng.to_record(),
            "memory": None if self.memory is None else dict(self.memory),
            "cost": None if self.cost is None else dict(self.cost),
            "constants": None if self.constants is None else self.constants.to_record(),
            "launches": None if self.launches is None else self.launches.to_record(),
            "environment": dict(self.environment), "hlo_sha256": self.hlo_sha256, "lower_seconds": self.lower_seconds,
        })
        if self.kernels_by_name is not None:
            record["kernels_by_name"] = {k: list(v) for k, v in self.kernels_by_name.items()}
        if self.places is not None:
            record["places"] = places_to_record(self.places)
        if self.host is not None:
            record["host"] = self.host.to_record()
        if self.call_leaves is not None:
            record["call_leaves"] = self.call_leaves
        if self.mesh_sizes is not None:
            record["mesh_sizes"] = dict(self.mesh_sizes)
        if self.model is not None:
            record["model"] = self.model.to_record()
        if self.reach is not None:
            record["reach"] = self.reach.to_record()
        if self.key_hazards is not None:
            record["key_hazards"] = [h.to_record() for h in self.key_hazards]
        if warnings is not None:
            record["warnings"] = warnings
        return record


def warning_text(message: object) -> str:
    """A warning as a run's summary counts it: its first line up to the details (``Some donated buffers were not
    usable: float32[2,8].`` -> ``Some donated buffers were not usable``; a sentence: up to its full stop)."""
    line = str(message).strip().split("\n", 1)[0]
    for end in (": ", ". "):
        if end in line:
            line = line.split(end, 1)[0]
    return line.rstrip(".")[:160]


# Warnings jax gives for what the user chose, not for a problem they did not know of: a donated buffer no output
# can reuse (jax cannot alias it on this backend; on the CPU, where the cells lower, any donation of a batch or of
# state the step does not return). Said once under `check --verbose`, never on every run (issue 40).
CHOSEN_WARNINGS = frozenset({"Some donated buffers were not usable"})


@dataclass(frozen=True)
class LoweringWarnings:
    """What the lowerings of a run warned: the cells that warned, and each warning with the cells it came from,
    most first (``of``: None when none did). Only the warnings a reader needs on every run, unless ``chosen``:
    then those of ``CHOSEN_WARNINGS`` too."""

    cells: int
    by_warning: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, results, chosen: bool = False) -> LoweringWarnings | None:
        counts: dict[str, int] = {}
        cells = 0
        for r in results:
            said = [text for text in r.warnings if chosen or text not in CHOSEN_WARNINGS]
            cells += bool(said)
            for text in said:
                counts[text] = counts.get(text, 0) + 1
        if not cells:
            return None
        return cls(cells=cells, by_warning=tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))))


class Severity(StrEnum):
    """What the gate says of a finding, least to most severe: a cell's verdict is its worst finding's."""

    OK = "ok"
    IMPROVEMENT = "improvement"
    ADVISORY = "advisory"
    WAIVED = "waived"
    STALE = "stale"
    UNAVAILABLE = "unavailable"
    REGRESSION = "regression"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def failing(self) -> bool:
        return self in (Severity.REGRESSION, Severity.ERROR)


_RANK = {s: i for i, s in enumerate(Severity)}
SEVERITIES = tuple(s.value for s in Severity)
