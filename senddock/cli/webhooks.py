"""`senddock webhooks ls | replay | enable`: the outgoing webhooks' endpoints, their events by
status and the recent failures; events sent again; an endpoint its receiver turned off, on again."""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta, timezone
from typing import Any

from senddock.cli.commands import open_senddock
from senddock.cli.output import Output, plural, table
from senddock.errors import EXIT_OK, UsageError


def add_commands(group, command) -> None:
    """``group``: the ``webhooks`` subcommands."""
    command(group, "ls", webhooks_ls,
            "each webhook endpoint with its events pending, failing, delivered and dead, and the recent failures")
    p = command(group, "replay", webhooks_replay,
                "deliver delivered or dead events again, with the same webhook-id (receivers deduplicate on it)")
    p.add_argument("event", nargs="?", metavar="ID", help="the event: its id as `webhooks ls` shows it, or msg_...")
    p.add_argument("--since", type=since_time, metavar="DURATION|TIME",
                   help="every event since then: a duration back from now (2h, 3d) or an ISO 8601 time with its zone")
    p = command(group, "enable", webhooks_enable,
                "deliver again to an endpoint disabled after its receiver answered 410 Gone")
    p.add_argument("endpoint", metavar="ENDPOINT", help="its id (as `webhooks ls` shows it) or its URL")


def since_time(text: str) -> datetime:
    from senddock.durations import is_duration, parse_duration

    if is_duration(text):
        return datetime.now(timezone.utc) - timedelta(seconds=parse_duration(text))
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a duration (2h, 3d) nor an ISO 8601 time "
                                         "(2026-12-24T09:00:00+01:00)") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no zone: add one, e.g. +01:00 or Z")
    return value


def webhooks_ls(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        found = sd.webhooks()
    out.result(found, lambda: _ls_text(found))
    return EXIT_OK


def _ls_text(found: dict[str, Any]) -> str:
    if not found["endpoints"]:
        return "no webhooks configured (see docs/webhooks.md)"
    rows = [(e["id"], e["url"] or "-", _events(e), e["pending"], e["failing"], e["delivered"], e["dead"], _state(e))
            for e in found["endpoints"]]
    text = table(["endpoint", "url", "events", "pending", "failing", "delivered", "dead", "state"], rows)
    if found["failing"]:
        text += "\n\nfailing lately (newest first):\n" + table(
            ["id", "endpoint", "type", "status", "attempts", "next attempt", "last error"],
            [(f["id"], f["endpoint"], f["type"], f["status"], f["attempts"], f["next_attempt_at"], f["last_error"])
             for f in found["failing"]])
    return text


def _events(endpoint: dict[str, Any]) -> str:
    if not endpoint["configured"]:
        return "-"
    return "all" if len(endpoint["events"]) == 6 else ",".join(endpoint["events"])


def _state(endpoint: dict[str, Any]) -> str:
    if endpoint["disabled"]:
        return f"DISABLED ({endpoint['disabled_reason']})"
    if not endpoint["configured"]:
        return "not configured (its events wait)"
    return "ok"


def webhooks_replay(args: argparse.Namespace, out: Output) -> int:
    if (args.event is None) == (args.since is None):
        raise UsageError("give one event ID or --since DURATION|TIME")
    with open_senddock(args) as sd:
        replayed = sd.replay_webhooks(event=args.event, since=args.since)
    out.result({"replayed": len(replayed), "events": replayed},
               lambda: f"{plural(len(replayed), 'event')} queued again" + (
                   f" ({', '.join(str(e['id']) for e in replayed[:10])}{'...' if len(replayed) > 10 else ''})"
                   if replayed else ""))
    return EXIT_OK


def webhooks_enable(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        endpoint = sd.enable_webhook(args.endpoint)
    out.result({"enabled": endpoint}, f"endpoint {endpoint} enabled: its pending events go out again")
    return EXIT_OK
