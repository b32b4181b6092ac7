"""Mailing lists."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.rows import class_row

from senddock.store.queries import query
from senddock.errors import InvalidInput, NotFound


@dataclass(frozen=True)
class MailingList:
    id: int
    name: str
    created_at: datetime
    active: int = 0
    members: int = 0


def create_list(conn: psycopg.Connection, name: str) -> int:
    name = name.strip()
    if not name:
        raise InvalidInput("a list needs a name")
    row = conn.execute(query("list_create"), {"name": name}).fetchone()
    if row is None:
        raise InvalidInput(f"a list named {name!r} already exists")
    return row[0]


def get_list(conn: psycopg.Connection, name: str) -> MailingList:
    with conn.cursor(row_factory=class_row(MailingList)) as cur:
        found = cur.execute(query("list_by_name"), {"name": name}).fetchone()
    if found is None:
        raise NotFound(f"no list named {name!r} (create it with: senddock lists create {name!r})")
    return found


def all_lists(conn: psycopg.Connection) -> list[MailingList]:
    with conn.cursor(row_factory=class_row(MailingList)) as cur:
        return cur.execute(query("list_all")).fetchall()
