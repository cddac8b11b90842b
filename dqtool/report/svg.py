"""The two charts a report draws, as inline SVG: bars (a histogram) and points along an axis
(a value per layer). Plain text in, escaped; sizes fixed so every report looks alike."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 640, 220
LEFT, BOTTOM, TOP, RIGHT = 56, 40, 16, 12


def _frame(kind: str, title: str, body: list[str], x_label: str, y_label: str) -> str:
    return (f'<svg class="chart" data-chart="{kind}" xmlns="http://www.w3.org/2000/svg" '
            f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
            f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>'
            f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" '
            f'y2="{HEIGHT - BOTTOM}" stroke="#333"/>'
            f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" stroke="#333"/>'
            + "".join(body)
            + f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 6}" font-size="11" '
            f'text-anchor="middle">{escape(x_label)}</text>'
            f'<text x="12" y="{(TOP + HEIGHT - BOTTOM) / 2}" font-size="11" '
            f'text-anchor="middle" transform="rotate(-90 12 {(TOP + HEIGHT - BOTTOM) / 2})">'
            f'{escape(y_label)}</text></svg>')


def bars(title: str, labels: Sequence[str], counts: Sequence[int], x_label: str,
         colors: Sequence[str] | None = None) -> str:
    """A histogram: one bar per label, its height log-scaled (counts span many decades),
    the count written above it."""
    n = max(1, len(counts))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = math.log10(1 + max(counts, default=0)) or 1.0
    slot = plot_w / n
    body = []
    for i, (label, count) in enumerate(zip(labels, counts, strict=True)):
        h = plot_h * math.log10(1 + count) / top
        x = LEFT + i * slot + slot * 0.1
        fill = colors[i] if colors else "#3b6ea8"
        body.append(f'<rect class="bar" x="{x:.1f}" y="{HEIGHT - BOTTOM - h:.1f}" '
                    f'width="{slot * 0.8:.1f}" height="{h:.1f}" fill="{fill}">'
                    f'<title>{escape(label)}: {count}</title></rect>')
        if count:
            body.append(f'<text x="{x + slot * 0.4:.1f}" y="{HEIGHT - BOTTOM - h - 3:.1f}" '
                        f'font-size="9" text-anchor="middle">{count}</text>')
        body.append(f'<text x="{x + slot * 0.4:.1f}" y="{HEIGHT - BOTTOM + 12}" '
                    f'font-size="8" text-anchor="middle">{escape(label)}</text>')
    return _frame("histogram", title, body, x_label, "elements (log scale)")


def points(title: str, xs: Sequence[float], ys: Sequence[float], x_label: str,
           y_label: str, x_max: float) -> str:
    """Values along an axis (a layer's position), y log-scaled; a zero is drawn on the
    axis, in green, and infinities at the top, in red."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    finite = [y for y in ys if y > 0 and math.isfinite(y)]
    lo = math.floor(math.log10(min(finite))) if finite else -8
    hi = math.ceil(math.log10(max(finite))) if finite else 0
    hi = max(hi, lo + 1)
    body = []
    for tick in range(lo, hi + 1):
        y = HEIGHT - BOTTOM - plot_h * (tick - lo) / (hi - lo)
        body.append(f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
                    f'stroke="#ddd"/><text x="{LEFT - 6}" y="{y + 3:.1f}" font-size="9" '
                    f'text-anchor="end">1e{tick}</text>')
    path = []
    for x, yv in zip(xs, ys, strict=True):
        px = LEFT + plot_w * (x / x_max if x_max else 0)
        if yv > 0 and math.isfinite(yv):
            py, color = HEIGHT - BOTTOM - plot_h * (math.log10(yv) - lo) / (hi - lo), "#3b6ea8"
        elif yv == 0:
            py, color = HEIGHT - BOTTOM, "#2e8b57"
        else:
            py, color = TOP, "#c0392b"
        path.append(f"{px:.1f},{py:.1f}")
        body.append(f'<circle class="point" cx="{px:.1f}" cy="{py:.1f}" r="3" '
                    f'fill="{color}"><title>{x:g}: {yv:g}</title></circle>')
    if len(path) > 1:
        body.insert(0, f'<polyline points="{" ".join(path)}" fill="none" stroke="#9ab"/>')
    return _frame("depth", title, body, x_label, y_label)
