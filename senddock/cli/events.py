"""`senddock events ingest`: apply provider notifications (SES bounces, complaints, deliveries)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from senddock.cli.commands import open_senddock
from senddock.cli.output import Output, plural
from senddock.errors import EXIT_OK, EXIT_PROBLEMS, InvalidInput


def add_commands(group, command) -> None:
    """``group``: the ``events`` subcommands."""
    p = command(group, "ingest", ingest,
                "apply bounce, complaint and delivery notifications (SES, bare or in their SNS envelope)")
    p.add_argument("file", nargs="?", default="-", metavar="PATH|-",
                   help="one JSON document per line, or a JSON array (default: standard input)")


def documents(text: str, label: str) -> Iterator[tuple[str, Any]]:
    """(where, document-or-error) for a JSON array or JSON lines; ``where`` is FILE:LINE or FILE[item]."""
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            yield f"{label}:{exc.lineno}", InvalidInput(f"not JSON: {exc.msg}")
            return
        for index, item in enumerate(items, 1):
            yield f"{label}[{index}]", item
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{label}:{number}", json.loads(line)
        except json.JSONDecodeError as exc:
            yield f"{label}:{number}", InvalidInput(f"not JSON: {exc.msg}")


def ingest(args: argparse.Namespace, out: Output) -> int:
    if args.file == "-":
        text, label = sys.stdin.read(), "<stdin>"
    else:
        try:
            text, label = Path(args.file).read_text(encoding="utf-8"), args.file
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"{args.file}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    from senddock.core.events import UnknownMessage

    totals = {"documents": 0, "recorded": 0, "already_recorded": 0, "suppressed": 0, "problems": []}
    with open_senddock(args) as sd:
        for where, document in documents(text, label):
            totals["documents"] += 1
            try:
                if isinstance(document, Exception):
                    raise document
                if not isinstance(document, dict):
                    raise InvalidInput("not a JSON object")
                applied = sd.ingest_event(document)
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
