"""What `hlo-audit measure` prints: a step timed here, A against B, and what the figures recorded beside goldens
say (report/words.py holds every other sentence; these share its host-time and host-cost wording)."""

from __future__ import annotations

from hlo_audit.findings import Finding
from hlo_audit.report.words import message
from hlo_audit.rules.wording import host_time, plural


def measured_change(change) -> str:
    """One metric of B against A (``ab_verdicts.MetricChange``): ``+26.1% (slower, beyond noise)``, ``+0.4% (within
    noise)`` (the ranges overlap), or ``+0.3% (under the 1% minimum effect)`` (apart, but too little to call)."""
    ratio = change.ratio - 1
    if change.beyond_noise:
        return f"{ratio:+.1%} ({'slower' if ratio > 0 else 'faster'}, beyond noise)"
    if change.separated:
        return f"{ratio:+.1%} (under the {change.min_effect:.0%} minimum effect)"
    return f"{ratio:+.1%} (within noise)"


def spread_text(spread, unit: str = "ms") -> str:
    """``75.0 (74.1-76.2)``: the median and the range over rounds."""
    return f"{spread.median:.1f} ({spread.low:.1f}-{spread.high:.1f})" if unit == "ms" else (
        f"{host_time(spread.median)} ({host_time(spread.low)}-{host_time(spread.high)})")


def comparison_headline(comparison) -> str:
    """``nnxjit/scan-off/leak/L4 against nnxjit/scan-off/none/L4 (interleaved rounds, +72 state leaves)``."""
    how = "the golden's recorded timing, not interleaved" if comparison.recorded else "interleaved rounds"
    a, b = comparison.leaves
    return f"{comparison.cell} against {comparison.baseline} ({how}, {b - a:+d} state leaves)"


def measure_notes(report) -> list[str]:
    """What the measurement could not do, and the cells whose golden records no host figure."""
    lines = [f"{row.cell}: not measured: {row.problem}" for row in report.cells if row.problem]
    unrecorded = [row for row in report.cells if row.host is not None and row.golden_host is None]
    # A golden without a figure is compared by the leaves each side's lowering counts, where it records its own
    # (host_cost); a cell without a golden, or whose golden records no count, by nothing.
    for rows, what in (([r for r in unrecorded if r.golden_params is None], "compares nothing for {it}"),
                       ([r for r in unrecorded if r.golden_params is not None and r.golden_leaves is not None],
                        "compares {its} leaves, not {its} time"),
                       ([r for r in unrecorded if r.golden_params is not None and r.golden_leaves is None],
                        "compares nothing for {it} until `hlo-audit golden update` records {its} call's leaves")):
        if rows and not report.recorded:
            one = len(rows) == 1
            said = what.format(it="it" if one else "them", its="its" if one else "their")
            lines.append(f"{len(rows)} of {len(report.cells)} {plural(len(report.cells), 'cell')} "
                         f"{'has' if one else 'have'} no host figure beside {'its' if one else 'their'} golden, so "
                         f"the host_cost rule {said} (`hlo-audit measure --record` writes one)")
    if report.recorded:
        lines.append(f"recorded the host figure{'s' if len(report.recorded) > 1 else ''} of "
                     f"{len(report.recorded)} cell{'s' if len(report.recorded) > 1 else ''} beside the golden")
    return lines


def finding_line(finding: Finding) -> str:
    """What the gate said of a measured cell, as `check` says it: ``CELL: regression: host work per call ...``
    (``advisory`` where the policy warns, ``waived`` with the waiver's reason)."""
    return f"{finding.cell}: {finding.severity}: {message(finding)}"


def measured_on(report) -> str:
    """``measured on tpu: TPU v5 lite: 3 rounds of 20 calls``"""
    rounds, calls = report.rounds.rounds, report.rounds.calls
    return f"measured on {report.device}: {rounds} {plural(rounds, 'round')} of {calls} {plural(calls, 'call')}"


def measured_line(row) -> str:
    """A cell as soon as it is measured (stderr, while the run goes on)."""
    if row.problem:
        return f"hlo-audit: measured {row.cell}: not measured: {row.problem}"
    parts = [f"host figure {host_time(row.host.per_call_us.median)} per call ({row.host.leaves} "
             f"{plural(row.host.leaves, 'leaf', 'leaves')})"]
    if row.timing is not None:
        t = row.timing
        parts.append(f"blocked {t.blocked_ms.median:.1f} ms, queued {t.queued_ms.median:.1f} ms, host "
                     f"{t.host_ms.median:.1f} ms per call, compile {t.compile_s:.1f} s")
    return f"hlo-audit: measured {row.cell}: {'; '.join(parts)}"
