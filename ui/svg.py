"""Small inline SVG charts for the Carbon pages: drawn as text in microseconds (no plotting library in the API
server, no file, no JavaScript), in the palette of the report charts. Every label is escaped."""

from __future__ import annotations

from html import escape

import pandas as pd

from common.timeutil import utc
from scheduling.output.charts import color

HOUR = pd.Timedelta(hours=1)


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(title)}" font-family="sans-serif" font-size="11">'
        f"<title>{escape(title)}</title>{''.join(body)}</svg>"
    )


def _num(value) -> float:
    return 0.0 if value is None or pd.isna(value) else float(value)


def grouped_bars(categories: list[str], series: list[tuple[str, list]], unit: str, title: str) -> str:
    """Vertical bars, one group per category, one bar per series (label, values), a legend and a y scale."""
    width, height, left, bottom, top = max(320, 60 + 70 * len(categories)), 240, 56, 40, 24
    peak = max([_num(v) for _, values in series for v in values] + [1e-9])
    plot_h, group_w = height - bottom - top, (width - left - 10) / max(len(categories), 1)
    bar_w = group_w * 0.8 / max(len(series), 1)
    body = [f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>']
    for k in range(5):  # y grid and scale
        y = top + plot_h * (1 - k / 4)
        body.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        body.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{peak * k / 4:.3g}</text>')
    body.append(
        f'<text x="12" y="{top + plot_h / 2:.0f}" transform="rotate(-90 12 {top + plot_h / 2:.0f})" '
        f'text-anchor="middle">{escape(unit)}</text>'
    )
    for i, category in enumerate(categories):
        x0 = left + i * group_w + group_w * 0.1
        for j, (label, values) in enumerate(series):
            h = plot_h * _num(values[i]) / peak
            body.append(
                f'<rect x="{x0 + j * bar_w:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w * 0.95:.1f}" '
                f'height="{h:.1f}" fill="{color(j)}"><title>{escape(label)} {escape(category)}: '
                f"{_num(values[i]):.3f} {escape(unit)}</title></rect>"
            )
        body.append(
            f'<text x="{x0 + group_w * 0.4:.1f}" y="{height - bottom + 14}" text-anchor="middle">'
            f"{escape(category)}</text>"
        )
    for j, (label, _) in enumerate(series):
        x = left + j * 130
        body.append(f'<rect x="{x}" y="{height - 16}" width="10" height="10" fill="{color(j)}"/>')
        body.append(f'<text x="{x + 14}" y="{height - 7}">{escape(label)}</text>')
    return _svg(width, height, body, title)


def hbars(labels: list[str], values: list, unit: str, title: str, highlight: int | None = None) -> str:
    """Horizontal bars with their values; `highlight` (an index) is drawn in the first palette colour."""
    width, row, left = 600, 22, 220
    height = 30 + row * len(labels)
    peak = max([_num(v) for v in values] + [1e-9])
    body = [f'<text x="4" y="14" font-weight="bold">{escape(title)}</text>']
    for i, (label, value) in enumerate(zip(labels, values)):
        y, w = 24 + i * row, (width - left - 90) * _num(value) / peak
        fill = color(0) if i == highlight else color(7)
        body.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{escape(label)}</text>')
        body.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{row - 6}" fill="{fill}"/>')
        shown = "n/a" if value is None or pd.isna(value) else f"{float(value):.3f} {unit}"
        body.append(f'<text x="{left + w + 4:.1f}" y="{y + 13}">{escape(shown)}</text>')
    return _svg(width, height, body, title)


def lanes(bars: list[dict]) -> list[int]:
    """A lane per bar (same order) so that bars of one row never overlap: the first lane free at the bar's start."""
    ends: dict[int, list] = {}
    out = []
    for bar in bars:
        row_ends = ends.setdefault(bar["row"], [])
        start = utc(bar["start"])
        lane = next((i for i, end in enumerate(row_ends) if end <= start), len(row_ends))
        if lane == len(row_ends):
            row_ends.append(None)
        row_ends[lane] = utc(bar["end"])
        out.append(lane)
    return out


def timeline(start, end, rows: list[dict], bars: list[dict], bands: dict[str, list[dict]], title: str) -> str:
    """Clusters x hours: per row (cluster, zone) the zone's forecast intensity behind (p10-p90 band and p50 line,
    scaled within the row), jobs as bars in lanes (row index, start, end, label, href; late ones in another colour)."""
    start, end = utc(start), utc(end)
    hours = (end - start) / HOUR
    width, left, top, lane_h, right = 1000, 150, 30, 9, 30
    bars = sorted(bars, key=lambda b: (b["row"], utc(b["start"])))
    lane_of = lanes(bars)
    n_lanes = [1 + max([lane for b, lane in zip(bars, lane_of) if b["row"] == i], default=0) for i in range(len(rows))]
    heights = [max(34, 8 + lane_h * n) for n in n_lanes]
    offsets = [top + sum(heights[:i]) for i in range(len(rows))]
    height = top + sum(heights) + 24

    def x(t) -> float:
        return left + (width - left - right) * min(max((utc(t) - start) / HOUR, 0.0), hours) / hours

    body = [f'<text x="4" y="14" font-weight="bold">{escape(title)}</text>']
    for h in range(0, int(hours) + 1, 6):
        t = start + h * HOUR
        body.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{height - 20}" stroke="#eee"/>')
        body.append(f'<text x="{x(t):.1f}" y="{height - 6}" text-anchor="middle">{t:%d %H:%M}</text>')
    for i, row in enumerate(rows):
        y0, row_h = offsets[i], heights[i]
        body.append(f'<text x="{left - 6}" y="{y0 + row_h / 2 + 4}" text-anchor="end">{escape(row["label"])}</text>')
        body.append(f'<rect x="{left}" y="{y0}" width="{width - left - right}" height="{row_h - 2}" fill="#fafafa"/>')
        band = bands.get(row.get("zone") or "", [])
        values = [_num(p.get(k)) for p in band for k in ("p10", "p50", "p90") if p.get(k) is not None]
        if values:
            lo, hi = min(values), max(values)
            span = hi - lo or 1.0

            def y(v, y0=y0, row_h=row_h, lo=lo, span=span) -> float:
                return y0 + row_h - 3 - (row_h - 6) * (_num(v) - lo) / span

            if all(p.get("p10") is not None and p.get("p90") is not None for p in band):
                upper = " ".join(f"{x(p['time']):.1f},{y(p['p90']):.1f}" for p in band)
                lower = " ".join(f"{x(p['time']):.1f},{y(p['p10']):.1f}" for p in reversed(band))
                body.append(f'<polygon points="{upper} {lower}" fill="{color(5)}" fill-opacity="0.25"/>')
            line = " ".join(f"{x(p['time']):.1f},{y(p['p50']):.1f}" for p in band if p.get("p50") is not None)
            body.append(f'<polyline points="{line}" fill="none" stroke="{color(5)}" stroke-width="1.5"/>')
    for bar, lane in zip(bars, lane_of):
        x0, x1 = x(bar["start"]), x(bar["end"])
        rect = (
            f'<rect x="{x0:.1f}" y="{offsets[bar["row"]] + 4 + lane * lane_h}" width="{max(x1 - x0, 2):.1f}" '
            f'height="{lane_h - 2}" fill="{color(3) if bar.get("late") else color(2)}" fill-opacity="0.85">'
            f"<title>{escape(bar['label'])}</title></rect>"
        )
        body.append(f'<a href="{escape(bar["href"])}">{rect}</a>' if bar.get("href") else rect)
    return _svg(width, height, body, title)


def lines(times: list, series: list[tuple[str, list]], unit: str, title: str) -> str:
    """Lines over time (hourly points), one per series (label, values, same length as `times`), a legend, y scale
    and the first and last time on the x axis."""
    width, height, left, bottom, top = 720, 220, 56, 40, 24
    n = max(len(times), 1)
    peak = max([_num(v) for _, values in series for v in values] + [1e-9])
    plot_w, plot_h = width - left - 10, height - bottom - top
    body = [f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>']
    for k in range(5):
        y = top + plot_h * (1 - k / 4)
        body.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        body.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{peak * k / 4:.3g}</text>')
    body.append(
        f'<text x="12" y="{top + plot_h / 2:.0f}" transform="rotate(-90 12 {top + plot_h / 2:.0f})" '
        f'text-anchor="middle">{escape(unit)}</text>'
    )
    for j, (label, values) in enumerate(series):
        points = " ".join(
            f"{left + plot_w * i / max(n - 1, 1):.1f},{top + plot_h * (1 - _num(v) / peak):.1f}"
            for i, v in enumerate(values)
        )
        body.append(f'<polyline points="{points}" fill="none" stroke="{color(j)}" stroke-width="1.5"/>')
        x = left + j * 150
        body.append(f'<rect x="{x}" y="{height - 16}" width="10" height="10" fill="{color(j)}"/>')
        body.append(f'<text x="{x + 14}" y="{height - 7}">{escape(label)}</text>')
    if times:
        first, last = utc(times[0]), utc(times[-1])
        body.append(f'<text x="{left}" y="{height - bottom + 14}">{first:%Y-%m-%d %H:%M}</text>')
        body.append(f'<text x="{width - 10}" y="{height - bottom + 14}" text-anchor="end">{last:%Y-%m-%d %H:%M}</text>')
    return _svg(width, height, body, title)
