"""Named SQL queries, kept together in ``sql/queries.sql`` under ``-- name: <name>`` headers."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^--\s*name:\s*(?P<name>\w+)\s*$", re.MULTILINE)


@cache
def all_queries() -> dict[str, str]:
    text = resources.files("senddock.core.sql").joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    # parts: [preamble, name1, body1, name2, body2, ...]
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in queries:
            raise RuntimeError(f"query {name!r} is defined twice in queries.sql")
        queries[name] = body.strip().rstrip(";")
    return queries


def query(name: str) -> str:
    return all_queries()[name]
