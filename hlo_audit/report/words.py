"""The wording every format shares: byte sizes, constants and RNG headlines (terminal, markdown and HTML say the
same thing the same way)."""

from __future__ import annotations

from collections.abc import Sequence

from hlo_audit.hlo.constants import frozen_rng
from hlo_audit.hlo.thunks import LaunchGroup, change_text

ROLE_SHORT = {"rng_key": "key", "rng_count": "count", "optimizer_state": "opt"}


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def constants_headline(record: dict) -> str:
    """``constants: 90 (475 bytes); large: 5 (155,189,248 bytes: s8 5); literal RNG keys: 14 (never advance)``"""
    large = record["large"]
    by_dtype: dict[str, int] = {}
    for c in large:
        by_dtype[c["dtype"]] = by_dtype.get(c["dtype"], 0) + 1
    text = f"constants: {record['constants']} ({record['constant_bytes']:,} bytes)"
    text += f"; large: {len(large)} ({record['large_bytes']:,} bytes" + (
        f": {counts_text(by_dtype)})" if by_dtype else ")")
    keys = frozen_rng(record)["literal_keys"]
    return text + f"; literal RNG keys: {keys}" + (" (never advance)" if keys else "")


def captured_text(captured: dict | None) -> str:
    """``56 arrays, 416.2 MiB (s8 14, bf16 14, u32 28)``; ``unknown`` when the step was not traced here."""
    if captured is None:
        return "unknown"
    by_dtype = captured_by_dtype(captured)
    detail = f" ({counts_text(by_dtype)})" if by_dtype else ""
    return f"{captured['arrays']} arrays, {human_bytes(captured['bytes'])}{detail}"


def captured_by_dtype(captured: dict | None) -> dict[str, int]:
    """Captured arrays per dtype, most first (a cached result's JSON has its keys sorted by name)."""
    return dict(sorted((captured or {}).get("by_dtype", {}).items(), key=lambda kv: (-kv[1], kv[0])))


def counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def rng_headline(record: dict) -> str:
    return (f"{record['streams']} RNG streams: {record['drawn']} drawn, {record['carried']} carried (dead state), "
            f"{record['unknown']} unknown")


def rng_cost(record: dict) -> str:
    per_step = "" if record["increments_exact"] else " (at least: a loop's trip count is unknown)"
    return (f"dead state: {record['dead_params']} entry parameters ({record['dead_bytes']:,} bytes), "
            f"{record['dead_increments']} counter increments per step{per_step}")


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


def frozen_rng_line(constants: dict | None) -> str:
    """RNG state written into the program as literals, in one sentence; "" when there is none (or nothing is known)."""
    if constants is None:
        return ""
    frozen = frozen_rng(constants)
    if not frozen["literal_keys"] and not frozen["captured_streams"]:
        return ""
    keys, used = frozen["literal_keys"], frozen["used"]
    text = f"{keys} RNG keys are literals in the program: a literal key never advances"
    if used:
        text += f"; {used} feed the outputs (every call draws the same bits)"
    if keys - used:
        text += f"; {keys - used} only feed random bits no output reads (dead RNG state, baked in)"
    if frozen["sites"]:
        text += f"; first drawn at {frozen['sites'][0]}"
    if frozen["captured_streams"]:
        text += f"; {sum(frozen['captured_streams'].values())} of the step's RNG streams are captured (key and count)"
    return text


def check_summary_text(summary) -> str:
    """A check's numbers in one sentence, the same in every format (``gate.CheckSummary``):
    ``12 cells: 7 ok, 1 waived, 4 unavailable; findings: 4 advisory (4 folded), 1 waived, 4 unavailable``,
    then ``; 1 stale golden`` when there are any."""
    cells = ", ".join(f"{n} {verdict}" for verdict, n in summary.cells_by_verdict.items())
    text = f"{summary.cells} cells" + (f": {cells}" if cells else "")
    findings = []
    for severity, n in summary.findings_by_severity.items():
        folded = f" ({summary.folded} folded)" if severity == "advisory" and summary.folded else ""
        findings.append(f"{n} {severity}{folded}")
    text += f"; findings: {', '.join(findings)}" if findings else "; no findings"
    if summary.stale_goldens:
        text += f"; {summary.stale_goldens} stale golden{'s' if summary.stale_goldens != 1 else ''}"
    return text


def launches_headline(record: dict) -> str:
    """``kernels per step: 580 (kernel 439, library 124, copy 17); scalar 68; collectives 0; reading RNG state 0``
    (a GPU program's launches record, ``hlo.thunks.LaunchReport.to_record``)."""
    bound = "" if record["exact"] else " at most (a loop's trip count unknown, or a branch chosen)"
    where = ("; counted from the scheduled module (stage optimized: no thunk sequence before codegen, so launch "
             "dimensions are predicted and what only codegen adds, a sort's copy into its output, is not seen)"
             if record["from_module"] else "")
    return (f"kernels per step: {record['total']}{bound} ({counts_text(record['by_category'])}); scalar "
            f"{record['scalar']}; collectives {record['collectives']}; reading RNG state "
            f"{record.get('reading_rng', 0)}{where}")


def scalar_launch_lines(record: dict, top: int = 4) -> list[str]:
    """The largest groups of scalar kernels (one block of one thread), in words."""
    return [LaunchGroup(**g).describe() for g in record.get("scalar_groups", [])[:top]]


def launches_change_text(change: dict) -> str:
    """``kernels per step 580 -> 622 (+42, scalar +42)`` of two launches records (``audit.launches_diff``)."""
    return change_text(change["golden"], change["now"], change["delta"])
