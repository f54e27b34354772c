"""Every sentence hlo-audit prints about a result or a finding, made here once: byte sizes, constants and RNG
headlines, launches, a check's summary, and each finding's message (the gate decides, this module words; terminal,
markdown, JUnit, HTML and the JSON ``message`` say the same thing the same way). A rule's own findings are worded by
its spec, in its module (``RuleSpec.message``, from the pieces in ``rules.wording``); a named rule's by the frame they
share (``_named``: each change's line, ``report.change_words``, and the spec's ``numbers``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hlo_audit.analysed import CapturedState, Constants, Launches, RngSummary
from hlo_audit.comparison import CellDelta, TextVerdict, environment_changes
from hlo_audit.coverage import Coverage
from hlo_audit.findings import (
    Finding,
    LoweringFailure,
    Matches,
    Moved,
    NamedChange,
    Worded,
)
from hlo_audit.hlo.diff import signed_counts
from hlo_audit.report.change_words import change_line
from hlo_audit.report.escape import visible
from hlo_audit.results import LoweredCell, UnavailableCell
from hlo_audit.rules import registry
from hlo_audit.rules.missing_golden import STALE_GOLDEN
from hlo_audit.rules.wording import (
    LOCAL_STACK,
    cells_named,
    environment_text,
    golden_to_now,
    plural,
    program_sizes_text,
)

ROLE_SHORT = {"rng_key": "key", "rng_count": "count", "optimizer_state": "opt"}


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def counts_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


# --------------------------------------------------------------------------------------------------------------
# What a module holds
# --------------------------------------------------------------------------------------------------------------


def constants_headline(constants: Constants) -> str:
    """``constants: 90 (475 bytes); large: 5 (155,189,248 bytes: s8 5); literal RNG keys: 14 (never advance)``"""
    by_dtype: dict[str, int] = {}
    for c in constants.large:
        by_dtype[c.dtype] = by_dtype.get(c.dtype, 0) + 1
    text = f"constants: {constants.constants} ({constants.constant_bytes:,} bytes)"
    text += f"; large: {len(constants.large)} ({constants.large_bytes:,} bytes" + (
        f": {counts_text(by_dtype)})" if by_dtype else ")")
    keys = constants.frozen_rng.literal_keys
    return text + f"; literal RNG keys: {keys}" + (" (never advance)" if keys else "")


def captured_text(captured: CapturedState | None) -> str:
    """``56 arrays, 416.2 MiB (s8 14, bf16 14, u32 28)``; ``unknown`` when the step was not traced here."""
    if captured is None:
        return "unknown"
    by_dtype = captured.by_dtype_most_first
    detail = f" ({counts_text(by_dtype)})" if by_dtype else ""
    return f"{captured.arrays} {plural(captured.arrays, 'array')}, {human_bytes(captured.bytes)}{detail}"


def rng_headline(rng: RngSummary) -> str:
    return (f"{rng.streams} RNG {plural(rng.streams, 'stream')}: {rng.drawn} drawn, {rng.carried} carried (dead "
            f"state), {rng.unknown} unknown")


def key_hazard_lines(rng: RngSummary) -> list[str]:
    """Each literal key drawn from and each key drawn from twice, one line: ``reused: one key drawn from 2 times at
    model.py:20 (jit(step)/jit(_bernoulli)), model.py:21 (...); reading state.key``."""
    lines = []
    for h in rng.key_hazards[:KEY_HAZARDS_SHOWN]:
        where = ", ".join(h.places[:3]) + (f" (+{len(h.places) - 3} more)" if len(h.places) > 3 else "")
        reading = f"; reading {', '.join(h.paths[:2])}" if h.paths else ""
        if h.kind == "literal":
            lines.append(f"literal: a key computed from constants alone, drawn from at {where}: every call draws the "
                         f"same bits")
        elif len(h.places) == 1 and h.draws > 1 and h.subject != "reused key":
            lines.append(f"reused: one key drawn from on every loop iteration, unchanged ({h.draws} draws per step) "
                         f"at {where}{reading}")
        else:
            lines.append(f"reused: one key drawn from {h.draws} times without a split or fold_in between, at "
                         f"{where}{reading}")
    more = rng.key_hazards[KEY_HAZARDS_SHOWN:]
    if more:
        kinds = ", ".join(f"{n} {kind}" for kind in ("literal", "reused") if (n := sum(h.kind == kind for h in more)))
        lines.append(f"... and {len(more)} more keys ({kinds}): --format json lists every one")
    return lines


KEY_HAZARDS_SHOWN = 4


def rng_cost(rng: RngSummary) -> str:
    per_step = "" if rng.increments_exact else " (at least: a loop's trip count is unknown)"
    return (f"dead state: {rng.dead_params} entry {plural(rng.dead_params, 'parameter')} ({rng.dead_bytes:,} "
            f"{plural(rng.dead_bytes, 'byte')}), {rng.dead_increments} counter "
            f"{plural(rng.dead_increments, 'increment')} per step{per_step}")


def common_path_prefix(paths: Sequence[str]) -> str:
    """The dotted components every path starts with (``model.decoder.``), kept whole; "" when there is none."""
    if len(paths) < 2:
        return ""
    split = [p.split(".") for p in paths]
    shared = []
    for parts in zip(*(s[:-1] for s in split)):
        if len(set(parts)) != 1:
            break
        shared.append(parts[0])
    return ".".join(shared) + "." if shared else ""


def frozen_rng_line(constants: Constants | None) -> str:
    """RNG state written into the program as literals, in one sentence; "" when there is none (or nothing is known)."""
    if constants is None:
        return ""
    frozen = constants.frozen_rng
    if not frozen.literal_keys and not frozen.captured_streams:
        return ""
    keys, used = frozen.literal_keys, frozen.used
    text = f"{keys} RNG keys are literals in the program: a literal key never advances"
    if used:
        text += f"; {used} feed the outputs (every call draws the same bits)"
    if keys - used:
        text += f"; {keys - used} only feed random bits no output reads (dead RNG state, baked in)"
    if frozen.sites:
        text += f"; first drawn at {frozen.sites[0]}"
    if frozen.captured_streams:
        text += f"; {sum(frozen.captured_streams.values())} of the step's RNG streams are captured (key and count)"
    return text


def launches_headline(launches: Launches) -> str:
    """``kernels per step: 580 (kernel 439, library 124, copy 17); scalar 68; collectives 0; reading RNG state 0``"""
    bound = "" if launches.exact else " at most (a loop's trip count unknown, or a branch chosen)"
    where = ("; counted from the scheduled module (stage optimized: no thunk sequence before codegen, so launch "
             "dimensions are predicted and what only codegen adds, a sort's copy into its output, is not seen)"
             if launches.from_module else "")
    return (f"kernels per step: {launches.total}{bound} ({counts_text(launches.by_category)}); scalar "
            f"{launches.scalar}; collectives {launches.collectives}; reading RNG state "
            f"{launches.reading_rng}{where}")


def scalar_launch_lines(launches: Launches, top: int = 4) -> list[str]:
    """The largest groups of scalar kernels (one block of one thread), in words."""
    return [g.describe() for g in launches.scalar_groups[:top]]


def depth_values(depths, values) -> str:
    """``L2: 87, L4: 163``: a series' values by depth (a series of one depth: its value, the depth in its label)."""
    if len(depths) == 1:
        return str(values[0])
    return ", ".join(f"L{d}: {v}" for d, v in zip(depths, values))


# --------------------------------------------------------------------------------------------------------------
# A check
# --------------------------------------------------------------------------------------------------------------


def check_summary_text(summary) -> str:
    """A check's numbers in one sentence, the same in every format (``outcome.CheckSummary``):
    ``12 cells: 7 ok, 1 waived, 4 unavailable; findings: 4 advisory (4 folded), 1 waived, 4 unavailable``,
    then ``; 1 stale golden`` when there are any."""
    cells = ", ".join(f"{n} {verdict}" for verdict, n in summary.cells_by_verdict.items())
    text = f"{summary.cells} {plural(summary.cells, 'cell')}" + (f": {cells}" if cells else "")
    findings = []
    for severity, n in summary.findings_by_severity.items():
        folded = f" ({summary.folded} folded)" if severity == "advisory" and summary.folded else ""
        findings.append(f"{n} {severity}{folded}")
    text += f"; findings: {', '.join(findings)}" if findings else "; no findings"
    if summary.stale_goldens:
        text += f"; {summary.stale_goldens} stale golden{'s' if summary.stale_goldens != 1 else ''}"
    return text


def check_line(summary) -> str:
    """``hlo-audit check FAILED: 16 cells: ...``"""
    return f"hlo-audit check {'passed' if summary.passed else 'FAILED'}: {check_summary_text(summary)}"


def folded_line(outcome) -> str:
    """The folded advisories (dead RNG state in most cells of a real model) in one line."""
    rules = sorted({f.rule for f in outcome.folded})
    cells = len({f.cell for f in outcome.folded})
    return (f"{cells} {plural(cells, 'cell')} {'carry' if cells != 1 else 'carries'} never-drawn RNG streams "
            f"({', '.join(rules)}: warn, {outcome.folded_dead_params} dead "
            f"{plural(outcome.folded_dead_params, 'param')}); see `hlo-audit rng CELL`")


def every_cell_refused_line(cells: int) -> str:
    """init where the target refused every cell (each reason on its ``skipped`` line above): it fails."""
    return (f"init: the target refused every cell ({cells}, each reason above): no golden was made and `check` would "
            "gate nothing; make the target lower a cell here (or name models, depths or a platform it lowers), then "
            "run `hlo-audit golden update`")


def init_next_line(update) -> str:
    """What to do after init's first golden update: check (which passes), then commit; where a cell's step computes
    none of its model (said above it), that check fails it until a configuration computes the model or a waiver
    says why (``commands.golden_update.GoldenUpdate.computes_none``)."""
    commit = "then commit hlo-audit.toml, the workflow and golden/"
    dead = len(update.computes_none)
    if not dead:
        return f"next: hlo-audit check (it passes now), {commit}"
    return (f"next: hlo-audit check fails {dead} {plural(dead, 'cell')} whose step computes none of its model "
            f"(above): lower a configuration that computes it, or waive {'it' if dead == 1 else 'them'} with a "
            f"reason (rule dead_model); {commit}")


def nothing_written_line(cells: int) -> str:
    """A golden update that changed nothing (an accept command run again): it says so, before its counts."""
    return (f"nothing to write: the golden{'s' if cells != 1 else ''} of {'these' if cells != 1 else 'this'} "
            f"{cells} cell{'s' if cells != 1 else ''} already hold{'' if cells != 1 else 's'} what "
            f"{'they lower' if cells != 1 else 'it lowers'}")


def lowering_warnings_line(warned) -> str:
    """What a run's lowerings warned, once (``results.LoweringWarnings``): ``2 cells warned while lowering: Some
    donated buffers were not usable (2)``; the four most frequent warnings, the rest counted."""
    shown = "; ".join(f"{text} ({n})" for text, n in warned.by_warning[:4])
    more = len(warned.by_warning) - 4
    return (f"{warned.cells} cell{'s' if warned.cells != 1 else ''} warned while lowering: {shown}" +
            (f"; {more} other warning{'s' if more != 1 else ''}" if more > 0 else ""))


def nothing_to_fit_line(results: list) -> str:
    """Why `scaling` has no series, in one line."""
    unavailable = [r for r in results if isinstance(r, UnavailableCell)]
    if results and len(unavailable) == len(results):
        reasons: dict[str, int] = {}
        for r in unavailable:
            reasons[r.message] = reasons.get(r.message, 0) + 1
        why = "; ".join(f"{n} {plural(n, 'cell')}: {message}" for message, n in reasons.items())
        return f"scaling: every selected cell is unavailable here, so there is nothing to fit ({why})"
    depths = sorted({r.cell.layers for r in results if isinstance(r, LoweredCell)})
    return (f"scaling: no depth series to fit: a series needs two or more depths of one cell, and the selected "
            f"cells have layers {', '.join(map(str, depths)) or 'none'} (try --layers 2,4)")


def stale_golden_line(cell_id: str) -> str:
    return f"stale golden {cell_id}: {STALE_GOLDEN}"


def environment_change(then: Mapping[str, str | None], now: Mapping[str, str | None]) -> str:
    """Every key whose value differs, both ways, in words (``environment_text`` of ``compare.environment_changes``)."""
    return environment_text(environment_changes(then, now))


def message(finding: Finding) -> str:
    """A finding's message: its facts in words, and what waived it. A rule's findings are worded by its spec
    (``RuleSpec.message``, in the rule's module), a named rule's by the frame every named rule shares (``_named``);
    what is no rule's (a cell that matches, one that did not lower) and a finding read back (``Worded``) here."""
    facts = finding.facts
    if isinstance(facts, Worded | LoweringFailure):
        text = facts.message
    elif isinstance(facts, Matches):
        text = "matches its golden"
    else:
        said = registry.spec_of(finding.rule).message
        text = said(facts) if said is not None else _named(facts)
    if finding.waivers:
        text += f" [waived: {'; '.join(sorted({w.reason for w in finding.waivers}))}]"
    return text


# The named rules' findings: the rule's headline, then the structural diff's changes of its kind (change_words).
NAMED_SHOWN = 4  # changes a finding's message lists before "and N more"


def _named(facts: NamedChange) -> str:
    parts = [change_line(c) for c in facts.changes[:NAMED_SHOWN]]
    if len(facts.changes) > NAMED_SHOWN:
        parts.append(f"and {len(facts.changes) - NAMED_SHOWN} more (--format json lists every one)")
    numbers = registry.spec_of(facts.rule).numbers
    parts += numbers(facts) if numbers is not None else []
    said = "; ".join(parts)
    if facts.environment:
        return (f"{said}; but the environment differs from the golden's ({environment_text(facts.environment)}), "
                f"{_MOVED[facts.moved_by]}: {LOCAL_STACK}")
    return f"{said}. If intended: {facts.command}" if facts.worse else f"{said}; record it: {facts.command}"


_MOVED = {
    Moved.OP_MIX: "whose jax and XLA move the op mix",
    Moved.CLOSED_CALLS: ("and one jax writes closed_calls (remat and loop bodies) as calls where the other writes "
                         "them inline, which moves the program's size and its loops; write the goldens with the jax "
                         "that checks them to compare these"),
}


def against_golden_text(delta: CellDelta) -> str:
    """A cell against its golden in one line, from the comparison ``check`` judges by (``comparison.CellDelta``):
    ``against its golden: entry parameters golden 21 -> now 21; text changed; instructions 492 -> 397 (-19.3%), ...``"""
    params = delta.params
    parts = [f"entry parameters {golden_to_now(params.golden, params.now)}"
             + (f" ({signed_counts(params.by_dtype)})" if params.by_dtype else "")]
    parts.append({TextVerdict.NOT_COMPARED: "text not compared", TextVerdict.SAME: "text the same",
                  TextVerdict.RNG_DROPPED: "text differs by RNG state only (dropped)",
                  TextVerdict.RNG_ONLY: "text differs by RNG state only (added)",
                  TextVerdict.RENAMED: "text differs by renamed entry parameters only",
                  TextVerdict.CHANGED: "program changed"}[delta.text])
    if delta.structural is not None:
        parts.append(program_sizes_text(delta.structural.sizes, delta.structural.per_step_by_opcode))
    return "against its golden: " + "; ".join(parts)


# The runs of changed lines a check names one by one; the rest are counted.
RUNS_SHOWN = 6


def coverage_lines(coverage: Coverage) -> list[str]:
    """What the cells reached of the pull request's changed lines (``check --changes``): a line for the change in
    all, then each reached run of changed model code, which cells ran it and in which one's program it is (the
    unreached runs are the ``unreached`` rule's finding)."""
    runs, cells = coverage.runs, len(coverage.cells)
    if not runs:
        others = f" ({len(coverage.not_model)} changed {plural(len(coverage.not_model), 'file')}, none model " \
                 "code: tests, docs, pins...)" if coverage.not_model else ""
        return [f"changes ({coverage.source}): no changed line of model code{others}"]
    reached = [run for run in runs if run.reached_by]
    lines = [f"changes ({coverage.source}): {coverage.changed_lines:,} changed {plural(coverage.changed_lines, 'line')}"
             f" of model code; {sum(len(r.lines) - len(r.unreached) for r in runs):,} reached by the {cells} "
             f"{plural(cells, 'cell')} lowered"
             + (f"; {len(coverage.not_model)} other changed {plural(len(coverage.not_model), 'file')}, not model "
                "code (tests, docs, pins...)" if coverage.not_model else "")]
    for run in reached[:RUNS_SHOWN]:
        program = (f"in the program of {cells_named(run.named_by)}" if run.named_by else "in none's program")
        ran = (f"in all {cells} cells" if len(run.reached_by) == cells > 1 else
               f"in {len(run.reached_by)} of {cells} {plural(cells, 'cell')} ({cells_named(run.reached_by)})")
        lines.append(f"  {run.place} ran {ran}, {program}")
    if len(reached) > RUNS_SHOWN:
        lines.append(f"  and {len(reached) - RUNS_SHOWN} more reached {plural(len(reached) - RUNS_SHOWN, 'run')}")
    if coverage.by_file:
        lines.append(f"  {cells_named(coverage.by_file)}: which files their lowering used, not which lines (Python "
                     "3.11)")
    if coverage.unknown:
        lines.append(f"  {cells_named(coverage.unknown)}: what their lowering reached is not recorded (lower them "
                     "again: --refresh)")
    return lines


def recorded_inputs_lines(recorded) -> list[str]:
    """``check --explain-cache``: what each cell's cached lowering read, the project's own inputs listed in full and
    what installed distributions and the Python keep counted (``cache.RecordedInputs``)."""
    lines = []
    for inputs in recorded:
        lines.append(f"{visible(inputs.cell)}: " + ("unservable: " + visible(inputs.unservable[0])
                                                    if inputs.unservable else "served while all of this holds"))
        lines += [f"  file {visible(path)}: {how}" for path, how in inputs.files]
        lines += [f"  ${visible(name)} = {visible(value) if value is not None else '(unset)'}"
                  for name, value in inputs.environment]
        lines += [f"  path {visible(path)}: {what}" for path, what in inputs.probed]
        lines += [f"  folder listed {visible(path)}" for path in inputs.listed]
        if inputs.absent_modules:
            lines.append(f"  {plural(len(inputs.absent_modules), 'module')} not found: "
                         f"{', '.join(map(visible, inputs.absent_modules[:8]))}"
                         + (f" and {len(inputs.absent_modules) - 8} more" if len(inputs.absent_modules) > 8 else ""))
        if inputs.distributions:
            lines.append(f"  {plural(len(inputs.distributions), 'distribution')} by version: "
                         + ", ".join(f"{visible(n)} {visible(v)}" for n, v in inputs.distributions[:8])
                         + (f" and {len(inputs.distributions) - 8} more" if len(inputs.distributions) > 8 else ""))
    return lines
