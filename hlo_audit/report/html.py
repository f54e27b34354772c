"""`hlo-audit report --html FILE`: one self-contained page (inline SVG and CSS; no script or font from anywhere).

Every string from input goes through ``escape.html`` (``html.escape`` of the text with control characters made
visible), in element content and in quoted attributes alike.

Charts are hand-written SVG: entry parameters per cell stacked by role, and each depth series' line
(intercept + slope x layers) out to the model's full depth. Elements carry stable ids and ``data-*``
attributes (``#chart-roles g.bar[data-cell]``, ``#chart-scaling g.series[data-series]``, ``#matrix
tr[data-cell]``, ``#compiled tr[data-cell]``) so a browser test, or a reader's own script, can find every cell.
"""

from __future__ import annotations

from collections.abc import Mapping

from hlo_audit.lowering import MEMORY_KINDS
from hlo_audit.report.escape import html as escape
from hlo_audit.report.words import human_bytes


ROLE_COLORS = {"rng_key": "#d62728", "rng_count": "#ff7f0e", "weight": "#1f77b4", "optimizer_state": "#9467bd",
               "step": "#8c564b", "batch_stat": "#17becf", "cache": "#bcbd22", "input": "#2ca02c", "other": "#7f7f7f"}
SERIES_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
                 "#bcbd22", "#7f7f7f")

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { padding: 2px 8px; text-align: right; border-bottom: 1px solid #ddd; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; font-family: ui-monospace, monospace; }
.grow { color: #c00; } .shrink { color: #080; } .new { color: #a60; } .muted { color: #888; }
svg text { font: 11px ui-monospace, monospace; fill: #222; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
"""

# Runs in the page only to record what was drawn (the browser test reads these attributes); the page works
# without it.
SCRIPT = """
window.addEventListener("load", function () {
  function drawn(selector) {
    return Array.prototype.filter.call(document.querySelectorAll(selector), function (el) {
      var box = el.getBBox(); return box.width > 0 && box.height > 0; }).length;
  }
  document.body.setAttribute("data-drawn-bars", drawn("#chart-roles g.bar"));
  document.body.setAttribute("data-drawn-series", drawn("#chart-scaling g.series"));
});
"""


def _signed_class(delta: int | None) -> tuple[str, str]:
    if delta is None:
        return "new", "new"
    return (f"{delta:+d}" if delta else "0"), ("grow" if delta > 0 else "shrink" if delta < 0 else "")


def roles_chart(view) -> str:
    ok, roles = [v.result for v in view.lowered], view.roles
    label_width, bar_width, row = 300, 520, 18
    height = row * len(ok) + 30
    most = max((x.entry_params for x in ok), default=1) or 1
    out = [f'<svg id="chart-roles" xmlns="http://www.w3.org/2000/svg" width="{label_width + bar_width + 60}" '
           f'height="{height}" role="img" aria-label="entry parameters per cell, stacked by role">']
    for i, r in enumerate(ok):
        y = 10 + i * row
        out.append(f'<g class="bar" data-cell="{escape(r.cell.id)}" data-params="{r.entry_params}">')
        out.append(f'<text x="{label_width - 6}" y="{y + 12}" text-anchor="end">{escape(r.cell.id)}</text>')
        x = float(label_width)
        for role in roles:
            n = r.summary.by_role.get(role, 0)
            if n:
                w = bar_width * n / most
                out.append(f'<rect data-role="{role}" x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 4}" '
                           f'fill="{ROLE_COLORS[role]}"><title>{escape(r.cell.id)}: {role} {n}</title></rect>')
                x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + 12}">{r.entry_params}</text></g>')
    out.append("</svg>")
    legend = "".join(f'<span><i style="background:{ROLE_COLORS[r]}"></i>{r}</span>' for r in roles)
    return "\n".join(out) + f'\n<div class="legend">{legend}</div>'


def scaling_chart(view) -> str:
    series = view.series
    if not series:
        return '<p class="muted">No depth series (a series needs two or more depths of one cell).</p>'
    width, height, left, bottom, top = 820, 360, 60, 30, 10
    depth_max = max(max(s.depths) if s.full_depth is None else max(s.full_depth, *s.depths) for s in series)
    value_max = max(max(s.total.at(d) for d in (*s.depths, s.full_depth or 0)) for s in series) or 1

    def xy(layers: float, value: float) -> tuple[float, float]:
        return (left + (width - left - 20) * layers / depth_max,
                height - bottom - (height - bottom - top) * value / value_max)

    out = [f'<svg id="chart-scaling" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'role="img" aria-label="entry parameters against depth, per series">']
    x0, y0 = xy(0, 0)
    x1, y1 = xy(depth_max, value_max)
    out.append(f'<path d="M{x0},{y1} V{y0} H{x1}" stroke="#888" fill="none"/>')
    out.append(f'<text x="{x1}" y="{y0 + 20}" text-anchor="end">layers (0 to {depth_max})</text>')
    out.append(f'<text x="{x0 - 4}" y="{y1 + 10}" text-anchor="end">{round(value_max)}</text>')
    for i, s in enumerate(series):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        end = s.full_depth or max(s.depths)
        (ax, ay), (bx, by) = xy(min(s.depths), s.total.at(min(s.depths))), xy(end, s.total.at(end))
        out.append(f'<g class="series" data-series="{escape(s.id)}" data-slope="{s.total.slope}" '
                   f'data-intercept="{s.total.intercept}"><title>{escape(s.id)}: {s.total.intercept} + '
                   f'{s.total.slope} x layers</title>')
        out.append(f'<line x1="{ax:.1f}" y1="{ay:.1f}" x2="{bx:.1f}" y2="{by:.1f}" stroke="{color}" '
                   f'stroke-width="2"/>')
        for d in s.depths:
            cx, cy = xy(d, s.total.at(d))
            out.append(f'<circle data-layers="{d}" cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{color}"/>')
        out.append("</g>")
    out.append("</svg>")
    legend = "".join(f'<span><i style="background:{SERIES_COLORS[i % len(SERIES_COLORS)]}"></i>{escape(s.id)}'
                     f'</span>' for i, s in enumerate(series))
    return "\n".join(out) + f'\n<div class="legend">{legend}</div>'


def _table(table_id: str, header: list[str], rows: list[tuple[Mapping[str, str | int], list[str]]]) -> str:
    """``rows``: (attributes of the <tr>, cells already escaped)."""
    out = [f'<table id="{table_id}"><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in header)
           + "</tr></thead><tbody>"]
    for attrs, cells in rows:
        attr = "".join(f' {k}="{escape(str(v))}"' for k, v in attrs.items())
        out.append(f"<tr{attr}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _count(value: int, delta: int | None) -> str:
    if not delta:
        return str(value)
    return f'{value} <span class="{"grow" if delta > 0 else "shrink"}">{delta:+d}</span>'


def matrix_table(view) -> str:
    dtypes, roles = view.dtypes, view.roles
    rows = []
    for v in view.cells:
        r = v.result
        if not r.summary:
            rows.append(({"data-cell": r.cell.id, "data-status": r.status},
                         [escape(r.cell.id), f'<span class="muted">{escape(r.status)}: {escape(r.message)}</span>']
                         + [""] * (2 + len(dtypes) + len(roles))))
            continue
        text, css = _signed_class(v.total_delta)
        by_dtype, by_role = v.delta("by_dtype") or {}, v.delta("by_role") or {}
        rows.append(({"data-cell": r.cell.id, "data-status": r.status},
                     [escape(r.cell.id), str(r.entry_params), f'<span class="{css}">{text}</span>']
                     + [_count(r.summary.by_dtype.get(d, 0), by_dtype.get(d)) for d in dtypes]
                     + [_count(r.summary.by_role.get(k, 0), by_role.get(k)) for k in roles]
                     + [str(r.rng.dead_params) if r.rng else ""]))
    return _table("matrix", ["cell", "entry params", "Δ golden", *dtypes, *roles, "never-drawn RNG"], rows)


def scan_table(view) -> str:
    rows = []
    for p in view.scan_pairs:
        cells = [escape(p.label)]
        for r in (p.on, p.off):
            cells += ["", ""] if r is None else [str(r.entry_params), str(r.count("by_dtype", "u32"))]
        rows.append(({"data-pair": p.label}, cells))
    return _table("scan", ["model/quant/depth", "params on", "u32 on", "params off", "u32 off"], rows)


def scaling_table(view) -> str:
    rows = []
    for s in view.series:
        p = s.projection()
        u32 = s.by_dtype.get("u32")
        rows.append(({"data-series": s.id}, [
            escape(s.id), ",".join(map(str, s.depths)), f"{s.total.slope:g}", f"{s.total.intercept:g}",
            f"{u32.slope:g}" if u32 else "0", str(p.layers if p else ""), str(p.entry_params if p else ""),
            str(p.by_dtype.get("u32", "") if p else "")]))
    return _table("scaling", ["series", "depths", "params/layer", "intercept", "u32/layer", "full depth",
                              "projected params", "projected u32"], rows)


def compiled_table(view) -> str:
    """Compiled cells: memory per device by kind (with its change against the golden) and cost."""
    rows = []
    for v in view.with_memory:
        memory, delta, cost = v.result.memory, v.memory_delta() or {}, v.result.cost or {}
        cells = [escape(v.result.cell.id)]
        for key in (kind.key for kind in MEMORY_KINDS):
            if key not in memory:  # stage optimized generates no code
                cells.append("")
                continue
            d = delta.get(key)
            grow = d is not None and d > 0
            sign, css = ("+", "grow") if grow else ("-", "shrink")
            change = f' <span class="{css}">{sign}{human_bytes(abs(d))}</span>' if d else ""
            cells.append(human_bytes(memory[key]) + change)
        cells += [f"{cost['flops'] / 1e9:,.1f}" if "flops" in cost else "",
                  human_bytes(int(cost["bytes_accessed"])) if "bytes_accessed" in cost else ""]
        attrs = {"data-cell": v.result.cell.id, **{f"data-{k.replace('_', '-')}": n for k, n in memory.items()}}
        rows.append((attrs, cells))
    return _table("compiled", ["cell", *(kind.label for kind in MEMORY_KINDS), "GFLOP", "bytes accessed"], rows)


def format_html(view) -> str:
    ok = sum(1 for v in view.cells if v.result.status == "ok")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', "<title>hlo-audit report</title>",
        f"<style>{STYLE}</style>", f"<script>{SCRIPT}</script>", "</head><body>",
        "<h1>hlo-audit report</h1>",
        f'<p id="summary">{len(view.cells)} cells, {ok} lowered; '
        f"{len(view.series)} depth series.</p>",
        "<h2>Entry parameters per cell, by role</h2>", roles_chart(view),
        "<h2>Depth scaling (line: intercept + slope x layers, to full depth; dots: measured)</h2>",
        scaling_chart(view),
        "<h2>Cells against their goldens</h2>", matrix_table(view),
        "<h2>Scan on / scan off</h2>", scan_table(view),
        "<h2>Depth scaling</h2>", scaling_table(view),
        *(["<h2>Compiled: memory per device and cost</h2>", compiled_table(view)] if view.with_memory else []),
        "</body></html>", ""])
