"""Named SQL queries, kept together in ``sql/*.sql`` (one file per part of the schema: jobs, nodes,
campaigns...) under ``-- name: <name>`` headers. A name is unique across the files."""

from __future__ import annotations

import re
from functools import cache, lru_cache
from importlib import resources

_HEADER = re.compile(r"^--\s*name:\s*(?P<name>\w+)\s*$", re.MULTILINE)
# What may hide a "--" that is not a comment: a string ('...', '' inside), a quoted identifier
# ("..."), a dollar-quoted body ($$...$$, $tag$...$tag$). A comment runs to the end of its line.
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|(\$\w*\$).*?\1|--[^\n]*", re.DOTALL)


def without_comments(sql: str) -> str:
    """``sql`` as sent: its ``--`` comments and indentation dropped, blank lines removed.

    The comments are for readers of the .sql files. Sent, they would cost more than bytes: psycopg
    caches its parse of a statement's placeholders only up to 4 KiB of text and parses longer ones
    afresh at every call, which the claim and the result commit are (run hundreds of times a second).
    """
    text = _TOKEN.sub(lambda m: "" if m[0].startswith("--") else m[0], sql)
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


@cache
def all_queries() -> dict[str, str]:
    queries: dict[str, str] = {}
    where: dict[str, str] = {}
    folder = resources.files("senddock.store.sql")
    for file in sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name):
        parts = _HEADER.split(file.read_text(encoding="utf-8"))
        # parts: [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2]):
            if name in queries:
                raise RuntimeError(f"query {name!r} is defined twice: in {where[name]} and {file.name}")
            queries[name] = without_comments(body).rstrip(";")
            where[name] = file.name
    return queries


def query(name: str) -> str:
    return all_queries()[name]


@lru_cache(maxsize=256)
def for_broadcasts(name: str, broadcast_ids: tuple[int, ...]) -> str:
    """``name``'s query with its ``{b}`` written as the list of these broadcast ids (NULL, matching
    none, for no id).

    A statement on the send path names its broadcasts so that it touches their partitions only
    (migration 20). As a bound parameter the list would cost either way: a custom plan is made
    afresh at every run, and on PostgreSQL 15 a generic plan locks every partition of the table at
    every run, pruned or not. Written as literals, the plan is pruned when it is made, and psycopg
    keeps the prepared statement of each text (the set of broadcasts sending changes rarely). The
    ids pass through int(): nothing else is ever written in.
    """
    listed = ", ".join(str(int(b)) for b in broadcast_ids) or "NULL"
    return query(name).replace("{b}", listed)
