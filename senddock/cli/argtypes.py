"""argparse types for options whose bad values must be a usage error (exit 2), never a traceback
or a silent default: `--workers 0` used to mean "the config's", `--port 99999` crashed in bind()."""

from __future__ import annotations

import argparse


def worker_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of workers (a whole number, 1 or more)")
    return value


def positive_count(text: str) -> int:
    """How many of something to show (`--limit N`): an id's wording ("is not an id") would puzzle."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (a whole number, 1 or more)")
    return value


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0 to 65535; 0 picks a free one)")
    return value


def node_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a node name cannot be empty (leave --node out for the default)")
    return text


def refresh_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a refresh interval in seconds (0.05 to 3600)")
    return value
