"""Rates read from timestamps: what a relay received per window, and its busiest second.

Pure functions over sorted times in seconds (any epoch), shared by bench/pacing.py (the limiter's
admissions) and bench/paced_nodes.py (the sink's log of received messages).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from datetime import datetime


def busiest(times: Sequence[float], width: float = 1.0, weights: Sequence[int] | None = None) -> int:
    """The most events (or the largest sum of ``weights``) in any half-open window ``[t, t + width)``
    starting at an event: the bound a GCRA limit promises is ``rate * width + burst``."""
    weights = weights if weights is not None else [1] * len(times)
    totals = [0]
    for weight in weights:
        totals.append(totals[-1] + weight)
    best = 0
    for i, start in enumerate(times):
        end = bisect.bisect_left(times, start + width, lo=i)
        best = max(best, totals[end] - totals[i])
    return best


def window_counts(times: Sequence[float], width: float = 10.0, skip: int = 0) -> list[int]:
    """Events in consecutive windows of ``width`` seconds from the first event, the first ``skip``
    events left out (the burst an idle limit lets go at once, which is not the steady rate). Only
    whole windows count: the last, cut short by the end of the run, is not in the list."""
    if not times:
        return []
    start, last = times[0], times[-1]
    whole = int((last - start) // width)
    counts = [0] * whole
    for t in times[skip:]:
        index = int((t - start) // width)
        if index < whole:
            counts[index] += 1
    return counts


def judge_windows(counts: Sequence[int], width: float, rate: float, tolerance: float) -> list[str]:
    """What is wrong with the windows' rates against ``rate`` per second, ± ``tolerance`` (0.05 for
    5%); empty when every window is within it. No whole window at all is a problem too: the run
    was shorter than one window, so nothing says the rate held."""
    if not counts:
        return [f"no whole {width:g} s window: the run was shorter than that"]
    problems = []
    for index, count in enumerate(counts):
        measured = count / width
        if abs(measured - rate) > tolerance * rate:
            problems.append(f"window {index + 1} ({index * width:g}-{(index + 1) * width:g} s): "
                            f"{measured:g}/s, outside {rate:g}/s ± {tolerance:.0%}")
    return problems


def sink_log_times(lines: Iterable[str]) -> list[float]:
    """The sorted times (epoch seconds) of the messages in a `senddock sink` log: each message's line
    starts with its ISO-8601 time; other lines (the banner, a final count) are skipped."""
    times = []
    for line in lines:
        first = line.split(" ", 1)[0]
        try:
            times.append(datetime.fromisoformat(first).timestamp())
        except ValueError:
            continue
    return sorted(times)
