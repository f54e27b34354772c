"""Every sentence hlo-audit prints about a result or a finding, made here once: byte sizes, constants and RNG
headlines, launches, a check's summary, and each finding's message from its typed facts (the gate decides, this
module words; terminal, markdown, JUnit, HTML and the JSON ``message`` say the same thing the same way)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hlo_audit.analysed import CapturedState, Constants, Launches, RngSummary
from hlo_audit.comparison import CellDelta, TextVerdict, environment_changes
from hlo_audit.findings import (
    CountChange,
    CountKind,
    DeadRng,
    EnvironmentChange,
    Finding,
    GoldenPart,
    IncrementChange,
    LaunchChange,
    LaunchScaling,
    LoweringFailure,
    Matches,
    MemoryChange,
    MissingGolden,
    Moved,
    NamedChange,
    PatternChanges,
    RngScaling,
    SlopeChange,
    StaleGolden,
    StaleWaiver,
    TextChange,
    TextKind,
    Unjudged,
    Worded,
)
from hlo_audit.hlo.diff import captured_change, signed_counts
from hlo_audit.host_cost import HostCostChange
from hlo_audit.report.change_words import change_line
from hlo_audit.report.escape import visible
from hlo_audit.results import LoweredCell, UnavailableCell
from hlo_audit.rules import registry
from hlo_audit.rules.wording import byte_changes, golden_to_now, plural, program_sizes_text

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


def change_text(before: Mapping[str, int], after: Mapping[str, int], delta: Mapping[str, int],
                labelled: bool = False) -> str:
    """``kernels per step 580 -> 622 (+42, scalar +42)``: two programs' gated launch counts (``total``, ``scalar``,
    ``collectives``) and their differences, as ``diff`` says them (its files named above); ``labelled``: a finding's
    ``golden 580 -> now 622``."""
    moved = ", ".join(f"{v:+d}" if k == "total" else f"{k} {v:+d}" for k, v in delta.items())
    counts = (golden_to_now(before['total'], after['total']) if labelled
              else f"{before['total']} -> {after['total']}")
    return f"kernels per step {counts}" + (f" ({moved})" if moved else " (unchanged)")


def launches_change_text(change: LaunchChange, labelled: bool = False) -> str:
    """``kernels per step 580 -> 622 (+42, scalar +42)`` of two programs' launches (``compare.launch_comparison``)."""
    return change_text(change.golden, change.now, change.delta, labelled)


def launch_lines(change: LaunchChange) -> list[str]:
    """The launch groups that came (``+42 scalar kernels loop_add_fusion, each reading ...``) and went."""
    return [g.describe(signed=True) for g in change.groups]


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


STALE_GOLDEN = "golden without a cell in the matrix (remove with `hlo-audit golden update --prune`)"


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


def environment_text(changes: Sequence[EnvironmentChange]) -> str:
    """``jax 0.11.0 -> 0.12.0.1, libtpu 0.0.52 -> (none), maxtext (none) -> 0.2.5``"""
    def shown(value) -> str:
        return "(none)" if value is None else str(value)

    return ", ".join(f"{c.key} {shown(c.golden)} -> {shown(c.now)}" for c in changes)


def environment_change(then: Mapping[str, str | None], now: Mapping[str, str | None]) -> str:
    """Every key whose value differs, both ways, in words (``environment_text`` of ``compare.environment_changes``)."""
    return environment_text(environment_changes(then, now))


def message(finding: Finding) -> str:
    """A finding's message: its facts in words, and what waived it."""
    text = _MESSAGES[type(finding.facts)](finding.facts)
    if finding.waivers:
        text += f" [waived: {'; '.join(sorted({w.reason for w in finding.waivers}))}]"
    return text


# What each part of a golden a rule compares is called (``golden.health``); which rules compare it is their specs' to
# say (``rules.registry.comparing``).
GOLDEN_PARTS = {
    GoldenPart.TEXT: "its text",
    GoldenPart.KERNEL_DIGESTS: "kernel digests",
    GoldenPart.LAUNCHES: "launches per step",
    GoldenPart.MEMORY: "memory",
    GoldenPart.CONSTANTS: "state captured as constants",
    GoldenPart.RNG_INCREMENTS: "RNG counter increments",
    GoldenPart.PATTERN_ROLES: "roles per path pattern",
    GoldenPart.SLOPES: "per-layer slopes",
    GoldenPart.HOST_FIGURE: "its host figure (its `measured` timing is there)",
    GoldenPart.CALL_LEAVES: "its call's state leaves",
}
RULES_NAMED = 5  # the rules a missing part's finding names before "and N more"

# What a text rule's advisory under another compiler stack adds: which run keeps it advisory (``stack.stack_mode``).
LOCAL_STACK = "advisory on this local run (a pinned CI run fails it: CI=true)"


def _missing(facts: MissingGolden) -> str:
    if facts.why is None:
        return f"no golden for this cell; create it with: {facts.command}"
    if facts.stack:
        return (f"{facts.why}: recorded under another compiler stack ({environment_text(facts.stack)}), and this "
                f"run's stack is pinned ({facts.pinned_by}: a CI runner's stack is fixed, so the difference is a "
                f"mistake, never advisory); re-bless it under this stack: {facts.command}")
    if not facts.lacks:
        return f"{facts.why}; regenerate it with: {facts.command}"
    parts = and_list([GOLDEN_PARTS[p] for p in facts.lacks])
    rules = list(dict.fromkeys(r for p in facts.lacks for r in registry.comparing(p)))
    named = rules if len(rules) <= RULES_NAMED else [*rules[:RULES_NAMED - 1], f"{len(rules) - RULES_NAMED + 1} more"]
    lacks = (f"without {parts}: the rule{'s' if len(rules) > 1 else ''} {and_list(named)} "
             f"ha{'ve' if len(rules) > 1 else 's'} nothing to compare for this cell")
    if facts.damaged:
        return f"{facts.why}: damaged: says golden format {facts.golden_format}, yet {lacks}; regenerate it with: " \
               f"{facts.command}"
    return (f"{facts.why}: written by an older hlo-audit (golden format {facts.golden_format}) {lacks}; refresh it "
            f"with: {facts.command}")


def and_list(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _count(facts: CountChange) -> str:
    changes = []
    if facts.by_dtype or facts.by_role:
        changes.append(f"entry parameters {golden_to_now(facts.golden_params, facts.now_params)}: "
                       f"{signed_counts(facts.by_dtype) or 'dtypes unchanged'}"
                       + (f" ({signed_counts(facts.by_role)})" if facts.by_role else ""))
    changes += [patterns_text(facts.patterns)] if facts.patterns else []
    changes += [captured_change(facts.captured.to_record())] if facts.captured else []
    changes += [increments_text(facts.increments)] if facts.increments else []
    changes += [launches_text(facts.launches)] if facts.launches else []
    changes += [slopes_text(facts.slopes)] if facts.slopes else []
    said = "; ".join(changes)
    return {CountKind.GREW: f"{said}. If intended: {facts.command}",
            CountKind.MOVED: f"{said}; record it: {facts.command}",
            CountKind.SHRANK: f"{said}; tighten the golden: {facts.command}",
            CountKind.CHANGED: f"{said}: fewer of what the step needs is a change to judge, not an improvement. "
                               f"If intended: {facts.command}"}[facts.kind]


def patterns_text(patterns: PatternChanges) -> str:
    """``grown: +84 ...to_nnx__rngs.* (rng_count +42, rng_key +42); renamed: a -> b (6 params)``"""
    def entry(change) -> str:
        roles = f" ({signed_counts(change.roles)})" if change.roles else ""
        return f"{change.delta:+d} {change.pattern}{roles}"

    parts = [f"{kind}: {', '.join(entry(c) for c in getattr(patterns, kind))}" for kind in ("grown", "shrunk")
             if getattr(patterns, kind)]
    if patterns.renamed:
        parts.append("renamed: " + ", ".join(f"{r.before} -> {r.after} ({r.params} {plural(r.params, 'param')})"
                                             for r in patterns.renamed))
    if patterns.retyped:
        parts.append("retyped: " + ", ".join(f"{r.pattern} ({signed_counts({**r.dtypes, **r.roles})})"
                                             for r in patterns.retyped))
    return "; ".join(parts)


PARAM_GROUPS_SHOWN = 4  # parameter groups a text finding names before "and N more"


def param_groups_text(groups) -> str:
    """``+2 state.model.layers.*.scale (f32 weight), -2 ...``: the entry parameters a text differs by, by path
    pattern (``hlo.diff.ParamGroupDelta``); "" when none."""
    shown = ", ".join(f"{g.count:+d} {g.pattern} ({g.dtype} {g.role})" for g in groups[:PARAM_GROUPS_SHOWN])
    more = len(groups) - PARAM_GROUPS_SHOWN
    return shown + (f" and {more} more groups" if more > 0 else "")


def increments_text(increments: IncrementChange) -> str:
    """``RNG counter increments per step 7 -> 679 (carried +672), in state.model...rngs (x3 streams: a, b, c)``"""
    text = (f"RNG counter increments per step {golden_to_now(increments.golden, increments.now, 'g')} "
            f"({signed_counts(increments.by_verdict)})")
    grown = [f"{pattern} {delta:+g} ({', '.join(increments.paths.get(pattern, ()))})"
             for pattern, delta in increments.by_pattern.items() if delta > 0]
    return text + (f" in {'; '.join(grown)}" if grown else "")


def launches_text(launches: LaunchChange) -> str:
    """``kernels per step 580 -> 622 (+42, scalar +42): +42 scalar kernels loop_add_fusion, each reading ...``"""
    lines = launch_lines(launches)
    more = f"; and {len(lines) - 3} more launch groups" if len(lines) > 3 else ""
    return launches_change_text(launches, labelled=True) + (f": {'; '.join(lines[:3])}{more}" if lines else "")


_SLOPE_WORDS = {"params_per_layer": "entry parameters per layer", "rng_per_layer": "RNG parameters per layer",
                "kernels_per_layer": "kernels per layer",
                "rng_kernels_per_layer": "kernels reading RNG state per layer"}


def slopes_text(slopes: SlopeChange) -> str:
    return "; ".join(f"{_SLOPE_WORDS[k]} {golden_to_now(a, b, '+g')}" for k, (a, b) in slopes.moved.items())


def _text(facts: TextChange) -> str:
    if facts.verdict == "rng-state-only":
        rng = facts.rng_params
        amount = (f"{abs(rng)} {'fewer' if rng < 0 else 'more'} RNG {plural(rng, 'parameter')}" if rng
                  else "RNG bookkeeping")
        what = f"normalized HLO differs from the golden by RNG state only ({amount}; rng-state-only)"
    else:
        kinds = f" ({', '.join(facts.changes)})" if facts.changes else ""
        what = f"normalized HLO differs from the golden in {_program_change(facts)}: {facts.verdict}{kinds}"
    if facts.params:
        what += f"; entry parameters {param_groups_text(facts.params)}"
    if facts.kind is TextKind.MOVED:
        return (f"{what}, but the environment differs from the golden's ({environment_text(facts.environment)}): "
                f"{LOCAL_STACK}; counts still gate")
    if facts.kind is TextKind.RNG_DROPPED:
        return f"{what}; accept it: {facts.command}"
    if facts.kind is TextKind.RENAMED:
        renames = "; ".join(change_line(c) for c in facts.renames)
        return (f"normalized HLO differs from the golden only by renamed entry parameters (renamed-only: the same "
                f"program): {renames}; record it: {facts.command}")
    return f"{what}. If intended: {facts.command}"


def _program_change(facts: TextChange) -> str:
    """What differs, in the program's terms: ``44 instructions (44 removed; 9,038 text lines)``, the instructions the
    structural match added, removed and changed (renumbering, which moves every later line of the text, is none);
    the text's lines beside. Where the match says no instruction differs (a kernel's content), the lines."""
    lines = f"{facts.changed_lines:,} {plural(facts.changed_lines, 'line')}"
    m = facts.match
    counts = ((m.inserted, "added"), (m.deleted, "removed"), (m.changed, "changed")) if m is not None else ()
    parts = [f"{n:,} {word}" for n, word in counts if n]
    if not parts:
        return lines
    total = sum(n for n, _ in counts)
    return f"{total:,} {plural(total, 'instruction')} ({', '.join(parts)}; {facts.changed_lines:,} text " \
           f"{plural(facts.changed_lines, 'line')})"


def _memory(facts: MemoryChange) -> str:
    if facts.grew:
        grown = {k: v for k, v in facts.changed.items() if v[1] > v[0]}
        return (f"compiled memory grew beyond {facts.tolerance:.0%} of the golden: {byte_changes(grown)}."
                f" If intended: {facts.command}")
    if facts.program_changed:
        return (f"compiled memory shrank: {byte_changes(facts.changed)}, with the program changed: less memory for "
                f"another program is a change to judge, not an improvement. If intended: {facts.command}")
    return f"compiled memory shrank: {byte_changes(facts.changed)}; tighten the golden: {facts.command}"


def host_time(us: float, signed: bool = False) -> str:
    """Microseconds as people read them: ``812 us``, ``26.3 ms`` (``signed``: ``+26.3 ms``)."""
    sign = "+" if signed and us > 0 else "-" if signed and us < 0 else ""
    magnitude = abs(us) if signed else us
    return f"{sign}{magnitude / 1e3:.1f} ms" if magnitude >= 1000 else f"{sign}{magnitude:.0f} us"


def host_cost_text(facts: HostCostChange) -> str:
    leaves = f"{facts.leaves_delta:+d} state leaves"
    unborne = "" if not facts.claim_unborne else (
        f"; the golden claims {facts.golden_leaves} leaves, its entry's {facts.golden_params} parameters and this step "
        f"bear out {facts.implied}")
    if not facts.timed:  # the leaves alone: no figure measured on one side or the other
        cost = "" if facts.now is None else f", {host_time(facts.now.per_call_us.median)} per call now"
        head = (f"host work per call: {facts.implied} -> {facts.now_leaves} state leaves the call flattens "
                f"({leaves}{cost})")
        tail = "" if not facts.worse else " (`hlo-audit measure` times what each costs)"
        return (f"{head}{unborne}{tail}. If intended: {facts.command}" if facts.worse
                else f"{head}{unborne}; record the smaller count: {facts.command}")
    head = (f"host work per call {host_time(facts.median_delta_us, signed=True)} ({leaves}) through {facts.caller}: "
            f"{host_time(facts.golden.per_call_us.median)} -> {host_time(facts.now.per_call_us.median)}")
    noise = "" if facts.beyond_spread else " (the times are within their rounds' spread: the leaves decide)"
    where = "" if facts.same_machine else (f"; the golden's time was measured on another machine "
                                           f"({facts.golden.machine or 'unknown'})")
    if facts.worse:
        return f"{head}{noise}{where}{unborne}. If intended: {facts.command}"
    return f"{head}{noise}{where}{unborne}; record the smaller figure: {facts.command}"


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


def _rng_scaling(facts: RngScaling) -> str:
    where = ", ".join(f"{p} {n:+g}" for p, n in list(facts.patterns.items())[:PARAM_GROUPS_SHOWN])
    more = len(facts.patterns) - PARAM_GROUPS_SHOWN
    return (f"RNG parameters grow by {facts.slope:g} per layer in an unrolled model "
            f"({', '.join(f'{k} {v:+g}' for k, v in facts.by_role.items())}; "
            f"depths {', '.join(map(str, facts.depths))})"
            + (f": per layer {where}" + (f" and {more} more patterns" if more > 0 else "") if where else ""))


def _launch_scaling(facts: LaunchScaling) -> str:
    depths = facts.depths
    grown = [g.describe(signed=True) for g in facts.groups if g.count > 0][:3]
    return (f"kernels that read RNG state grow by {facts.slope:g} per layer in an unrolled model "
            f"({', '.join(f'{k} {v:+g}' for k, v in facts.per_layer.items())} per layer; depths "
            f"{', '.join(map(str, depths))})"
            + (f"; from L{depths[0]} to L{depths[-1]}: {'; '.join(grown)}" if grown else ""))


def _dead_rng(facts: DeadRng) -> str:
    more = (f" and {len(facts.patterns) - 1} more {plural(len(facts.patterns) - 1, 'pattern')}"
            if len(facts.patterns) > 1 else "")
    return (f"{facts.streams} RNG {plural(facts.streams, 'stream')} never drawn: {facts.params} entry "
            f"{plural(facts.params, 'parameter')} and {facts.increments:g} counter "
            f"{plural(facts.increments, 'increment')} per step of dead state (largest: {facts.largest} "
            f"x{facts.largest_streams}{more}); see `hlo-audit rng {facts.cell}`")


def _stale_waiver(facts: StaleWaiver) -> str:
    w = facts.waiver
    what = (f"covers {facts.covered} {plural(facts.covered, 'cell')}, none of which has a {w.rule} finding to waive"
            if facts.covered
            else "matches no cell of the matrix")
    return (f"waiver for {w.rule} {dict(w.match)} {what}: drop it, or it will hide that regression coming back "
            f"(reason given: {w.reason})")


_MESSAGES: dict[type, Callable] = {
    Matches: lambda facts: "matches its golden",
    LoweringFailure: lambda facts: facts.message,
    Unjudged: lambda facts: (f"cannot be judged here ({facts.status}: {facts.message}), yet it has a golden "
                             f"({facts.golden}): a pass would say nothing of it; make it lower here, or waive it "
                             f"with a reason (rule \"unjudged\")"),
    MissingGolden: _missing,
    StaleGolden: lambda facts: STALE_GOLDEN,
    CountChange: _count,
    TextChange: _text,
    MemoryChange: _memory,
    RngScaling: _rng_scaling,
    LaunchScaling: _launch_scaling,
    DeadRng: _dead_rng,
    StaleWaiver: _stale_waiver,
    NamedChange: _named,
    HostCostChange: host_cost_text,
    Worded: lambda facts: facts.message,
}


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
