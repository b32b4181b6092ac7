"""One SVG chart of the benchmarks' JSON lines: senddock against its baseline, scenario by scenario.

    python bench/drain.py --pgqueuer > runs.jsonl; python bench/inflight.py ... >> runs.jsonl; ...
    python bench/plot.py runs.jsonl [more.jsonl ...] -o docs/bench.svg

Reads every line that is a JSON object with a "benchmark" key (drain, smtp_drain, inflight,
paced_nodes; the benches print other lines too, which are skipped) and draws, per scenario, one
horizontal bar per side scaled to the baseline's rate (the bare loop, or the configured rate for
pacing), each labelled with its own figure, and a tick at the target issue 14 sets for senddock.
Hand-written SVG, no plotting library. A later line of the same scenario replaces an earlier one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from pathlib import Path


@dataclass(frozen=True)
class Scenario:
    """One group of bars: ``bars`` are (side, rate), the first the baseline every bar is scaled to."""

    label: str
    unit: str
    bars: tuple[tuple[str, float], ...]
    target: float | None = None  # senddock's rate over the baseline's that issue 14 asks for


def scenarios(lines: Iterable[str]) -> list[Scenario]:
    """The scenarios in the benches' output lines, in the order first seen."""
    found: dict[str, Scenario] = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            for scenario in _from_row(row):
                found[scenario.label] = scenario
    return list(found.values())


def _from_row(row: dict) -> list[Scenario]:
    kind = row.get("benchmark")
    if kind == "drain":
        bars = [("bare loop", row["bare_jobs_per_s"]), ("senddock", row["senddock_jobs_per_s"])]
        if row.get("pgqueuer_jobs_per_s"):
            bars.append(("pgqueuer", row["pgqueuer_jobs_per_s"]))
        return [Scenario(f"null transport, C={row.get('concurrency', row['workers'])}", "jobs/s", tuple(bars), 1.0)]
    if kind == "smtp_drain":
        return [Scenario(f"SMTP sink, C={row['workers']}", "msg/s",
                         (("bare smtplib", row["bare_messages_per_s"]), ("senddock", row["senddock_messages_per_s"])),
                         0.8)]
    if kind == "inflight":
        found = []
        for r in row["rows"]:
            if not r["bare_messages_per_s"]:  # a side that failed: no rate to draw
                continue
            delay = f", {r['delay_ms']} ms DATA" if r["delay_ms"] else ""
            found.append(Scenario(f"SMTP sink{delay}, C={r.get('concurrency', r['workers'])}", "msg/s",
                                  (("bare smtplib", r["bare_messages_per_s"]),
                                   ("senddock", r["senddock_messages_per_s"] or 0)), 0.8))
        return found
    if kind == "paced_nodes" and row.get("rate_after_burst_per_s"):
        return [Scenario(f"pacing {row['rate_per_s']:g}/s, {row['nodes']} nodes", "msg/s",
                         (("configured", row["rate_per_s"]), ("senddock", row["rate_after_burst_per_s"])), 1.0)]
    return []


def svg(groups: list[Scenario], width: int = 860) -> str:
    """The chart: a row per bar, bars as a share of their group's baseline (100% = the baseline)."""
    label_w, bar_h, gap, top = 230, 18, 14, 40
    plot_w = width - label_w - 240  # room right of the longest bar for its label
    # The longest bar sets the scale, at least 100% (the baseline), so a side far ahead still fits.
    scale = max([1.0] + [rate / g.bars[0][1] for g in groups for _, rate in g.bars if g.bars[0][1]])
    colors = {"senddock": "#2b6cb0"}
    rows = sum(len(g.bars) for g in groups)
    height = top + rows * (bar_h + 4) + len(groups) * gap + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<text x="{label_w}" y="20" font-size="14" font-weight="bold">senddock against the baseline '
           f'(bar length: share of the baseline\'s rate)</text>']
    x100 = label_w + plot_w / scale
    out.append(f'<line x1="{x100:.1f}" y1="{top - 8}" x2="{x100:.1f}" y2="{height - 24}" stroke="#999" '
               f'stroke-dasharray="3,3"/>')
    out.append(f'<text x="{x100:.1f}" y="{height - 10}" text-anchor="middle" fill="#666">100%</text>')
    y = top
    for group in groups:
        base = group.bars[0][1] or 1.0
        out.append(f'<text x="{label_w - 8}" y="{y + bar_h - 4}" text-anchor="end" font-weight="bold">'
                   f'{escape(group.label)}</text>')
        for side, rate in group.bars:
            length = plot_w * (rate / base) / scale
            out.append(f'<rect x="{label_w}" y="{y}" width="{length:.1f}" height="{bar_h}" '
                       f'fill="{colors.get(side, "#a0aec0")}"><title>{escape(side)}: {rate:,.0f} {group.unit}'
                       f'</title></rect>')
            out.append(f'<text x="{label_w + length + 4:.1f}" y="{y + bar_h - 4}">{escape(side)} '
                       f'{rate:,.0f} {group.unit} ({rate / base:.0%})</text>')
            if side == "senddock" and group.target is not None:
                tx = label_w + plot_w * group.target / scale
                out.append(f'<line x1="{tx:.1f}" y1="{y - 2}" x2="{tx:.1f}" y2="{y + bar_h + 2}" stroke="#c53030" '
                           f'stroke-width="2"><title>target {group.target:.0%}</title></line>')
            y += bar_h + 4
        y += gap
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="*", type=Path, help="files of JSON lines (default: standard input)")
    parser.add_argument("-o", "--output", type=Path, help="the SVG file (default: standard output)")
    args = parser.parse_args()
    try:
        lines = [line for path in args.inputs for line in path.read_text(encoding="utf-8").splitlines()] \
            if args.inputs else sys.stdin.read().splitlines()
    except OSError as exc:
        print(f"cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    groups = scenarios(lines)
    if not groups:
        print("no benchmark JSON lines with rates in the input (drain, smtp_drain, inflight, paced_nodes)",
              file=sys.stderr)
        return 1
    chart = svg(groups)
    if args.output:
        args.output.write_text(chart, encoding="utf-8")
        print(f"{args.output}: {len(groups)} scenarios", file=sys.stderr)
    else:
        sys.stdout.write(chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
