"""The ``retry`` section, typed: the schedule of delays and the limits that end retrying.

Read by :attr:`senddock.config.Config.retry` and by the built-in backoff (``senddock.defaults``),
which, registered like any plugin, sees the config only as a :class:`senddock.outcome.PluginConfig`:
so the defaults need nothing of ``senddock.config``, which builds the manager that registers them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from senddock.durations import parse_duration


@dataclass(frozen=True)
class RetrySettings:
    schedule: tuple[float, ...]
    max_retries: int
    jitter: float
    max_age: float | None


def retry_settings(section: Mapping[str, Any]) -> RetrySettings:
    """The validated ``retry`` section as numbers (durations in seconds); ``max_retries`` unset
    means one retry per step of the schedule."""
    schedule = tuple(parse_duration(d) for d in section["schedule"])
    return RetrySettings(
        schedule=schedule,
        max_retries=len(schedule) if section["max_retries"] is None else section["max_retries"],
        jitter=float(section["jitter"]),
        max_age=None if section["max_age"] is None else parse_duration(section["max_age"]),
    )
