"""Training-metric charts as inline SVG (no plotting library): what the job monitor draws."""

import html
import math
from collections.abc import Mapping, Sequence

#: One line of a chart: ``[(step, value)]``.
Points = list[tuple[float, float]]

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
_W, _H, _PAD = 480, 180, 40


def default_metric(names: Sequence[str]) -> str:
    """The metric a chart opens on: a training loss when there is one."""
    for want in ("train/loss", "train/loss_step", "loss"):
        if want in names:
            return want
    losses = [n for n in names if "loss" in n]
    return (losses or list(names))[0]


def svg_chart(series: Mapping[str, Sequence[tuple[float, float]]], *, title: str = "") -> str:
    """Lines over steps as an inline SVG (no plotting library): one polyline per
    series, the value range on the left, the step range below, a legend."""
    points = [(x, y) for pts in series.values() for x, y in pts if math.isfinite(y)]
    if not points:
        return f"<i>{html.escape(title)}: no points yet</i>"
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def at(x: float, y: float) -> str:
        px = _PAD + (x - x0) / (x1 - x0) * (_W - 2 * _PAD)
        py = _H - _PAD / 2 - (y - y0) / (y1 - y0) * (_H - _PAD)
        return f"{px:.1f},{py:.1f}"

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}"'
        f' height="{_H + 20 + 14 * ((len(series) - 1) // 3)}"'
        f' class="gpulayer-chart" role="img"><title>{html.escape(title)}</title>',
        f'<rect x="{_PAD}" y="{_PAD / 2}" width="{_W - 2 * _PAD}" height="{_H - _PAD}"'
        ' fill="none" stroke="#ccc"/>',
        f'<text x="2" y="{_PAD / 2 + 10}" font-size="10">{y1:.4g}</text>',
        f'<text x="2" y="{_H - _PAD / 2}" font-size="10">{y0:.4g}</text>',
        f'<text x="{_PAD}" y="{_H + 2}" font-size="10">step {x0:.0f}</text>',
        f'<text x="{_W - _PAD}" y="{_H + 2}" font-size="10" text-anchor="end">{x1:.0f}</text>',
    ]
    for i, (label, pts) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        coords = " ".join(at(x, y) for x, y in pts if math.isfinite(y))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"'
                     f' data-label="{html.escape(label)}" points="{coords}"/>')  # fmt: skip
        last = pts[-1][1] if pts else float("nan")
        x, y = _PAD + 4 + 150 * (i % 3), _H + 16 + 14 * (i // 3)
        parts.append(f'<text x="{x}" y="{y}" font-size="11" fill="{color}">'
                     f"{html.escape(label)}: {last:.4g}</text>")  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)
