"""Execute matrix cells: cache lookup, availability, lowering (in-process or in worker processes), analysis.

``run_cells`` is a generator, as pip-audit's core is: each result is yielded the moment it exists, so the
CLI can draw progress and a failing cell never holds up the others. One cell's failure becomes an
``error`` result carrying its one-line message; the rest of the matrix still runs.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import multiprocessing
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field

from hlo_audit import platforms
from hlo_audit.cache import Cache, lowering_key
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.diff import opcode_dtype_histogram
from hlo_audit.hlo.normalize import normalize
from hlo_audit.hlo.text import HloParseError
from hlo_audit.matrix import Cell
from hlo_audit.targets.base import CellConfigError, Lowering, TargetError, Unavailable, get_target, one_line


@dataclass
class CellResult:
    cell: Cell
    status: str  # ok | unavailable | error
    message: str = ""
    summary: dict | None = None  # entry_params, by_dtype, by_role, groups, bytes_by_role
    params: list[dict] = field(default_factory=list)  # per entry parameter: path, role, dtype, dims, bytes
    opcodes: dict[str, int] = field(default_factory=dict)  # "opcode:dtype" -> count over the module
    rng: dict | None = None  # RNG streams drawn / carried / unknown (RngReport.to_record)
    memory: dict | None = None  # compiled cells: bytes by kind (argument, output, alias, temp, generated_code)
    cost: dict | None = None  # compiled cells: flops, transcendentals, bytes_accessed
    constants: dict | None = None  # constants, large ones, literal keys, captured arrays (ConstantReport.to_record)
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

    @property
    def captured(self) -> dict | None:
        """What the step closes over (captured_summary plus ``arrays_list``); None when not known."""
        return self.constants.get("captured") if self.constants else None

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


def analyze_lowering(cell: Cell, lowering: Lowering, seconds: float, key: str) -> CellResult:
    analysis = analyze(lowering.text, cell.id, lowering.arg_keys, lowering.captured)
    return CellResult(
        cell=cell, status="ok", message=lowering.note, summary=asdict(analysis.summary), params=[p.to_record() for p in analysis.params],
        opcodes=dict(sorted(opcode_dtype_histogram(analysis.module).items())), rng=analysis.rng.to_record(),
        memory=lowering.memory, cost=lowering.cost, constants=analysis.constants.to_record(),
        hlo_sha256=_sha256(lowering.text), lower_seconds=round(seconds, 3), key=key,
        # Text-derived paths (not args_info's), so a golden's text and a check's always name parameters alike.
        normalized=normalize(analysis.module),
    )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _lower_one(target_spec: str, cell: Cell, key: str) -> tuple[CellResult, Lowering | None]:
    """Lower and analyse one cell; never raises (runs in worker processes too)."""
    started = time.perf_counter()
    try:
        target = _target(target_spec)
        lowering = target.lower(cell)
        seconds = time.perf_counter() - started
        return analyze_lowering(cell, lowering, seconds, key), lowering
    except Unavailable as exc:
        return CellResult(cell=cell, status="unavailable", message=one_line(exc), key=key), None
    except HloParseError as exc:
        return CellResult(cell=cell, status="error", message=f"unparseable HLO: {one_line(exc)}", key=key), None
    except Exception as exc:  # noqa: BLE001 (a cell's failure is data, reported in its row)
        detail = one_line(exc)
        if not isinstance(exc, (CellConfigError, TargetError)):
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            detail = f"{type(exc).__name__}: {detail} ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
        return CellResult(cell=cell, status="error", message=detail, key=key), None


_TARGETS: dict[str, object] = {}


def _target(spec: str):
    if spec not in _TARGETS:
        _TARGETS[spec] = get_target(spec)
    return _TARGETS[spec]


def _worker(target_spec: str, cell: Cell, key: str) -> tuple[dict, str | None, Lowering | None]:
    """In a worker process: the result as a record (plus its canonical text, which records leave out)."""
    platforms.setup_own_process()
    result, lowering = _lower_one(target_spec, cell, key)
    return result.to_record(), result.normalized, lowering


def run_cells(cells: Iterable[Cell], cache: Cache, jobs: int = 1) -> Iterator[CellResult]:
    """Yield one CellResult per cell: cached ones first, then as lowerings finish."""
    pending: list[tuple[Cell, str]] = []
    for cell in cells:
        try:
            target = _target(cell.target)
            key = lowering_key(cell, target.fingerprint())
        except Exception as exc:  # noqa: BLE001 (bad target spec: every cell of it is an error row)
            yield CellResult(cell=cell, status="error", message=one_line(exc))
            continue
        cached = cache.get_result(key)
        if cached is not None:
            yield CellResult.from_record(cached, cached=True)
            continue
        try:
            target.check_available(cell)
        except Unavailable as exc:
            yield CellResult(cell=cell, status="unavailable", message=one_line(exc), key=key)
            continue
        hit = cache.get_lowering(key)
        if hit is not None:  # lowered before, analysis code changed since: re-analyse only
            text, meta = hit
            result = analyze_lowering(cell, Lowering.from_cache(text, meta), meta.get("seconds", 0.0), key)
            result.cached, result.text = True, text
            cache.put_result(key, result.to_record(), result.normalized)
            yield result
            continue
        pending.append((cell, key))
    yield from _lower_pending(pending, cache, jobs)


def _store(cache: Cache, result: CellResult, lowering: Lowering | None) -> CellResult:
    if result.status == "ok" and lowering is not None:
        result.text = lowering.text
        cache.put_lowering(result.key, lowering.text,
                           {"cell": result.cell.id, "seconds": result.lower_seconds, **lowering.meta()})
        cache.put_result(result.key, result.to_record(), result.normalized)
    return result


def _lower_pending(pending: list[tuple[Cell, str]], cache: Cache, jobs: int) -> Iterator[CellResult]:
    if not pending:
        return
    # A worker compiling a TPU cell holds ~1.4 GB: --jobs is an upper bound, the machine's memory the other.
    workers = platforms.workers_for([cell for cell, _ in pending], jobs)
    if workers <= 1:
        for cell, key in pending:
            result, lowering = _lower_one(cell.target, cell, key)
            yield _store(cache, result, lowering)
        return
    # Spawned, not forked: jax and MaxText hold threads and global config that a fork would copy mid-state.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(_worker, cell.target, cell, key): (cell, key) for cell, key in pending}
        for future in concurrent.futures.as_completed(futures):
            cell, key = futures[future]
            try:
                record, normalized, lowering = future.result()
            except Exception as exc:  # noqa: BLE001 (a worker that died: OOM, segfault)
                yield CellResult(cell=cell, status="error", message=f"worker process failed: {one_line(exc)}", key=key)
                continue
            result = CellResult.from_record(record)
            result.normalized = normalized
            yield _store(cache, result, lowering)
