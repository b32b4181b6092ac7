"""Adaptive pacing (AIMD): a provider's throttling halves its group's rate, which climbs back
additively while replies are clean, never above the configured rate, at a pace proportional to
the rate the provider pushed back at.

A limit's rate is its configured rate times a factor in (0, 1], kept with the limit in Postgres
(``pacing_limits.factor``, ``factor_at``, ``ceiling``), so every node slows down together. A
throttling reply remembers the factor in force f as the *ceiling* and sets
``factor = max(floor, f / 2)`` and ``factor_at = now``, at most once per ``hold``: the sends in
flight when a provider starts throttling all report it, and that is one signal, not fifty.
Recovery needs no writer: the factor in force at time t is
``min(1, factor + ceiling * (t - factor_at) / recovery)``, read by the take that uses it. A limit
throttled at its configured rate (ceiling 1) climbs a tenth of it every tenth of the recovery; one
throttled at 5% climbs 5% as fast, so it spends half the recovery time below what the provider
allows, instead of being back above it in two seconds (a group at 100/s against a provider
allowing 5/s had half its sends throttled).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from senddock.durations import parse_duration

if TYPE_CHECKING:  # limits.py reads the settings from here: no import back at run time
    from senddock.outcome import Classification


@dataclass(frozen=True)
class Adaptive:
    """How a throttled limit slows down and recovers; ``pacing.adaptive: true`` takes the defaults."""

    recovery: float = 100.0  # seconds to climb from nothing back to the whole rate: +10% every 10 s
    hold: float = 5.0  # seconds after a halving during which further throttling replies change nothing
    floor: float = 0.02  # the factor never falls below this share of the configured rate

    def in_force(self, factor: float, halved_ago: float | None, ceiling: float | None = None) -> float:
        """The factor in force for a limit halved to ``factor`` ``halved_ago`` seconds ago (None:
        never halved) from ``ceiling`` (the factor in force then; None: 1): the formula the
        limiter's statements use (``pacing_take``, ``pacing_throttled``). It climbs back by a
        share of the ceiling, not of the configured rate: what the provider pushed back at is
        approached at a pace proportional to it."""
        if halved_ago is None:
            return factor
        return min(1.0, factor + (1.0 if ceiling is None else ceiling) * max(0.0, halved_ago) / self.recovery)


def adaptive_settings(value: bool | Mapping[str, Any]) -> Adaptive | None:
    """``pacing.adaptive`` (validated): false -> None; true -> the defaults; an object -> its values."""
    if value is False:
        return None
    if value is True:
        return Adaptive()
    defaults = Adaptive()
    return Adaptive(
        recovery=parse_duration(value["recovery"]) if "recovery" in value else defaults.recovery,
        hold=parse_duration(value["hold"]) if "hold" in value else defaults.hold,
        floor=float(value.get("floor", defaults.floor)),
    )


def adaptive_problems(value: bool | Mapping[str, Any]) -> list[tuple[str, str]]:
    """(json path, message) for what the schema cannot say about ``pacing.adaptive``."""
    if not isinstance(value, Mapping) or "recovery" not in value:
        return []
    if parse_duration(value["recovery"]) <= 0:
        return [("$.pacing.adaptive.recovery", f"{value['recovery']!r} is no time to recover in: "
                 "give the time to climb from nothing back to the configured rate, e.g. 100s")]
    return []


def slows_pacing(verdict: Classification) -> bool:
    """Whether a send's classified reply asks for a slower pace: throttling does, greylisting
    (throttled for retries, reason ``greylisted``) asks for one retry later and does not."""
    return verdict.throttled and verdict.reason != "greylisted"
