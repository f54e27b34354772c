"""`hlo-audit report --html FILE`: one self-contained page (inline SVG and CSS; no script or font from anywhere).

Every string from input goes through ``escape.html`` (``html.escape`` of the text with control characters made
visible), in element content and in quoted attributes alike.

Charts are hand-written SVG: entry parameters per cell stacked by role (the label column as wide as the longest
id), and each depth series' line (intercept + slope x layers) out to the model's full depth, one panel per model,
each line named at its end. Elements carry stable ids and ``data-*`` attributes (``#chart-roles g.bar[data-cell]``,
``#chart-scaling svg.panel[data-model] g.series[data-series]``, ``#matrix tr[data-cell]``, ``#compiled
tr[data-cell]``) so a browser test, or a reader's own script, can find every cell.
"""

from __future__ import annotations

from collections.abc import Mapping

from hlo_audit.lowering import MEMORY_KINDS
from hlo_audit.report.escape import html as escape
from hlo_audit.report.words import human_bytes
from hlo_audit.results import LoweredCell
from hlo_audit.rules.wording import plural
from hlo_audit.scaling import rng_slope

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
svg text { font: 11px ui-monospace, monospace; fill: #222; } svg text.panel-title { font-weight: bold; }
#chart-scaling { display: flex; flex-wrap: wrap; gap: 16px; }
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
  // Text outside its SVG's box is cut off on screen; two end-of-line labels that overlap cannot be read.
  function box(el) { return el.getBoundingClientRect(); }
  var texts = document.querySelectorAll("svg text"), clipped = 0, overlapping = 0;
  Array.prototype.forEach.call(texts, function (t) {
    var b = box(t), s = box(t.ownerSVGElement);
    if (b.left < s.left - 0.5 || b.right > s.right + 0.5 || b.top < s.top - 0.5 || b.bottom > s.bottom + 0.5) {
      clipped += 1; t.setAttribute("data-clipped", "true"); }
  });
  Array.prototype.forEach.call(document.querySelectorAll("#chart-scaling svg.panel"), function (panel) {
    var labels = Array.prototype.map.call(panel.querySelectorAll("text.series-label"), box);
    for (var i = 0; i < labels.length; i++) for (var j = i + 1; j < labels.length; j++) {
      var a = labels[i], b = labels[j];
      if (a.left < b.right && b.left < a.right && a.top < b.bottom - 1 && b.top < a.bottom - 1) overlapping += 1;
    }
  });
  document.body.setAttribute("data-texts", texts.length);
  document.body.setAttribute("data-clipped-texts", clipped);
  document.body.setAttribute("data-overlapping-labels", overlapping);
});
"""


def _signed_class(delta: int | None) -> tuple[str, str]:
    if delta is None:
        return "new", "new"
    return (f"{delta:+d}" if delta else "0"), ("grow" if delta > 0 else "shrink" if delta < 0 else "")


def roles_chart(view) -> str:
    ok, roles = [v.result for v in view.lowered], view.roles
    # The label column fits the longest id whole (it was cut at the left edge: ``ama3-8b/scan-off/...``).
    label_width, bar_width, row = max((text_width(r.cell.id) for r in ok), default=0) + 8, 520, 18
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


# Monospace SVG text at 11px advances ~6.6px a character in the fonts browsers pick for ui-monospace (DejaVu Sans
# Mono, Menlo, Consolas); 7 leaves room, so a label's width is known without a browser and no label is cut.
CHAR_WIDTH = 7.0
LABEL_GAP = 13  # px between the baselines of two end-of-line labels: 11px text never overlaps


def text_width(text: str) -> float:
    return CHAR_WIDTH * len(text) + 8


def scaling_chart(view) -> str:
    """Small multiples: one panel per model, its series' lines (intercept + slope x layers, to full depth), each
    named at its end. A series whose RNG state grows per layer (the leak the gate hunts) is drawn in colour and
    thick, its label saying by how much; the others are thin grey: 24 series stay 24 readable names."""
    if not view.series:
        return '<p class="muted">No depth series (a series needs two or more depths of one cell).</p>'
    models: dict[str, list] = {}
    for s in view.series:
        models.setdefault(s.cell.model, []).append(s)
    return '<div id="chart-scaling">\n' + "\n".join(_panel(model, series) for model, series in models.items()) + \
        "\n</div>"


def _panel(model: str, series: list) -> str:
    labels = [_series_label(s) for s in series]
    plot, left, top, bottom = 340, 56, 24, 30
    width = left + plot + 14 + max(text_width(label) for label in labels)
    height = max(240, top + bottom + LABEL_GAP * len(series))
    depth_max = max(max(s.depths) if s.full_depth is None else max(s.full_depth, *s.depths) for s in series)
    value_max = max(max(s.total.at(d) for d in (*s.depths, s.full_depth or 0)) for s in series) or 1

    def xy(layers: float, value: float) -> tuple[float, float]:
        return left + plot * layers / depth_max, height - bottom - (height - bottom - top) * value / value_max

    x0, y0 = xy(0, 0)
    x1, y1 = xy(depth_max, value_max)
    out = [f'<svg class="panel" data-model="{escape(model)}" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
           f'height="{height}" role="img" aria-label="{escape(model)}: entry parameters against depth, per series">',
           f'<text x="{x0}" y="14" class="panel-title">{escape(model)}</text>',
           f'<path d="M{x0},{y1} V{y0} H{x1}" stroke="#888" fill="none"/>',
           f'<text x="{x1}" y="{y0 + 20}" text-anchor="end">layers (0 to {depth_max})</text>',
           f'<text x="{x0 - 4}" y="{y1 + 10}" text-anchor="end">{round(value_max)}</text>']
    ends = [xy(s.full_depth or max(s.depths), s.total.at(s.full_depth or max(s.depths))) for s in series]
    placed = spread([y for _, y in ends], LABEL_GAP, top + 4, height - bottom)
    leaking = [s for s in series if rng_slope(s) > 0]
    for s, label, (bx, by), ly in zip(series, labels, ends, placed):
        color = SERIES_COLORS[leaking.index(s) % len(SERIES_COLORS)] if s in leaking else "#9a9a9a"
        stroke = 3 if s in leaking else 1.5
        ax, ay = xy(min(s.depths), s.total.at(min(s.depths)))
        out.append(f'<g class="series{" leak" if s in leaking else ""}" data-series="{escape(s.id)}" '
                   f'data-slope="{s.total.slope}" data-intercept="{s.total.intercept}"><title>{escape(s.id)}: '
                   f'{s.total.intercept} + {s.total.slope} x layers</title>')
        out.append(f'<line x1="{ax:.1f}" y1="{ay:.1f}" x2="{bx:.1f}" y2="{by:.1f}" stroke="{color}" '
                   f'stroke-width="{stroke}"/>')
        out += [f'<circle data-layers="{d}" cx="{xy(d, s.total.at(d))[0]:.1f}" cy="{xy(d, s.total.at(d))[1]:.1f}" '
                f'r="3" fill="{color}"/>' for d in s.depths]
        out.append(f'<path d="M{bx + 2:.1f},{by:.1f} L{bx + 10:.1f},{ly - 4:.1f}" stroke="{color}" fill="none" '
                   f'stroke-width="0.8"/>')
        out.append(f'<text class="series-label" x="{bx + 12:.1f}" y="{ly:.1f}" style="fill:'
                   f'{color if s in leaking else "#555"}">{escape(label)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _series_label(series) -> str:
    """The series' id less its model (the panel's title) and the depth placeholder; a leak says how fast it grows."""
    label = series.id.split("/", 1)[-1].replace("/L*", "")
    slope = rng_slope(series)
    return f"{label}  RNG +{slope:g}/layer" if slope > 0 else label


def spread(wanted: list[float], gap: float, low: float, high: float) -> list[float]:
    """Baselines as near ``wanted`` as labels ``gap`` apart allow, within [low, high] (when they fit): pushed down
    past each other in order, then back up from ``high``."""
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    placed = [0.0] * len(wanted)
    last = low - gap
    for i in order:
        last = placed[i] = max(wanted[i], last + gap)
    limit = high
    for i in reversed(order):
        limit = placed[i] = max(min(placed[i], limit), low)
        limit -= gap
    return placed


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
        if not isinstance(r, LoweredCell):
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
    ok = sum(1 for v in view.cells if isinstance(v.result, LoweredCell))
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', "<title>hlo-audit report</title>",
        f"<style>{STYLE}</style>", f"<script>{SCRIPT}</script>", "</head><body>",
        "<h1>hlo-audit report</h1>",
        f'<p id="summary">{len(view.cells)} {plural(len(view.cells), "cell")}, {ok} lowered; '
        f"{len(view.series)} depth series.</p>",
        "<h2>Entry parameters per cell, by role</h2>", roles_chart(view),
        "<h2>Depth scaling (line: intercept + slope x layers, to full depth; dots: measured)</h2>",
        scaling_chart(view),
        "<h2>Cells against their goldens</h2>", matrix_table(view),
        "<h2>Scan on / scan off</h2>", scan_table(view),
        "<h2>Depth scaling</h2>", scaling_table(view),
        *(["<h2>Compiled: memory per device and cost</h2>", compiled_table(view)] if view.with_memory else []),
        "</body></html>", ""])
