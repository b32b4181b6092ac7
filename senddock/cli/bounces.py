"""`senddock bounces ...`: read what comes back by mail (docs/bounces.md)."""

from __future__ import annotations

import argparse
import json
import threading
from typing import Any

from senddock.cli.commands import open_config, open_senddock
from senddock.cli.output import Output, plural, table
from senddock.errors import EXIT_OK, EXIT_PROBLEMS


def add_commands(group, command) -> None:
    """``group``: the ``bounces`` subcommands."""
    p = command(group, "parse", parse,
                "read bounce, complaint and reply messages and say what each is, without a database "
                "(--json: one object per line per message)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="an .eml file, a Maildir folder or an mbox file")
    command(group, "receive", receive,
            "receive bounces and complaints by SMTP on bounces.receive.listen (behind the MX or a relay's "
            "transport map); 250 only once recorded")
    p = command(group, "fetch", fetch,
                "read the bounce mailbox (bounces.mailbox: IMAP or POP3) and apply each message, deleting or "
                "moving it only once applied")
    p.add_argument("--watch", action="store_true", help="keep reading it every bounces.mailbox.interval")
    p = command(group, "ingest", ingest,
                "apply bounce and complaint messages from files: suppress, count, record (a Maildir's messages "
                "move to cur/ once applied)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="an .eml file, a Maildir folder or an mbox file")


def receive(args: argparse.Namespace, out: Output) -> int:
    from senddock.bounces.receiver import start_receiver
    from senddock.cli.engine import stop_on_signals
    from senddock.domain.mail_events import OUTCOMES

    config = open_config(args)
    counts = dict.fromkeys(OUTCOMES, 0)
    lock = threading.Lock()
    with open_senddock(args) as sd:
        sd.ensure_schema()

        def apply_mail(raw: bytes, **where: Any) -> object:
            result = sd.apply_mail(raw, **where)
            with lock:
                counts[result.outcome] += 1
            return result

        server = start_receiver(config, apply_mail)
        settings = server.settings
        stop = threading.Event()
        stop_on_signals(stop.set)
        out.problem(f"senddock bounces receive listening on {settings.host}:{server.port} for "
                    f"{', '.join(settings.addresses)} (Ctrl-C to stop)")
        try:
            while not stop.wait(0.5):
                pass
        finally:
            server.stop()
    out.result({"messages": sum(counts.values()), **counts},
               lambda: f"received {plural(sum(counts.values()), 'message')}: "
                       + (", ".join(f"{n} {o.replace('_', ' ')}" for o, n in counts.items() if n) or "none"))
    return EXIT_OK


def fetch(args: argparse.Namespace, out: Output) -> int:
    from senddock.bounces.mailbox import mailbox_errors, mailbox_settings, open_mailbox
    from senddock.cli.engine import stop_on_signals
    from senddock.store.db import riding_out

    config = open_config(args)
    settings = mailbox_settings(config)
    limit = config.bounces.max_message_size
    errors = mailbox_errors()
    totals = _totals()
    stop = threading.Event()
    if args.watch:
        stop_on_signals(stop.set)
    with open_senddock(args) as sd:
        sd.ensure_schema()

        def apply(item) -> object:
            origin = f"{settings.label}#{item.uid}"
            if not args.watch:
                return sd.apply_mail(item.raw, via="fetch", origin=origin)
            # Watching: the database going away (a restart, a failover) is waited out, the message
            # kept in hand (it stays in the mailbox until applied), like `senddock run` does.
            _, applied = riding_out(lambda: sd.apply_mail(item.raw, via="fetch", origin=origin), stop=stop,
                                    what=f"applying {origin}")
            return applied

        while True:
            try:
                with open_mailbox(settings, config.folder) as box:
                    for item in box.messages(limit):
                        result = apply(item)
                        if result is None:
                            break  # stopped while the database was away: the message stays
                        _count(totals, result)
                        if result.outcome == "unreadable":
                            where = (f"moved to {settings.unreadable}" if box.set_aside(item.uid)
                                     else "left in the mailbox")
                            totals["problems"].append(f"{settings.label}#{item.uid}: unreadable ({result.detail}); "
                                                      f"{where}")
                            continue
                        if result.hooks_failed:
                            totals["problems"].append(f"{settings.label}#{item.uid}: on_bounced failed; "
                                                      "it stays in the mailbox for the next fetch")
                            continue
                        box.done(item.uid)
                        if stop.is_set():
                            break
            except errors as exc:
                problem = f"{settings.label}: {_mailbox_error(exc)}"
                totals["problems"].append(problem)
                out.problem(f"senddock: {problem}")
            if not args.watch or stop.wait(settings.interval):
                break
    out.result(totals, lambda: _ingest_summary(totals))
    return EXIT_PROBLEMS if totals["problems"] else EXIT_OK


def _mailbox_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def _totals() -> dict[str, Any]:
    """What fetch and ingest count: messages, each outcome, replays, suppressions, problems."""
    from senddock.domain.mail_events import OUTCOMES

    return {"messages": 0, **dict.fromkeys(OUTCOMES, 0), "replayed": 0, "suppressed": 0, "problems": []}


def _count(totals: dict[str, Any], result) -> None:
    totals["messages"] += 1
    totals[result.outcome] += 1
    totals["replayed"] += result.replayed
    totals["suppressed"] += result.suppressed


def ingest(args: argparse.Namespace, out: Output) -> int:
    from senddock.bounces.sources import SourceError, read_paths

    totals = _totals()
    with open_senddock(args) as sd:
        for item in read_paths(args.paths, sd.config.bounces.max_message_size, read_too=False):
            if isinstance(item, SourceError):
                totals["problems"].append(str(item))
                out.problem(f"senddock: {item}")
                continue
            result = sd.apply_mail(item.raw, via="ingest", origin=item.source)
            _count(totals, result)
            if result.outcome == "unreadable":
                # Named, and left where it is (a Maildir's new/) for the operator to look at.
                totals["problems"].append(f"{item.source}: unreadable ({result.detail}); left where it is")
                out.problem(f"senddock: {item.source}: unreadable: {result.detail}")
                continue
            if result.hooks_failed:
                totals["problems"].append(f"{item.source}: on_bounced failed; ingest it again later")
                continue
            if item.done is not None:
                item.done()  # a Maildir message is filed under cur/ only once applied
    out.result(totals, lambda: _ingest_summary(totals))
    return EXIT_PROBLEMS if totals["problems"] else EXIT_OK


def _ingest_summary(totals: dict[str, Any]) -> str:
    from senddock.domain.mail_events import OUTCOMES

    counted = ", ".join(f"{totals[o]} {o.replace('_', ' ')}" for o in OUTCOMES if totals[o])
    return (f"{plural(totals['messages'], 'message')}: {counted or 'none'}; "
            f"{plural(totals['suppressed'], 'address', 'addresses')} suppressed"
            + (f", {totals['replayed']} read before" if totals["replayed"] else "")
            + (f", {plural(len(totals['problems']), 'problem')}" if totals["problems"] else ""))


def parse(args: argparse.Namespace, out: Output) -> int:
    from senddock.bounces.parsing import parse_mail
    from senddock.bounces.sources import SourceError, read_paths

    config = open_config(args)
    limit = config.bounces.max_message_size
    rows: list[dict[str, Any]] = []
    forged: dict[str, str | None] = {}  # shown in the table; the JSON lines keep issue 15's six keys
    problems = 0
    for item in read_paths(args.paths, limit):
        if isinstance(item, SourceError):
            problems += 1
            out.problem(f"senddock: {item}")
            continue
        parsed = parse_mail(config, item.raw)
        rows.append(line := _line(item.source, parsed))
        forged[item.source] = parsed.match.forged if parsed.match.job is None else None
        if out.json_mode:
            # The interface scripts rely on (issue 15): one object per message, as it is read.
            out.stdout.write(json.dumps(line) + "\n")
            out.stdout.flush()
    if not out.json_mode:
        out.result(None, lambda: _table(rows, forged, problems))
    return EXIT_PROBLEMS if problems else EXIT_OK


def _line(source: str, parsed) -> dict[str, Any]:
    report, job = parsed.report, parsed.match.job
    return {
        "source": source,
        "kind": report.kind.value,
        "recipients": list(report.recipients),
        "status": report.status,
        "reason": report.reason,
        "job": None if job is None else {"broadcast_id": job.broadcast_id, "job_id": job.job_id},
    }


def _table(rows: list[dict[str, Any]], forged: dict[str, str | None], problems: int) -> str:
    body = table(["source", "kind", "recipients", "status", "job", "reason"], [
        (r["source"], r["kind"], r["recipients"], r["status"],
         f"{r['job']['broadcast_id']}.{r['job']['job_id']}" if r["job"] else ("FORGED" if forged[r["source"]] else None),
         (r["reason"] or "")[:60] or None) for r in rows])
    summary = f"{plural(len(rows), 'message')} read" + (f", {plural(problems, 'path')} unreadable" if problems else "")
    return f"{body}\n{summary}" if rows else summary
