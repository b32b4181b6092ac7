"""The campaign page's charts as inline SVG drawn on the server: readable without JavaScript,
nothing to vendor. Input: campaign_activity rows (one per minute, oldest first)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timezone
from html import escape
from typing import Any

from markupsafe import Markup

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 640, 170, 44, 22, 10

# Stacked from the bottom: what was delivered first, then the failures.
SEND_SERIES = (("sent", "sent", "#2f855a"), ("bounced", "bounced", "#dd6b20"), ("failed", "failed", "#c53030"),
               ("other", "retried, paused or in doubt", "#a0aec0"))


def sends_per_minute(minutes: Sequence[dict[str, Any]]) -> Markup:
    """Stacked bars: sends begun each minute, by how they ended."""
    if not minutes:
        return Markup("")
    top = max(1, max(sum(m[key] for key, _, _ in SEND_SERIES) for m in minutes))
    plot_w, plot_h = WIDTH - LEFT - 6, HEIGHT - BOTTOM - TOP
    step = plot_w / len(minutes)
    parts = _frame("Sends per minute", top, f"{top}", minutes)
    for i, m in enumerate(minutes):
        y = TOP + plot_h
        for key, label, colour in SEND_SERIES:
            if not m[key]:
                continue
            h = plot_h * m[key] / top
            y -= h
            parts.append(f'<rect x="{LEFT + i * step + 1:.1f}" y="{y:.1f}" width="{max(step - 2, 1):.1f}" '
                         f'height="{h:.1f}" fill="{colour}"><title>{_minute(m)}: {m[key]} {label}</title></rect>')
    parts.append("</svg>")
    return Markup("".join(parts))


def rates_per_minute(minutes: Sequence[dict[str, Any]], complaint_limit: float) -> Markup:
    """Lines: bounces over the messages that reached a server, complaints over those sent, each
    minute (both as `campaign status` counts them), with the complaint rate bulk senders must stay under."""
    if not minutes:
        return Markup("")
    bounce = [_share(m["bounced"] + m["later_bounces"], m["sent"] + m["bounced"]) for m in minutes]
    complaint = [_share(m["complaints"], m["sent"]) for m in minutes]
    top = max([0.01, complaint_limit * 2] + [v for v in bounce + complaint if v is not None])
    plot_w, plot_h = WIDTH - LEFT - 6, HEIGHT - BOTTOM - TOP
    step = plot_w / len(minutes)
    parts = _frame("Bounce and complaint rates per minute", top, f"{top * 100:.1f}%", minutes)
    limit_y = TOP + plot_h * (1 - complaint_limit / top)
    parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{limit_y:.1f}" y2="{limit_y:.1f}" stroke="#805ad5" '
                 f'stroke-dasharray="4 3"><title>complaint limit {complaint_limit * 100:.1f}%</title></line>')
    for values, colour, label in ((bounce, "#dd6b20", "bounce rate"), (complaint, "#805ad5", "complaint rate")):
        points = [(LEFT + (i + 0.5) * step, TOP + plot_h * (1 - v / top)) for i, v in enumerate(values) if v is not None]
        if len(points) > 1:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
                         + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>')
        for (x, y), v, m in zip(points, [v for v in values if v is not None],
                                [m for m, v in zip(minutes, values) if v is not None]):
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}">'
                         f'<title>{_minute(m)}: {label} {v * 100:.2f}%</title></circle>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _frame(title: str, top: float, top_label: str, minutes: Sequence[dict[str, Any]]) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - 6, HEIGHT - BOTTOM - TOP
    return [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="#718096"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#718096"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end" class="axis">{escape(top_label)}</text>',
        f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end" class="axis">0</text>',
        f'<text x="{LEFT}" y="{HEIGHT - 6}" class="axis">{_minute(minutes[0])}</text>',
        f'<text x="{LEFT + plot_w}" y="{HEIGHT - 6}" text-anchor="end" class="axis">{_minute(minutes[-1])} UTC</text>',
    ]


def _minute(row: dict[str, Any]) -> str:
    return row["minute"].astimezone(timezone.utc).strftime("%H:%M")


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None
