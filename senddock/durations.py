"""Durations written as ``30s``, ``2m``, ``1h30m``, ``250ms``, ``1d``, ``2w``, ``2y`` (a year: 365 days)."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, "y": 365 * 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w|y))+")


def is_duration(text: object) -> bool:
    return isinstance(text, str) and _WHOLE.fullmatch(text) is not None


def parse_duration(text: str) -> float:
    """Seconds in ``text``; raises ValueError naming the text when it is not a duration."""
    if not is_duration(text):
        raise ValueError(f"{text!r} is not a duration (use e.g. 30s, 2m, 1h30m)")
    return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))


def format_duration(seconds: float) -> str:
    """The shortest readable form: 90 -> ``1m30s``, 0.25 -> ``250ms``."""
    if seconds < 1 and seconds != 0:
        return f"{round(seconds * 1000)}ms"
    rest = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


_ROUGH = (("year", 365 * 86400), ("month", 30 * 86400), ("day", 86400), ("hour", 3600), ("minute", 60))


def rough_duration(seconds: float) -> str:
    """How long, in its largest whole unit, for a person: ``5 years``, ``1 month``, ``40 seconds``."""
    from senddock.wording import plural

    for unit, size in _ROUGH:
        if seconds >= size:
            return plural(int(seconds // size), unit)
    return plural(int(seconds), "second")
