"""Small plots as inline SVG, drawn on the server: no JavaScript, no third-party code."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT, PAD = 640, 180, 36
COLOURS = ("#1f6feb", "#d9480f")


def _fmt(x: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.3g}"


def lines(xs: Sequence[int], series: Sequence[tuple[str, Sequence[float]]], *, title: str) -> str:
    """A plot of up to two series over ``xs`` (versions), each scaled to its own range (the first on the left
    axis, the second on the right), with its name and its last value in the legend."""
    if not xs:
        return ""
    x0, x1 = min(xs), max(xs)
    span = (x1 - x0) or 1
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD

    def px(x: float) -> float:
        return PAD + (x - x0) / span * inner_w

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
             f'<title>{escape(title)}</title>',
             f'<rect x="{PAD}" y="{PAD}" width="{inner_w}" height="{inner_h}" fill="none" stroke="#ccc"/>',
             f'<text x="{PAD}" y="{HEIGHT - 8}" font-size="11">v{x0}</text>',
             f'<text x="{WIDTH - PAD}" y="{HEIGHT - 8}" font-size="11" text-anchor="end">v{x1}</text>']
    for i, (name, ys) in enumerate(series[:2]):
        colour = COLOURS[i]
        lo, hi = min(ys), max(ys)
        rng = (hi - lo) or 1

        def py(y: float, lo=lo, rng=rng) -> float:
            return PAD + inner_h - (y - lo) / rng * inner_h

        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        for x, y in zip(xs, ys, strict=True):
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}">'
                         f'<title>v{x}: {escape(name)} {y:,.0f}</title></circle>')
        side, anchor = (PAD, "start") if i == 0 else (WIDTH - PAD, "end")
        parts.append(f'<text x="{side}" y="{PAD - 8}" font-size="12" fill="{colour}" text-anchor="{anchor}">'
                     f'{escape(name)} ({_fmt(lo)} to {_fmt(hi)})</text>')
    parts.append("</svg>")
    return "".join(parts)


def histogram(values: Sequence[float], *, bins: int = 10, title: str) -> str:
    """Bars of how many ``values`` (fractions from 0 to 1) fall in each of ``bins`` equal ranges."""
    if not values:
        return ""
    counts = [0] * bins
    for v in values:
        counts[min(int(v * bins), bins - 1)] += 1
    top = max(counts)
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    bar = inner_w / bins
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
             f'<title>{escape(title)}</title>',
             f'<text x="{PAD}" y="{PAD - 8}" font-size="12">{escape(title)}</text>']
    for i, n in enumerate(counts):
        h = n / top * inner_h
        x = PAD + i * bar
        parts.append(f'<rect x="{x + 1:.1f}" y="{PAD + inner_h - h:.1f}" width="{bar - 2:.1f}" height="{h:.1f}" '
                     f'fill="{COLOURS[0]}"><title>{i / bins:.1f} to {(i + 1) / bins:.1f}: {n}</title></rect>')
        parts.append(f'<text x="{x + bar / 2:.1f}" y="{HEIGHT - 8}" font-size="10" text-anchor="middle">'
                     f'{i / bins:.1f}</text>')
    parts.append("</svg>")
    return "".join(parts)
