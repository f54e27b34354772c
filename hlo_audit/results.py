"""What running and judging cells produce: one ``CellResult`` per cell, ``Finding``s about it, their severities.

Records only (and what can be read off them), so formatters can take them without importing what made them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from hlo_audit.matrix import Cell

# Least to most severe: a cell's verdict is its worst finding's.
SEVERITIES = ("ok", "improvement", "advisory", "waived", "stale", "unavailable", "regression", "error")
FAILING = frozenset({"regression", "error"})


@dataclass
class CellResult:
    cell: Cell
    status: str  # ok | unavailable | error
    message: str = ""
    summary: dict | None = None  # entry_params, by_dtype, by_role, groups, bytes_by_role
    params: list[dict] = field(default_factory=list)  # per entry parameter: path, role, dtype, dims, bytes
    opcodes: dict[str, int] = field(default_factory=dict)  # "opcode:dtype" -> count over the module
    rng: dict | None = None  # RNG streams drawn / carried / unknown (RngReport.to_record)
    memory: dict | None = None  # optimized and compiled cells: bytes by MEMORY_KINDS key
    cost: dict | None = None  # optimized and compiled cells: flops, transcendentals, bytes_accessed
    constants: dict | None = None  # constants, large ones, literal keys, captured arrays (ConstantReport.to_record)
    # GPU cells of stage optimized and compiled: what one step launches (hlo.thunks.LaunchReport.to_record)
    launches: dict | None = None
    # What the exact HLO text depends on besides the model: versions, toolchain, platform, stage (golden.py).
    environment: dict[str, str] = field(default_factory=dict)
    hlo_sha256: str = ""
    lower_seconds: float = 0.0
    cached: bool = False
    key: str = ""
    text: str | None = field(default=None, repr=False, compare=False)  # HLO text when just lowered
    # The canonical text (text-derived paths) when just analysed: what goldens keep, computed with the parse.
    normalized: str | None = field(default=None, repr=False, compare=False)

    @property
    def entry_params(self) -> int | None:
        return self.summary["entry_params"] if self.summary else None

    def count(self, kind: str, name: str) -> int:
        """by_dtype / by_role lookup, 0 when absent."""
        return self.summary[kind].get(name, 0) if self.summary else 0

    def by_dtype_role(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(dtype, role) -> (parameters, bytes)."""
        counts: dict[tuple[str, str], tuple[int, int]] = {}
        for p in self.params:
            n, size = counts.get((p["dtype"], p["role"]), (0, 0))
            counts[p["dtype"], p["role"]] = (n + 1, size + p["bytes"])
        return counts

    def groups_by_role(self) -> dict[str, dict[str, int]]:
        """Each path pattern's parameters by role (``...to_nnx__rngs.*``: rng_key 42, rng_count 42)."""
        groups: dict[str, dict[str, int]] = {}
        for p in self.params:
            roles = groups.setdefault(p["pattern"], {})
            roles[p["role"]] = roles.get(p["role"], 0) + 1
        return {pattern: dict(sorted(roles.items())) for pattern, roles in sorted(groups.items())}

    @property
    def captured(self) -> dict | None:
        """What the step closes over (captured_summary plus ``arrays_list``); None when not known."""
        return self.constants.get("captured") if self.constants else None

    @property
    def kernels(self) -> int | None:
        """Launches per step (GPU cells of stage optimized and compiled), None where nothing is known of them."""
        return self.launches["total"] if self.launches else None

    @property
    def rng_params(self) -> int:
        return self.count("by_role", "rng_key") + self.count("by_role", "rng_count")

    def to_record(self) -> dict:
        record = asdict(self)
        record["cell"] = {**asdict(self.cell), "overrides": [list(kv) for kv in self.cell.overrides]}
        for transient in ("cached", "text", "normalized"):
            record.pop(transient)
        return record

    @classmethod
    def from_record(cls, record: dict, cached: bool = False) -> "CellResult":
        cell_fields = {**record["cell"], "overrides": tuple(tuple(kv) for kv in record["cell"]["overrides"])}
        return cls(**{**record, "cell": Cell(**cell_fields), "cached": cached})


@dataclass
class Finding:
    cell: str
    severity: str
    rule: str
    message: str
    details: dict = field(default_factory=dict)

    @property
    def failing(self) -> bool:
        return self.severity in FAILING


def worst(findings: Iterable[Finding]) -> str:
    return max((f.severity for f in findings), key=SEVERITIES.index, default="ok")
