"""Markdown for PR comments and ``$GITHUB_STEP_SUMMARY``."""

from __future__ import annotations

from collections.abc import Sequence

from hlo_audit.hlo.analysis import Analysis
from hlo_audit.hlo.diff import ModuleDiff


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def format_count(analyses: Sequence[Analysis], top: int = 20) -> str:
    out: list[str] = []
    for a in analyses:
        s = a.summary
        out.append(f"### `{a.module.name}` — {s.entry_params} entry parameters")
        out.append(f"\nSource: `{a.source}`\n")
        out += _table(["dtype", "params"], list(s.by_dtype.items()))
        out.append("")
        out += _table(["role", "params", "bytes"], [(r, n, s.bytes_by_role.get(r, 0)) for r, n in s.by_role.items()])
        out.append("")
        groups = list(s.groups.items())
        shown = groups if top <= 0 else groups[:top]
        out += _table(["pattern", "params"], [(f"`{p}`", n) for p, n in shown])
        if len(shown) < len(groups):
            out.append(f"\n{len(groups) - len(shown)} more groups not shown.")
        out.append("")
    return "\n".join(out) + "\n"


def format_diff(d: ModuleDiff, old: str, new: str) -> str:
    out = [f"### HLO diff: **{d.verdict}**" + (f" ({', '.join(d.changes)})" if d.changes else ""), ""]
    out.append(f"`{old}` → `{new}`: entry parameters {d.entry_params[0]} → {d.entry_params[1]}")
    out.append("")
    if d.by_dtype_delta or d.by_role_delta:
        rows = [("dtype", k, f"{v:+d}") for k, v in d.by_dtype_delta.items()]
        rows += [("role", k, f"{v:+d}") for k, v in d.by_role_delta.items()]
        out += _table(["by", "key", "delta"], rows)
        out.append("")
    groups = d.params_added + d.params_removed
    if groups:
        out += _table(["delta", "role", "dtype", "pattern"],
                      [(f"{g.count:+d}", g.role, g.dtype, f"`{g.pattern}`") for g in groups])
        out.append("")
    if d.text_diff:
        out += ["<details><summary>normalized text diff</summary>", "", "```diff", *d.text_diff, "```"]
        if d.text_diff_omitted:
            out.append(f"{d.text_diff_omitted} more lines omitted.")
        out += ["", "</details>"]
    return "\n".join(out) + "\n"
