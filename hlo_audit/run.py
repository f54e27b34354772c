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
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from hlo_audit import host, platforms, preflight, termination
from hlo_audit.analysed import Constants, Launches, Param, RngSummary
from hlo_audit.cache import Cache, importing_target, lowering_key, reads_after, recording_environment
from hlo_audit.cache.reads import Reads
from hlo_audit.hlo.analysis import Analysis, analyze
from hlo_audit.hlo.diff import opcode_dtype_histogram
from hlo_audit.hlo.kernels import kernel_digests
from hlo_audit.hlo.locations import Places, text_places
from hlo_audit.hlo.normalize import normalize_with_names
from hlo_audit.hlo.rng_keys import PlacedHazard, placed
from hlo_audit.hlo.text import HloParseError
from hlo_audit.hlo.launch_model import step_launches
from hlo_audit.lowering import CellConfigError, Lowering, TargetError, Unavailable, one_line, where_raised
from hlo_audit.matrix import Cell
from hlo_audit.plan import Plan
from hlo_audit.results import CellResult, FailedCell, LoweredCell, UnavailableCell, warning_text
from hlo_audit.targets import get_target

# Distributions every cell's HLO depends on, whatever its target and platform.
_JAX_DISTRIBUTIONS = ("jax", "jaxlib", "flax")


def environment(target, cell: Cell) -> dict[str, str]:
    """What the exact HLO text depends on besides the model: the text gate only applies when it matches the
    golden's (jax, jaxlib, flax, the target's versions, the platform's toolchain, platform, stage)."""
    env = {name: host.installed_version(name) for name in _JAX_DISTRIBUTIONS}
    env.update(target.versions(cell))
    env.update(platforms.of(cell).toolchain(cell))
    env["platform"] = cell.platform_label
    env["stage"] = cell.stage
    return env


def analyze_lowering(cell: Cell, lowering: Lowering, seconds: float, key: str, env: dict[str, str]) -> LoweredCell:
    analysis = analyze(lowering.text, cell.id, lowering.arg_keys, lowering.captured, lowering.arg_leaves,
                       lowering.literal_digests)
    launches = step_launches(analysis.module, analysis.params, lowering.dump, f"{cell.id} thunk sequence")
    # Text-derived paths (not args_info's), so a golden's text and a check's always name parameters alike.
    normalized, _, names = normalize_with_names(analysis.module)
    # A text printed without metadata (stage lowered) is placed by what its stage read beside it; a compiled
    # module's text prints its own (source_file, source_line).
    places = lowering.metadata.places(names) if lowering.metadata is not None else text_places(analysis.module, names)
    return LoweredCell(
        cell=cell, message=lowering.note, summary=analysis.summary,
        params=tuple(Param.of(p) for p in analysis.params),
        opcodes=dict(sorted(opcode_dtype_histogram(analysis.module).items())),
        rng=RngSummary.of(analysis.rng, _key_hazards(analysis, names, places)),
        memory=lowering.memory, cost=lowering.cost, constants=Constants.of(analysis.constants), environment=env,
        launches=Launches.of(launches) if launches is not None else None,
        kernels_by_name=kernel_digests(analysis.module) or None,
        hlo_sha256=_sha256(lowering.text), lower_seconds=round(seconds, 3), key=key,
        normalized=normalized, places=places,
    )


def _key_hazards(analysis: Analysis, names: Mapping[tuple[str, str], tuple[str, str]],
                 places: Places | None) -> tuple[PlacedHazard, ...]:
    """Literal and reused keys placed: a text printed without metadata by the places its stage kept, by the canonical
    names ``names`` gives the module's own."""
    if not analysis.keys.hazards:
        return ()
    raw = {name: places[canonical] for name, canonical in names.items() if canonical in places} if places else None
    return placed(analysis.keys, analysis.module, analysis.params, raw)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _lower_one(target_spec: str, cell: Cell, key: str) -> tuple[CellResult, Lowering | None, Reads | None]:
    """Lower and analyse one cell; never raises (runs in worker processes too). The third item is what the
    lowering read (``cache.reads_after``), recorded here, in the process that lowered. What the lowering warned is
    the result's (``CellResult.warnings``), not printed: jax warns on every lowering of a step whose donated
    buffers it cannot alias, and a run summarizes them once."""
    started = time.perf_counter()
    caught: list[warnings.WarningMessage] = []
    try:
        with host.prints_to_stderr(), termination.dispositions_kept():
            target = _target(target_spec)  # what building it read is the process's (cache.recording_environment)
            with recording_environment() as window, warnings.catch_warnings(record=True) as caught:
                lowering = target.lower(cell)
        seconds = time.perf_counter() - started
        # The code under test keyed by content even where it is installed (MaxText from a wheel, edited in place).
        reads = reads_after(window, frozenset(getattr(target, "code_under_test", ())))
        result = analyze_lowering(cell, lowering, seconds, key, environment(target, cell))
        return replace(result, warnings=_warned(caught)), lowering, reads
    except Unavailable as exc:
        return UnavailableCell(cell=cell, message=one_line(exc), key=key), None, None
    except HloParseError as exc:
        return (FailedCell(cell=cell, message=f"unparseable HLO: {one_line(exc)}", key=key,
                           warnings=_warned(caught)), None, None)
    except Exception as exc:  # noqa: BLE001 (a cell's failure is data, reported in its row)
        detail = one_line(exc)
        if not isinstance(exc, (CellConfigError, TargetError)):
            detail = f"{type(exc).__name__}: {detail} ({where_raised(exc)})"
        return FailedCell(cell=cell, message=detail, key=key, warnings=_warned(caught),
                          config_refused=isinstance(exc, CellConfigError)), None, None


def _warned(caught: list[warnings.WarningMessage]) -> tuple[str, ...]:
    """Each warning once, in the order first raised (the filters in force decide which count, as printed)."""
    return tuple(dict.fromkeys(warning_text(w.message) for w in caught))


_TARGETS: dict[str, object] = {}
_FINGERPRINTS: dict[str, str] = {}


def _target(spec: str):
    if spec not in _TARGETS:
        # What the target's imports read (jax's config, a user's module-level os.environ.get) holds for every
        # cell this process lowers after: part of each one's manifest.
        with importing_target():
            _TARGETS[spec] = get_target(spec)
    return _TARGETS[spec]


def _keyed_target(spec: str) -> tuple[object, str]:
    """The target and its fingerprint (part of every cell's cache key), taken once per process as the target is
    built: the fingerprint of the code this process loaded (an edit after it is a later process's to key)."""
    if spec not in _FINGERPRINTS:
        with importing_target(), termination.dispositions_kept():
            target = _TARGETS[spec] if spec in _TARGETS else get_target(spec)
            _TARGETS[spec], _FINGERPRINTS[spec] = target, target.fingerprint()
    return _TARGETS[spec], _FINGERPRINTS[spec]


def _worker(target_spec: str, cell: Cell, key: str) -> tuple[CellResult, Lowering | None, Reads | None]:
    """In a worker process: the result (pickled back whole, its canonical text with it), the lowering, its reads."""
    host.setup_own_process()
    return _lower_one(target_spec, cell, key)


def run_cells(cells: Iterable[Cell], cache: Cache, jobs: int = 1,
              started: Callable[[Cell], None] | None = None) -> Iterator[CellResult]:
    """Yield one CellResult per cell: cached ones first, then as lowerings finish. ``started(cell)`` is called
    when a cell's lowering begins (the CLI's heartbeat names the cells in flight).

    A cell is served from the cache only through a manifest variant whose reads all still hold and entries that
    verify (``hlo_audit.cache``); anything else is lowered (or, with its lowering intact, analysed) again."""
    pending: list[tuple[Cell, str]] = []
    for cell in cells:
        try:
            target, fingerprint = _keyed_target(cell.target)
            key = lowering_key(cell, fingerprint)
        except preflight.EnvironmentProblem:
            raise  # not the target's fault: no cell runs here
        except Exception as exc:  # noqa: BLE001 (bad target spec: every cell of it is an error row)
            yield FailedCell(cell=cell, message=one_line(exc))
            continue
        entry = cache.lookup(key, cell.id)
        cached = cache.get_result(entry, cell.id) if entry else None
        if cached is not None:
            yield cached
            continue
        try:
            target.check_available(cell)
        except Unavailable as exc:
            yield UnavailableCell(cell=cell, message=one_line(exc), key=key)
            continue
        hit = cache.get_lowering(entry, cell.id) if entry else None
        if hit is not None:  # lowered before, analysis code changed since (or its result did not verify)
            text, meta = hit
            result = replace(analyze_lowering(cell, Lowering.from_cache(text, meta), meta.get("seconds", 0.0), entry,
                                              environment(target, cell)), cached=True, text=text)
            cache.put_result(entry, result)
            yield result
            continue
        pending.append((cell, key))
    yield from _lower_pending(pending, cache, jobs, started or (lambda cell: None))


def _store(cache: Cache, result: CellResult, lowering: Lowering | None, reads: Reads | None) -> CellResult:
    """A result just lowered, stored: with its text, keyed by its cache entry (``Cache.put``)."""
    if result.ok and lowering is not None and reads is not None:
        return cache.put(result.key, replace(result, text=lowering.text), lowering, reads)
    return result


def _lower_pending(pending: list[tuple[Cell, str]], cache: Cache, jobs: int,
                   started: Callable[[Cell], None]) -> Iterator[CellResult]:
    if not pending:
        return
    preflight.check_xla_flags()  # XLA aborts the process that lowers on a flag it refuses: asked in a child first
    preflight.check_platforms()  # JAX_PLATFORMS=tpu on a host without one: one line, not every cell failing
    # A worker compiling a TPU cell holds ~1.4 GB: --jobs is an upper bound, the machine's memory the other.
    workers = host.workers_for([platforms.of(cell).worker_bytes(cell) for cell, _ in pending], jobs)
    if workers <= 1:
        for cell, key in pending:
            started(cell)
            yield _store(cache, *_lower_one(cell.target, cell, key))
        return
    # Spawned, not forked: jax and MaxText hold threads and global config that a fork would copy mid-state.
    context = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context,
                                                  initializer=termination.worker_init)
    try:
        with termination.starting_workers():  # submitting starts the workers
            futures = {pool.submit(_worker, cell.target, cell, key): (cell, key) for cell, key in pending}
        # The pool takes work in submission order: the first `workers` cells start now, the next as each ends.
        for cell, _ in pending[:workers]:
            started(cell)
        for n, future in enumerate(concurrent.futures.as_completed(futures)):
            if workers + n < len(pending):
                started(pending[workers + n][0])
            cell, key = futures[future]
            try:
                result, lowering, reads = future.result()
            except Exception as exc:  # noqa: BLE001 (a worker that died: OOM, segfault)
                yield FailedCell(cell=cell, message=f"worker process failed: {one_line(exc)}", key=key)
                continue
            yield _store(cache, result, lowering, reads)
    except BaseException:  # stopped (a signal, the consumer gone): never wait minutes for the cells in flight
        termination.abandon_pool(pool)
        raise
    pool.shutdown(wait=True)


def execute(plan: Plan, jobs: int = 1, use_cache: bool = True, refresh: bool = False,
            started: Callable[[Cell], None] | None = None) -> Iterator[CellResult]:
    """Every planned cell's result (``run_cells``). ``use_cache=False``: the cache is neither read nor written;
    ``refresh``: every cell is lowered again and its entry rewritten; ``started(cell)``: called when a cell's
    lowering begins."""
    cache = Cache(plan.config.cache_dir, enabled=use_cache, refresh=refresh, project=project_folder(plan.config))
    yield from run_cells(plan.cells, cache, jobs=jobs, started=started)


def project_folder(config) -> Path:
    """The folder the project's files are named relative to in the cache (``Cache``'s ``project``): the config's,
    or the working folder where the built-in default is in force."""
    source = Path(config.source)
    return source.resolve().parent if source.is_file() else Path.cwd()
