"""Rates written as ``20/s``, ``100/min``, ``5000/h``, ``0.5/s``, ``100000/day``, with a burst.

A rate is kept as the two numbers the limiter needs (GCRA): the emission interval ``T`` between
two sends at the steady pace, and the burst tolerance ``tau = T * (burst - 1)``: how far ahead of
the steady pace a limit that was idle may run, so ``burst`` sends can leave at once, less what
``pacing.latency_margin`` keeps back (``Rate.tolerance_within``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0, "day": 86400.0}
#: The form a rate takes, for the config schema too (it cannot refuse 0/s: see rate_problem).
RATE_PATTERN = r"^\d+(\.\d+)?/(s|min|h|day)$"
_RATE = re.compile(RATE_PATTERN)
HOW_TO_WRITE = "write N/s, N/min, N/h or N/day, e.g. 20/s"


@dataclass(frozen=True)
class Rate:
    per_second: float
    burst: int
    text: str  # as written: `20/s`, for messages and status

    @property
    def interval(self) -> float:
        """Seconds between two sends at the steady pace (GCRA's emission interval T)."""
        return 1.0 / self.per_second

    @property
    def tolerance(self) -> float:
        """Seconds the limit may run ahead of the steady pace (GCRA's tau): ``burst`` sends at once
        (as configured; the limiter applies ``tolerance_within``)."""
        return self.interval * (self.burst - 1)

    def tolerance_within(self, latency_margin: float) -> float:
        """The tolerance the limiter applies, with what a relay that gets sends up to
        ``latency_margin`` seconds late needs kept back (``pacing.latency_margin``; see
        senddock.core.pacer): GCRA begins at most ``floor((w + tau) / T) + 1`` sends over any w
        seconds, so over 1 + m seconds ``floor((1 + m) * rate) - floor(rate)`` intervals of tau
        come off. None for a slow limit (at 1/min the extra quarter second holds no send) or a
        burst of 1.

        At most half the tolerance, though: the rest absorbs the claims' own timing (a take that
        comes late admits what the limit could have let go meanwhile, up to the tolerance; with
        none, that time is lost and the rate falls short: a 20/s limit with none left sent about
        13/s). A burst under ``2 * kept + 1`` therefore keeps back less than it needs."""
        kept = math.floor((1 + latency_margin) * self.per_second + 1e-9) - math.floor(self.per_second + 1e-9)
        return self.tolerance - min(kept * self.interval, self.tolerance / 2)

    def at_once(self, latency_margin: float = 0.0) -> int:
        """Sends a limit that was idle lets go at once, what ``latency_margin`` needs kept back:
        ``burst`` without one. The same 1 µs of slack as the limiter's statement (pacing_take)."""
        return math.floor((self.tolerance_within(latency_margin) + 1e-6) / self.interval) + 1

    def __str__(self) -> str:
        return f"{self.text} (burst {self.burst})"


def rate_problem(text: object) -> str | None:
    """Why ``text`` is not a rate, in words; None when it is one."""
    if not isinstance(text, str) or _RATE.fullmatch(text) is None:
        return f"{text!r} is not a rate: {HOW_TO_WRITE}"
    count, unit = text.split("/")
    if float(count) == 0:
        return f"{text!r} is not a rate: N must be more than 0 (to stop sending, pause the campaign)"
    # Slower than one a day is no pacing but a schedule, and its interval (times a burst) would
    # overflow the timestamps the limiter keeps.
    if float(count) / _UNITS[unit] < 1 / _UNITS["day"]:
        return f"{text!r} is too slow a rate: at least 1/day (for later sends, `campaign send --at TIME`)"
    return None


def default_burst(per_second: float) -> int:
    """One second's worth, at least 1: a limit that was idle may send that many at once."""
    return max(1, math.floor(per_second))


def parse_rate(text: str, burst: int | None = None) -> Rate:
    """The rate in ``text`` (``20/s``) with ``burst`` (default: one second's worth, at least 1);
    raises ValueError saying what is wrong."""
    problem = rate_problem(text)
    if problem:
        raise ValueError(problem)
    if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int) or burst < 1):
        raise ValueError(f"{burst!r} is not a burst: write a whole number of sends, at least 1")
    count, unit = text.split("/")
    per_second = float(count) / _UNITS[unit]
    return Rate(per_second=per_second, burst=default_burst(per_second) if burst is None else burst, text=text)


# -- a campaign's own rate, stored as one text (campaigns.send_rate) ----------------------------------
#
# `campaign create --rate 100/min [--burst 5]`: the rate and its burst as the config spells them
# (`{rate: 100/min, burst: 5}`), kept in one column as `100/min` or `100/min burst 5`, the number
# written the shortest way (`0100/min`, `100.0/min` are `100/min`): one spelling per rate.
_STORED = re.compile(r"^(?P<rate>\S+)(?: burst (?P<burst>\d+))?$")


def campaign_rate_text(text: str, burst: int | None = None) -> str:
    """The stored form of ``text`` with ``burst`` (None: the default); raises ValueError saying
    what is wrong, as :func:`parse_rate` does."""
    rate = parse_rate(text, burst)  # refuses what is not a rate, or not a burst
    count, unit = rate.text.split("/")
    normal = f"{_shortest(count)}/{unit}"
    return normal if burst is None else f"{normal} burst {burst}"


def parse_campaign_rate(stored: str) -> Rate:
    """The Rate a campaign's stored ``send_rate`` stands for (``100/min`` or ``100/min burst 5``);
    raises ValueError for a text that is neither (one written into the table by hand)."""
    found = _STORED.fullmatch(stored)
    if found is None:
        raise ValueError(f"{stored!r} is not a campaign rate: write N/s, N/min, N/h or N/day, then "
                         "optionally ' burst N'")
    burst = found["burst"]
    return parse_rate(found["rate"], None if burst is None else int(burst))


def _shortest(count: str) -> str:
    """``0100`` → ``100``, ``2.50`` → ``2.5``, ``3.0`` → ``3``."""
    from decimal import Decimal

    return format(Decimal(count).normalize(), "f")


def campaign_rate_view(stored: str | None) -> dict[str, object] | None:
    """A stored campaign rate as `--json` shows it: ``{"rate": "100/min", "burst": 1}``, the
    config's spelling, the burst filled in when it is the default; None for no rate of its own."""
    if stored is None:
        return None
    try:
        rate = parse_campaign_rate(stored)
    except ValueError:
        return {"rate": stored, "burst": None}  # written by hand: shown as it is, never a traceback
    return {"rate": rate.text, "burst": rate.burst}


def format_rate_like(per_second: float, like: Rate) -> str:
    """``per_second`` written in the unit ``like`` is written in: 10/s, 50/min, 0.25/s."""
    unit = like.text.rpartition("/")[2]
    value = per_second * _UNITS[unit]
    return f"{value:.0f}/{unit}" if value >= 100 else f"{value:.3g}/{unit}"
