"""Sizes written as ``256KiB``, ``1MiB``, ``512B`` or a plain number of bytes (``262144``).

Only binary units: ``KB`` means 1000 bytes to some readers and 1024 to others, so it is refused
rather than guessed.
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_SIZE = re.compile(r"(\d+(?:\.\d+)?) ?(B|KiB|MiB|GiB)?")


def is_size(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    return isinstance(value, str) and _SIZE.fullmatch(value) is not None


def parse_size(value: str | int) -> int:
    """Bytes in ``value``; raises ValueError naming the value when it is not a size."""
    if not is_size(value):
        raise ValueError(f"{value!r} is not a size (use e.g. 256KiB, 1MiB, or a number of bytes)")
    if isinstance(value, int):
        return value
    match = _SIZE.fullmatch(value)
    assert match is not None
    return int(float(match[1]) * _UNITS[match[2] or ""])


def format_size(size: int) -> str:
    """The shortest exact form: 262144 -> ``256KiB``, 1000 -> ``1000B``."""
    for unit in ("GiB", "MiB", "KiB"):
        if size and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return f"{size}B"
