"""`senddock events ingest`: apply provider notifications (SES bounces, complaints, deliveries)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any, TextIO

from senddock.cli.commands import open_senddock
from senddock.cli.output import Output, plural
from senddock.errors import EXIT_OK, EXIT_PROBLEMS, InvalidInput


def add_commands(group, command) -> None:
    """``group``: the ``events`` subcommands."""
    p = command(group, "ingest", ingest,
                "apply bounce, complaint and delivery notifications (SES, bare or in their SNS envelope)")
    p.add_argument("file", nargs="?", default="-", metavar="PATH|-",
                   help="one JSON document per line, or a JSON array (default: standard input)")


def documents(stream: TextIO, label: str) -> Iterator[tuple[str, Any]]:
    """(where, document-or-error) for a JSON array or JSON lines; ``where`` is FILE:LINE or FILE[item].

    JSON lines are read one at a time, as they come: ``events ingest`` can sit at the end of a pipe
    that feeds it notifications for as long as the pipe is open."""
    lines = _lines(stream, label)
    number = 0
    for line in lines:
        number += 1
        if isinstance(line, InvalidInput) or line.strip():
            break
    else:
        return
    if isinstance(line, str) and line.lstrip().startswith("["):
        rest = list(lines)
        if rest and isinstance(rest[-1], InvalidInput):
            yield f"{label}:{number + len(rest)}", rest[-1]
            return
        text = line + "".join(rest)
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            yield f"{label}:{number + exc.lineno - 1}", InvalidInput(f"not JSON: {exc.msg}")
            return
        for index, item in enumerate(items, 1):
            yield f"{label}[{index}]", item
        return
    while True:
        if isinstance(line, InvalidInput):
            yield f"{label}:{number}", line
            return
        if line.strip():
            try:
                yield f"{label}:{number}", json.loads(line)
            except json.JSONDecodeError as exc:
                yield f"{label}:{number}", InvalidInput(f"not JSON: {exc.msg}")
        line = next(lines, None)
        if line is None:
            return
        number += 1


def _lines(stream: TextIO, label: str) -> Iterator[str | InvalidInput]:
    """The stream's lines as they come; text that is not UTF-8 ends it with one error."""
    while True:
        try:
            line = stream.readline()
        except UnicodeDecodeError as exc:
            yield InvalidInput(f"not UTF-8 text ({exc.reason} at byte {exc.start} of a line)")
            return
        if not line:
            return
        yield line


def ingest(args: argparse.Namespace, out: Output) -> int:
    from senddock.store.db import riding_out
    from senddock.domain.events import UnknownMessage

    stream, label = _open_input(args.file)
    totals = {"documents": 0, "recorded": 0, "already_recorded": 0, "suppressed": 0, "problems": []}
    never = threading.Event()  # Ctrl-C ends a wait for the database as it ends a wait for input
    with stream if stream is not sys.stdin else nullcontext(), open_senddock(args) as sd:
        sd.ensure_schema()  # a database that cannot be reached at all fails the command at once
        for where, document in documents(stream, label):
            totals["documents"] += 1
            try:
                if isinstance(document, Exception):
                    raise document
                if not isinstance(document, dict):
                    raise InvalidInput("not a JSON object")
                # The database going away later (a restart, a failover) is waited out, this
                # document in hand: applying it again is recorded once.
                _, applied = riding_out(lambda: sd.ingest_event(document), stop=never, what=f"applying {where}")
            except (InvalidInput, UnknownMessage) as exc:
                totals["problems"].append(f"{where}: {exc}")
                out.problem(f"{where}: {exc}")
                continue
            totals["recorded"] += applied.recorded
            totals["already_recorded"] += applied.already_recorded
            totals["suppressed"] += len(applied.suppressed)
            for email in applied.hooks_failed:
                totals["problems"].append(f"{where}: on_bounced failed for {email}; apply it again later")
    out.result(totals, lambda: (
        f"{plural(totals['documents'], 'document')}: {plural(totals['recorded'], 'event')} recorded "
        f"({totals['already_recorded']} already known), {plural(totals['suppressed'], 'address', 'addresses')} "
        f"suppressed, {plural(len(totals['problems']), 'problem')}"))
    return EXIT_PROBLEMS if totals["problems"] else EXIT_OK


def _open_input(path: str) -> tuple[TextIO, str]:
    if path == "-":
        return sys.stdin, "<stdin>"
    try:
        return open(path, encoding="utf-8"), path  # noqa: SIM115 - closed by ingest's with
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror or exc}") from None
