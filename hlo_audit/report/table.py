"""Terminal tables. Rich boxes on a terminal; plain aligned text when piped (and NO_COLOR honored)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from hlo_audit.hlo.analysis import Analysis
from hlo_audit.hlo.diff import ModuleDiff


def make_console(file=None) -> Console:
    file = file or sys.stdout
    terminal = file.isatty()
    # Piped output is for grep and CI logs: no colors, no boxes, wide enough that paths stay on a line.
    return Console(file=file, force_terminal=terminal, no_color=not terminal or "NO_COLOR" in os.environ,
                   width=None if terminal else 160, highlight=False, soft_wrap=False)


def _table(console: Console, title: str, columns: Sequence[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD if console.is_terminal else None,
                  pad_edge=False, show_edge=False)
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")
    return table


def print_count(console: Console, analyses: Sequence[Analysis], top: int = 20) -> None:
    for a in analyses:
        s = a.summary
        console.print(Text(f"{a.source}  module {a.module.name}: {s.entry_params} entry parameters", style="bold"))
        dtypes = _table(console, "by dtype", [("dtype", "left"), ("params", "right")])
        for dtype, n in s.by_dtype.items():
            dtypes.add_row(dtype, str(n))
        roles = _table(console, "by role", [("role", "left"), ("params", "right"), ("bytes", "right")])
        for role, n in s.by_role.items():
            roles.add_row(role, str(n), f"{s.bytes_by_role.get(role, 0):,}")
        console.print(dtypes)
        console.print(roles)
        groups = list(s.groups.items())
        shown = groups if top <= 0 else groups[:top]
        table = _table(console, f"groups ({len(shown)} of {len(groups)})", [("pattern", "left"), ("params", "right")])
        for pattern, n in shown:
            table.add_row(pattern, str(n))
        console.print(table)
        console.print()


def print_diff(console: Console, d: ModuleDiff, old: str, new: str) -> None:
    style = {"identical": "green", "identical-after-normalization": "green",
             "rng-state-only": "yellow", "changed": "red"}[d.verdict]
    verdict = Text(f"verdict: {d.verdict}", style=f"bold {style}")
    if d.changes:
        verdict.append(f" ({', '.join(d.changes)})")
    console.print(verdict)
    console.print(f"entry parameters: {d.entry_params[0]} -> {d.entry_params[1]}  ({old} -> {new})")
    if d.by_dtype_delta or d.by_role_delta:
        deltas = _table(console, "parameter deltas", [("by", "left"), ("key", "left"), ("delta", "right")])
        for k, v in d.by_dtype_delta.items():
            deltas.add_row("dtype", k, _signed(v))
        for k, v in d.by_role_delta.items():
            deltas.add_row("role", k, _signed(v))
        console.print(deltas)
    groups = d.params_added + d.params_removed
    if groups:
        table = _table(console, "parameters added / removed",
                       [("delta", "right"), ("role", "left"), ("dtype", "left"), ("pattern", "left")])
        for g in groups:
            table.add_row(_signed(g.count), g.role, g.dtype, g.pattern)
        console.print(table)
    if d.opcode_dtype_delta:
        ops = _table(console, "opcode:dtype deltas", [("opcode:dtype", "left"), ("delta", "right")])
        for k, v in sorted(d.opcode_dtype_delta.items(), key=lambda kv: (-abs(kv[1]), kv[0])):
            ops.add_row(k, _signed(v))
        console.print(ops)
    if d.computations_added or d.computations_removed:
        console.print(f"computations: +{len(d.computations_added)} -{len(d.computations_removed)}")
    if d.text_diff:
        console.print(Text("normalized text diff:", style="bold"))
        for line in d.text_diff:
            color = "green" if line.startswith("+") else "red" if line.startswith("-") else None
            console.print(Text(line, style=color or ""), soft_wrap=True)
        if d.text_diff_omitted:
            console.print(f"... {d.text_diff_omitted} more lines (use --max-lines)")


def _signed(v: int) -> Text:
    return Text(f"{v:+d}", style="red" if v > 0 else "green")
