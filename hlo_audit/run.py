"""Execute matrix cells: cache lookup, availability, lowering (in-process or in worker processes), analysis.

``run_cells`` is a generator, as pip-audit's core is: each result is yielded the moment it exists, so the
CLI can draw progress and a failing cell never holds up the others. One cell's failure becomes an
``error`` result carrying its one-line message; the rest of the matrix still runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from hlo_audit import host, platforms, preflight, workers
from hlo_audit.analysed import Constants, Launches, ModelReach, Param, RngSummary, placed_text
from hlo_audit.cache import Cache, RecordedInputs, lowering_key
from hlo_audit.cache.reads import Reads, code_reach
from hlo_audit.hlo.analysis import Analysis, analyze
from hlo_audit.hlo.diff import opcode_dtype_histogram
from hlo_audit.hlo.kernels import kernel_digests
from hlo_audit.hlo.launch_model import step_launches
from hlo_audit.hlo.locations import Places, named_lines, text_places
from hlo_audit.hlo.model_work import ModelWork, model_work
from hlo_audit.hlo.normalize import normalize_with_names
from hlo_audit.hlo.rng_keys import PlacedHazard, placed
from hlo_audit.hlo.text import HloParseError
from hlo_audit.lowering import Lowering, Unavailable, one_line
from hlo_audit.matrix import Cell
from hlo_audit.plan import Plan
from hlo_audit.results import CellResult, FailedCell, LoweredCell, UnavailableCell

# Distributions every cell's HLO depends on, whatever its target and platform.
_JAX_DISTRIBUTIONS = ("jax", "jaxlib", "flax")


def environment(cell: Cell, version_names=()) -> dict[str, str]:
    """What the exact HLO text depends on besides the model: the text gate only applies when it matches the
    golden's (jax, jaxlib, flax, the target's versions, the platform's toolchain, platform, stage). The target names
    which distributions it depends on (``Target.versions``: MaxText, TE for a TE recipe); their versions are read
    here, from what is installed, never taken from the lowering process's word."""
    env = {name: host.installed_version(name) for name in _JAX_DISTRIBUTIONS}
    env.update({str(name): host.installed_version(str(name)) for name in version_names})
    env.update(platforms.of(cell).toolchain(cell))
    env["platform"] = cell.platform_label
    env["stage"] = cell.stage
    return env


# The zeros a cell's record places (the cuts that lost its model: a loss multiplied by 0 is one or two).
ZEROED_SHOWN = 4


def analyze_lowering(cell: Cell, lowering: Lowering, seconds: float, key: str, env: dict[str, str],
                     reads: Reads | None = None, roots: tuple[str, ...] = ()) -> LoweredCell:
    """The cell's result from its lowering, analysed here; ``reads``: what the lowering read, which with the lines
    its program names says what of the code under test it reached (``cache.reads.code_reach``)."""
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
        # XLA's text shows no draw: its stage read the keys from the module XLA was handed.
        rng=RngSummary.of(analysis.rng, lowering.key_hazards if lowering.key_hazards is not None else
                          _key_hazards(analysis, names, places)),
        key_hazards=lowering.key_hazards,
        memory=lowering.memory, cost=lowering.cost, constants=Constants.of(analysis.constants), environment=env,
        launches=Launches.of(launches) if launches is not None else None,
        kernels_by_name=kernel_digests(analysis.module) or None,
        hlo_sha256=_sha256(lowering.text), lower_seconds=round(seconds, 3), key=key,
        normalized=normalized, places=places, call_leaves=lowering.call_leaves, mesh_sizes=lowering.mesh_sizes,
        model=_model_reach(model_work(analysis.module, analysis.params), names, places),
        reach=code_reach(reads, named_lines(analysis.module, lowering.metadata), roots) if reads is not None else None,
    )


def _model_reach(work: ModelWork, names: Mapping[tuple[str, str], tuple[str, str]],
                 places: Places | None) -> ModelReach:
    """What of its model the step computes, each zero that cut it off placed by its canonical name's origin
    (``file:line (op_name)``), else named."""
    def placed(raw: tuple[str, str]) -> str:
        canonical = names.get(raw, raw)
        origin = places.get(canonical) if places else None
        fallback = f"{canonical[1]} in {canonical[0]}"
        return placed_text(origin.source, origin.op_name, fallback) if origin is not None else fallback
    return ModelReach(work.contractions, work.reaching, work.mixes,
                      tuple(placed(z) for z in work.zeroed[:ZEROED_SHOWN]))


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


def run_cells(cells: Iterable[Cell], cache: Cache, jobs: int = 1,
              started: Callable[[Cell], None] | None = None) -> Iterator[CellResult]:
    """Yield one CellResult per cell: cached ones first, then as lowerings finish. ``started(cell)`` is called
    when a cell's lowering begins (the CLI's heartbeat names the cells in flight).

    A cell is served from the cache only through a manifest variant whose reads all still hold and entries that
    verify (``hlo_audit.cache``); anything else is lowered (or, with its lowering intact, analysed) again. Lowering
    happens in the lowering processes only (``hlo_audit.worker``): this process never imports a target."""
    pending: list[tuple[Cell, str]] = []
    for cell in cells:
        key = lowering_key(cell)
        entry = cache.lookup(key, cell.id)
        cached = cache.get_result(entry, cell.id) if entry else None
        if cached is not None:
            yield cached
            continue
        try:
            platforms.of(cell).check_available(cell)
        except Unavailable as exc:
            yield UnavailableCell(cell=cell, message=one_line(exc), key=key)
            continue
        hit = cache.get_lowering(entry, cell.id) if entry else None
        if hit is not None:  # lowered before, analysis code changed since (or its result did not verify)
            text, meta = hit
            result = replace(analyze_lowering(cell, Lowering.from_cache(text, meta), meta.get("seconds", 0.0), entry,
                                              environment(cell, meta.get("versions", ())),
                                              cache.variant_reads(key, entry, cell.id), cache.roots),
                             cached=True, text=text)
            cache.put_result(entry, result)
            yield result
            continue
        pending.append((cell, key))
    yield from _lower_pending(pending, cache, jobs, started or (lambda cell: None))


def _lower_pending(pending: list[tuple[Cell, str]], cache: Cache, jobs: int,
                   started: Callable[[Cell], None]) -> Iterator[CellResult]:
    if not pending:
        return
    preflight.check_xla_flags()  # XLA aborts the process that lowers on a flag it refuses: asked in a child first
    preflight.check_platforms()  # JAX_PLATFORMS=tpu on a host without one: one line, not every cell failing
    # A cell compiling for TPU holds ~1.4 GB: --jobs is an upper bound, the machine's memory the other.
    workers_now = host.workers_for([platforms.of(cell).worker_bytes(cell) for cell, _ in pending], jobs)
    keys = {cell.id: key for cell, key in pending}
    by_target: dict[str, list[Cell]] = {}
    for cell, _ in pending:
        by_target.setdefault(cell.target, []).append(cell)
    for target, cells in by_target.items():
        for event in workers.lower(target, cells, workers_now):
            if isinstance(event, workers.Started):
                started(event.cell)
            elif isinstance(event, workers.TargetFailed):
                yield from (FailedCell(cell=cell, message=event.message) for cell in cells)
            else:
                yield _received(cache, event, keys[event.cell.id])


def _received(cache: Cache, ended: workers.Ended, key: str) -> CellResult:
    """A cell's lowering as its process wrote it, analysed here and stored: a process that ended without a result,
    or with one of another shape, is a failed cell, never a pass."""
    cell, sent = ended.cell, ended.result
    if sent is None:
        return FailedCell(cell=cell, key=key, message=f"its lowering process ended ({ended.how}) before returning a "
                                                      f"result: the code under test ended it (os._exit, a signal) "
                                                      f"or it ran out of memory")
    warned = tuple(str(w) for w in sent.get("warnings", ()) if isinstance(w, str))
    status = sent.get("status")
    if status == "unavailable":
        return UnavailableCell(cell=cell, message=str(sent.get("message", "")), key=key)
    if status != "ok":
        return FailedCell(cell=cell, message=str(sent.get("message", "its lowering failed")), key=key,
                          warnings=warned, config_refused=sent.get("config_refused") is True)
    try:
        text, meta = sent["text"], sent["meta"]
        if not isinstance(text, str) or not isinstance(meta, dict):
            raise ValueError("no text")
        lowering = Lowering.from_cache(text, meta)
        reads = Reads.from_record(sent["reads"])
        names = [str(name) for name in sent.get("versions", {})]
        seconds = float(sent.get("seconds", 0.0))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return FailedCell(cell=cell, key=key, message=f"its lowering process sent a result of another shape ({exc})")
    try:
        result = analyze_lowering(cell, lowering, seconds, key, environment(cell, names), reads, cache.roots)
    except HloParseError as exc:
        return FailedCell(cell=cell, message=f"unparseable HLO: {one_line(exc)}", key=key, warnings=warned)
    why = f"unservable: {reads.unservable[0]}" if reads.unservable else cache.missed.get(cell.id, "")
    result = replace(result, warnings=warned, relowered_because=why)
    return cache.put(result.key, replace(result, text=lowering.text), lowering, reads, names)


def execute(plan: Plan, jobs: int = 1, use_cache: bool = True, refresh: bool = False,
            started: Callable[[Cell], None] | None = None) -> Iterator[CellResult]:
    """Every planned cell's result (``run_cells``). ``use_cache=False``: the cache is neither read nor written;
    ``refresh``: every cell is lowered again and its entry rewritten; ``started(cell)``: called when a cell's
    lowering begins."""
    cache = Cache(plan.config.cache_dir, enabled=use_cache, refresh=refresh, project=project_folder(plan.config))
    yield from run_cells(plan.cells, cache, jobs=jobs, started=started)


def recorded_inputs(plan: Plan) -> list[RecordedInputs]:
    """What each planned cell's newest cached lowering read (``check --explain-cache``); cells never lowered with
    this run's key are left out."""
    cache = Cache(plan.config.cache_dir, project=project_folder(plan.config))
    found = (cache.recorded(lowering_key(cell), cell.id) for cell in plan.cells)
    return [inputs for inputs in found if inputs is not None]


def project_folder(config) -> Path:
    """The folder the project's files are named relative to in the cache (``Cache``'s ``project``): the repository
    the config is in (its git top level: a module above the config's folder, in a monorepo, is the project's too,
    so a copy or a second worktree checks its own), else the config's folder, else the working folder where the
    built-in default is in force."""
    source = Path(config.source)
    folder = source.resolve().parent if source.is_file() else Path.cwd()
    return next((above for above in (folder, *folder.parents) if (above / ".git").exists()), folder)
