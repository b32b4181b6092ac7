"""Subscribers: one at a time, or streamed from a CSV file in a single transaction."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from senddock.domain.lists import get_list
from senddock.store.queries import query
from senddock.csv_text import DEFAULT_ENCODING, check_encoding, decoded_lines
from senddock.errors import InvalidInput, NotFound, UsageError
from senddock.mail import headertext
from senddock.mail.addresses import check_address
from senddock.store import outbox
from senddock.config.webhooks import NO_WEBHOOKS, Subscriptions


@dataclass(frozen=True)
class RowNote:
    """Something about one CSV row, printed as ``FILE:LINE: reason``."""

    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


class Rejection(RowNote):
    """A CSV row that was not imported."""


class Normalised(RowNote):
    """A row imported with its name made one line (a line break or control character removed)."""


@dataclass(frozen=True)
class ImportSummary:
    """Rows counted once each: a new subscriber (imported), one whose name, attributes or lists
    changed (updated), one already exactly so (unchanged), or a row not imported (rejected)."""

    imported: int
    updated: int
    unchanged: int
    rejected: int
    normalised: int = 0


@dataclass(frozen=True)
class _Row:
    line: int
    email: str
    name: str | None
    attributes: dict[str, str]
    note: Normalised | None = None


def add_subscriber(
    conn: psycopg.Connection,
    email: str,
    *,
    name: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    lists: Sequence[str] = (),
) -> int:
    """Add or update one subscriber and put them on ``lists``; returns the subscriber id.

    A name with a line break or control character is refused (it goes into the To header): the
    caller gets to say what it should be, where an import, with nobody to ask, normalises it.
    """
    try:
        email = check_address(email)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if problem := headertext.problem(name):
        raise InvalidInput(f"name {name!r} contains {problem}: give it on one line")
    with conn.transaction():
        list_ids = [get_list(conn, name).id for name in lists]
        row = conn.execute(
            query("subscriber_upsert"), {"email": email, "name": name, "attributes": Jsonb(dict(attributes or {}))}
        ).fetchone()
        for list_id in list_ids:
            conn.execute(query("list_member_add"), {"list_id": list_id, "subscriber_id": row[0]})
    return row[0]


def add_subscribers(conn: psycopg.Connection, emails: Sequence[str], *, lists: Sequence[str] = ()) -> list[int]:
    """:func:`add_subscriber` for many addresses at once, in one transaction: each added (or
    found) and put on ``lists``; returns their ids in order. Any bad address refuses them all."""
    checked = []
    for email in emails:
        try:
            checked.append(check_address(email))
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    with conn.transaction(), conn.cursor() as cursor:
        list_ids = [get_list(conn, name).id for name in lists]
        cursor.executemany(query("subscriber_upsert"), [{"email": e, "name": None, "attributes": Jsonb({})}
                                                         for e in checked], returning=True)
        ids = []
        while True:
            ids.append(cursor.fetchone()[0])
            if not cursor.nextset():
                break
        cursor.executemany(query("list_member_add"), [{"list_id": list_id, "subscriber_id": subscriber_id}
                                                      for list_id in list_ids for subscriber_id in ids])
    return ids


def import_csv(
    conn: psycopg.Connection,
    path: str | os.PathLike[str],
    list_name: str,
    *,
    on_reject: Callable[[Rejection], None] = lambda r: None,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
    on_normalise: Callable[[Normalised], None] = lambda n: None,
    encoding: str = DEFAULT_ENCODING,
    on_fallback: Callable[[int], None] = lambda line: None,
) -> ImportSummary:
    """Import a CSV (header row with ``email``; ``name`` optional; other columns become attributes).

    The file is streamed into a temporary table with COPY, so memory does not grow with its size;
    duplicates are found and the subscribers upserted in SQL, all in one transaction: an import is
    applied whole or not at all. Each rejected row is reported through ``on_reject``; each row
    imported with its name made one line through ``on_normalise``, once the import is applied.
    ``encoding``: the file's character set (a byte order mark at its start is skipped), or one
    and a fallback for the lines not in it (``utf-8,cp1252``: each such line's number is told to
    ``on_fallback``).
    """
    try:
        check_encoding(encoding)
    except ValueError as exc:
        raise UsageError(f"{{=encoding}}: {exc}") from None
    label = str(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed below; progress reads its byte position
    except OSError as exc:
        raise InvalidInput(f"{label}: cannot read: {exc.strerror or exc}") from None
    rejected = 0
    notes: dict[int, Normalised] = {}  # few: only rows whose name had to be made one line
    with raw:
        total_bytes = os.fstat(raw.fileno()).st_size
        with conn.transaction():
            list_id = get_list(conn, list_name).id
            conn.execute(query("import_staging_create"))
            rows = _read_rows(decoded_lines(raw, encoding, label, on_fallback), label)
            has_name = next(rows)  # the generator first reports whether the header has a name column
            with conn.cursor() as cur, cur.copy(query("import_staging_copy")) as copy:
                for count, item in enumerate(rows, 1):
                    if isinstance(item, Rejection):
                        rejected += 1
                        on_reject(item)
                    else:
                        copy.write_row((item.line, item.email, item.name, json.dumps(item.attributes)))
                        if item.note is not None:
                            notes[item.line] = item.note
                    if count % 5000 == 0:
                        on_progress(raw.tell(), total_bytes)
            on_progress(total_bytes, total_bytes)
            for line, email, first_line in conn.execute(query("import_remove_duplicates")).fetchall():
                rejected += 1
                on_reject(Rejection(label, line, f"duplicate of line {first_line} ({email})"))
                notes.pop(line, None)  # not stored at all
            conn.execute(query("import_apply"), {"has_name": has_name})
            imported, updated, unchanged = conn.execute(query("import_join_list"), {"list_id": list_id}).fetchone()
    for line in sorted(notes):
        on_normalise(notes[line])
    return ImportSummary(imported=imported, updated=updated, unchanged=unchanged, rejected=rejected,
                         normalised=len(notes))


def _read_rows(lines: Iterator[str], label: str) -> Iterator[Any]:
    """Yield whether there is a name column, then a _Row or a Rejection per record."""
    reader = csv.reader(lines)
    try:
        header = next(reader, None)
        if header is None:
            raise InvalidInput(f"{label}: the file is empty; it needs a header row with an 'email' column")
        columns = [h.strip() for h in header]
        lowered = [c.lower() for c in columns]
        if "email" not in lowered:
            raise InvalidInput(f"{label}:1: the header has no 'email' column (found: {', '.join(columns)})")
        for index, column in enumerate(columns):
            if not column:
                raise InvalidInput(f"{label}:1: column {index + 1} of the header has no name")
            if "\x00" in column:
                raise InvalidInput(f"{label}:1: column {index + 1} of the header contains a NUL character")
            if lowered.index(column.lower()) != index:
                raise InvalidInput(f"{label}:1: column {column!r} appears twice in the header")
        email_at = lowered.index("email")
        name_at = lowered.index("name") if "name" in lowered else None
        attribute_columns = [(i, c) for i, c in enumerate(columns) if i not in (email_at, name_at)]
        yield name_at is not None

        previous_end = reader.line_num
        for record in reader:
            line, previous_end = previous_end + 1, reader.line_num
            if not record or record == [""]:
                continue  # blank line
            if len(record) != len(columns):
                yield Rejection(label, line, f"has {len(record)} fields, the header has {len(columns)}")
                continue
            try:
                email = check_address(record[email_at])
            except ValueError as exc:
                yield Rejection(label, line, str(exc))
                continue
            attributes = {column: record[i] for i, column in attribute_columns}
            nul = next((column for column, value in attributes.items() if "\x00" in value), None)
            if nul is not None:
                # Postgres cannot store it, and the import would fail whole at the end.
                yield Rejection(label, line, f"attribute {nul!r} contains a NUL character")
                continue
            name, note = record[name_at].strip() if name_at is not None else None, None
            if problem := headertext.problem(name):
                # The name goes into the To header: made one line here, refused by the engine if
                # it got into the database another way.
                name = headertext.one_line(name)
                note = Normalised(label, line, f"name contained {problem}; stored as {name!r}")
            yield _Row(line, email, name, attributes, note)
    except csv.Error as exc:
        raise InvalidInput(f"{label}:{reader.line_num}: {exc}") from None


def unsubscribe(conn: psycopg.Connection, subscriber_id: int, campaign_id: int, *,
                webhooks: Subscriptions = NO_WEBHOOKS) -> str | None:
    """Unsubscribe and suppress (a link's click); the subscriber's address, or None when there is
    no such subscriber. The first click, not its repeats, writes the unsubscribed webhook event."""
    with conn.transaction():
        row = conn.execute(query("subscriber_unsubscribe"),
                           {"subscriber_id": subscriber_id, "campaign_id": campaign_id}).fetchone()
        if row and row[2]:
            outbox.emit(conn, webhooks, [outbox.event("unsubscribed", email=row[0], subscriber_id=subscriber_id,
                                                      campaign_id=campaign_id, source="link")])
    return row[0] if row else None


def set_status(conn: psycopg.Connection, email: str, status: str, *, webhooks: Subscriptions = NO_WEBHOOKS) -> str:
    """``unsubscribed`` or ``blocklisted``, the address suppressed with it; returns the status the
    subscriber has now (a blocklisted subscriber stays blocklisted when unsubscribed)."""
    reason = {"unsubscribed": "unsubscribed", "blocklisted": "manual"}[status]
    with conn.transaction():
        row = conn.execute(query("subscriber_set_status"), {
            "email": email, "status": status, "reason": reason, "diagnostic": f"{status} by the operator"}).fetchone()
        if row is None:
            raise NotFound(f"no subscriber {email}")
        if status == "unsubscribed" and row[3] == "active":
            outbox.emit(conn, webhooks, [outbox.event("unsubscribed", email=row[1], subscriber_id=row[0],
                                                      campaign_id=None, source="operator")])
    return row[2]


def list_subscribers(conn: psycopg.Connection, list_name: str | None = None) -> list[dict[str, Any]]:
    list_id = get_list(conn, list_name).id if list_name else None
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("subscriber_list"), {"list_id": list_id}).fetchall()


def show_subscriber(conn: psycopg.Connection, email: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(query("subscriber_show"), {"email": email}).fetchone()
    if found is None:
        raise NotFound(f"no subscriber {email}")
    return found
