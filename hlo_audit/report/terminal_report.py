"""`hlo-audit report` on a terminal: the matrix against its goldens, state baked in as constants (when a cell has
any), scan on beside scan off, depth scaling.

Counts carry their change against the golden (red for growth, green for shrinkage). The views aim at 100
columns; a table that needs more (long cell ids) is printed wider rather than cutting a value
(``terminal.print_table``).
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from hlo_audit.hlo.diff import captured_change
from hlo_audit.lowering import MEMORY_KINDS
from hlo_audit.report.escape import terminal as esc
from hlo_audit.report.terminal import (
    STATUS_STYLE,
    add_row,
    dtype_counts,
    make_table,
    print_scaling,
    print_table,
    status,
)
from hlo_audit.report.words import ROLE_SHORT, human_bytes
from hlo_audit.results import FailedCell, LoweredCell
from hlo_audit.rules.wording import plural


def _with_delta(value: int, delta: int | None) -> Text:
    text = Text(str(value))
    if delta:
        text.append(f" {delta:+d}", style="red" if delta > 0 else "green")
    return text


def _delta(delta: int | None) -> Text:
    if delta is None:
        return Text("new", style="yellow")  # no golden to compare with
    return Text(f"{delta:+d}" if delta else "0", style="red" if delta > 0 else "green" if delta < 0 else "")


def print_matrix(console: Console, view) -> None:
    ok, dtypes, roles = view.lowered, view.dtypes, view.roles
    columns = [("cell", "left"), ("params", "right"), ("Δ", "right")]
    columns += [(d, "right") for d in dtypes] + [(ROLE_SHORT.get(r, r), "right") for r in roles]
    columns += [("dead", "right")]  # never-drawn RNG parameters (`hlo-audit rng`)
    table = make_table(console, "entry parameters by dtype and role (Δ: against the golden)", columns)
    for v in ok:
        s, by_dtype, by_role = v.result.summary, v.delta("by_dtype") or {}, v.delta("by_role") or {}
        add_row(table, v.result.cell.id, s.entry_params, _delta(v.total_delta),
                *[_with_delta(s.by_dtype.get(d, 0), by_dtype.get(d)) for d in dtypes],
                *[_with_delta(s.by_role.get(r, 0), by_role.get(r)) for r in roles],
                v.result.rng.dead_params if v.result.rng else "")
    for v in view.cells:
        if isinstance(v.result, FailedCell):
            add_row(table, v.result.cell.id, Text("error", style=STATUS_STYLE["error"]), "",
                    *[""] * (len(dtypes) + len(roles) + 1))
    print_table(console, table)
    unavailable: dict[str, int] = {}
    for v in view.cells:
        if not isinstance(v.result, LoweredCell):
            key = f"{v.result.status}: {v.result.message}"
            unavailable[key] = unavailable.get(key, 0) + 1
    for message, n in unavailable.items():
        status(console, esc(f"{n} {plural(n, 'cell')} {message}", style="dim"))


def print_scan_pairs(console: Console, view) -> None:
    table = make_table(console, "scan on / scan off", [
        ("model/quant/depth", "left"), ("params on", "right"), ("params off", "right"), ("u32 on", "right"),
        ("u32 off", "right"), ("rng on", "right"), ("rng off", "right"), ("off - on", "right")])
    def cells(r):
        return ("", "", "") if r is None else (str(r.entry_params), str(r.count("by_dtype", "u32")), str(r.rng_params))

    for p in view.scan_pairs:
        (p_on, u_on, r_on), (p_off, u_off, r_off) = cells(p.on), cells(p.off)
        add_row(table, p.label, p_on, p_off, u_on, u_off, r_on, r_off,
                "" if p.gap is None else Text(f"{p.gap:+d}", style="red" if p.gap > 0 else ""))
    print_table(console, table)


def _bytes_with_delta(value: int, delta: int | None) -> Text:
    text = Text(human_bytes(value))
    if delta:
        text.append(f" {'+' if delta > 0 else '-'}{human_bytes(abs(delta))}", style="red" if delta > 0 else "green")
    return text


# The terminal's 100 columns hold the gated memory kinds and the flops; markdown, HTML and JSON have every field.
TERMINAL_MEMORY = tuple(kind for kind in MEMORY_KINDS if kind.gated)


def print_compiled(console: Console, view) -> None:
    """Optimized and compiled cells: XLA's memory analysis (per device) and cost analysis, memory against the
    golden."""
    kernels = any(v.result.launches for v in view.with_memory)  # GPU cells: launches per step
    columns = [("cell", "left"), *((kind.label, "right") for kind in TERMINAL_MEMORY), ("GFLOP", "right"),
               *([("kernels", "right")] if kernels else [])]
    table = make_table(console, "compiled: memory per device (Δ: against the golden), GFLOP per step"
                       + (", kernels per step" if kernels else ""), columns)
    for v in view.with_memory:
        memory, delta, cost = v.result.memory, v.memory_delta() or {}, v.result.cost or {}
        add_row(table, v.result.cell.id, *[_bytes_with_delta(memory[k.key], delta.get(k.key))
                                           if k.key in memory else Text("") for k in TERMINAL_MEMORY],
                f"{cost['flops'] / 1e9:,.1f}" if "flops" in cost else "",
                *([_with_delta(v.result.kernels, (v.launches_delta() or {}).get("total"))
                   if v.result.launches else Text("")] if kernels else []))
    print_table(console, table)


def print_captured(console: Console, view) -> None:
    """Cells whose program holds state as constants: what they captured, large constants, literal RNG keys."""
    table = make_table(console, "state baked in as constants (captured: arrays the step closes over)", [
        ("cell", "left"), ("captured", "right"), ("bytes", "right"), ("by dtype", "left"), ("large", "right"),
        ("keys", "right"), ("Δ", "left")])
    for v in view.baking:
        c = v.result.constants
        captured = c.captured
        delta = v.constants_delta
        change = Text("new", style="yellow") if not v.golden_knows_constants else (
            esc(captured_change(delta.to_record()), style="red") if delta else Text("0"))
        add_row(table, v.result.cell.id, captured.arrays if captured else "?",
                human_bytes(captured.bytes) if captured else "",
                dtype_counts(captured.by_dtype_most_first if captured else {}), len(c.large),
                c.frozen_rng.literal_keys, change)
    print_table(console, table)


def print_report(console: Console, view) -> None:
    print_matrix(console, view)
    if view.baking:
        console.print()
        print_captured(console, view)
    console.print()
    print_scan_pairs(console, view)
    if view.with_memory:
        console.print()
        print_compiled(console, view)
    if view.series:
        console.print()
        status(console, Text("depth scaling: params = intercept + slope x layers, projected to full depth",
                           style="bold"))
        print_scaling(console, view.series)
