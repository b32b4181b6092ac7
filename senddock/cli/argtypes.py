"""argparse types for options whose bad values must be a usage error (exit 2), never a traceback
or a silent default: `--workers 0` used to mean "the config's", `--port 99999` crashed in bind()."""

from __future__ import annotations

import argparse


def _bounded(text: str, low: float, high: float, what: str, *, whole: bool = True) -> float:
    """``text`` as a number within [low, high], or a usage error saying what was expected."""
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def concurrency_count(text: str) -> int:
    return _bounded(text, 1, 1_000, "a number of sends in flight (a whole number, 1 to 1000)")


def positive_count(text: str) -> int:
    """How many of something to show (`--limit N`): an id's wording ("is not an id") would puzzle."""
    return _bounded(text, 1, 1_000_000_000, "a count (a whole number, 1 or more)")


def port(text: str) -> int:
    return _bounded(text, 0, 65535, "a TCP port (0 to 65535; 0 picks a free one)")


def node_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a node name cannot be empty (leave --node out for the default)")
    return text


def refresh_interval(text: str) -> float:
    return _bounded(text, 0.05, 3600, "a refresh interval in seconds (0.05 to 3600)", whole=False)


def send_rate(text: str) -> str:
    """`--rate 100/min`: refused here, before any database work, with the form to use."""
    from senddock.domain.campaign_rate import NO_RATE
    from senddock.pacing.rates import rate_problem

    problem = text != NO_RATE and rate_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def burst(text: str) -> int:
    return _bounded(text, 1, 1_000_000_000, "a burst (a whole number of sends, 1 or more)")
