"""Addresses: the suppression list, subscribers' status, and where a campaign's mail went."""

from __future__ import annotations

import argparse
import csv
import sys

from senddock.cli.commands import fallback_note, open_senddock
from senddock.cli.output import Output, plural, table
from senddock.config.digest import short_digest
from senddock.csv_cells import csv_row
from senddock.csv_text import DEFAULT_ENCODING, check_encoding, decoded_lines
from senddock.errors import EXIT_OK, EXIT_PROBLEMS, InvalidInput
from senddock.mail.addresses import check_address
from senddock.outcome import SUPPRESSION_REASONS as REASONS

EXPORT_COLUMNS = ("email", "reason", "code", "diagnostic", "source_broadcast_id", "created_at")


def add_commands(supp, subs, camp, sub, command, positive_int) -> None:
    """``supp``: the ``suppressions`` group; ``subs``: ``subscribers``; ``camp``: ``campaign``."""
    p = command(supp, "ls", suppressions_ls, "list suppressed addresses")
    p.add_argument("--reason", choices=REASONS)
    p.add_argument("--search", metavar="TEXT", help="addresses containing TEXT")
    p = command(supp, "add", suppressions_add, "suppress addresses")
    p.add_argument("emails", nargs="+", metavar="ADDR")
    p.add_argument("--reason", choices=REASONS, default="manual")
    command(supp, "remove", suppressions_remove,
            "unsuppress addresses (future campaigns only: nothing already failed is resent)").add_argument(
        "emails", nargs="+", metavar="ADDR")
    p = command(supp, "import", suppressions_import,
                "suppress the addresses of a CSV file (header: email, optional reason)")
    p.add_argument("file", metavar="FILE.csv")
    add_encoding_option(p)
    command(supp, "export", suppressions_export, "write the suppression list as CSV ('-' for stdout)").add_argument(
        "file", metavar="FILE.csv")

    command(subs, "unsubscribe", subscribers_unsubscribe, "unsubscribe an address (and suppress it)").add_argument(
        "email", metavar="ADDR")
    command(subs, "blocklist", subscribers_blocklist, "blocklist an address (and suppress it)").add_argument(
        "email", metavar="ADDR")
    command(subs, "ls", subscribers_ls, "list subscribers").add_argument("--list", metavar="NAME")
    command(subs, "show", subscribers_show, "a subscriber's lists, status and suppression with its cause"
            ).add_argument("email", metavar="ADDR")

    p = command(camp, "log", campaign_log, "the delivery log: every attempt with time, node, outcome and reply")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--email", metavar="ADDR")
    p.add_argument("--outcome", choices=["sent", "retry", "bounce", "fail", "pause", "in_doubt"])
    p.add_argument("--in-doubt", action="store_true",
                   help="only recipients who may have received two copies (a send interrupted by a crash, then sent)")
    command(sub, "nodes", nodes, "live and recently dead nodes, heartbeat age, jobs in flight")


def add_encoding_option(parser: argparse.ArgumentParser) -> None:
    """``--encoding NAME`` of a CSV file, checked as the command line is parsed (unknown: exit 2)."""

    def encoding(text: str) -> str:
        try:
            return check_encoding(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parser.add_argument("--encoding", type=encoding, default=DEFAULT_ENCODING, metavar="NAME",
                        help="the file's character set, e.g. cp1252 or latin-1 (default: utf-8; a byte order "
                             "mark at the start is skipped); utf-8,cp1252 reads each line as UTF-8 and a line "
                             "that is not as cp1252, naming it")



# -- suppressions ----------------------------------------------------------------------------------


def suppressions_ls(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        rows = sd.suppressions_list(reason=args.reason, search=args.search)
    out.result({"suppressions": rows}, lambda: table(
        ["email", "reason", "code", "since"], [[r["email"], r["reason"], r["code"], r["created_at"]] for r in rows]
    ) if rows else "no suppressed addresses")
    return EXIT_OK


def _checked(emails: list[str]) -> list[str]:
    checked = []
    for email in emails:
        try:
            checked.append(check_address(email))
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None  # before anything is applied
    return checked


def suppressions_add(args: argparse.Namespace, out: Output) -> int:
    emails = _checked(args.emails)
    with open_senddock(args) as sd:
        added = [e for e in emails if sd.suppress(e, reason=args.reason)]
    out.result({"added": added, "already": [e for e in emails if e not in added]},
               f"{len(added)} suppressed, {len(emails) - len(added)} already were")
    return EXIT_OK


def suppressions_remove(args: argparse.Namespace, out: Output) -> int:
    emails = _checked(args.emails)
    with open_senddock(args) as sd:
        removed = [e for e in emails if sd.unsuppress(e)]
    missing = [e for e in emails if e not in removed]
    for email in missing:
        out.problem(f"{email}: not suppressed")
    out.result({"removed": removed, "not_suppressed": missing}, f"{len(removed)} unsuppressed")
    return EXIT_PROBLEMS if missing else EXIT_OK


def suppressions_import(args: argparse.Namespace, out: Output) -> int:
    try:
        raw = open(args.file, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise InvalidInput(f"{args.file}: cannot read: {exc.strerror or exc}") from None
    rows, problems = [], []
    with raw:
        reader = csv.DictReader(decoded_lines(raw, args.encoding, args.file, fallback_note(args.file, args.encoding, out)))
        try:
            if not reader.fieldnames or "email" not in reader.fieldnames:
                raise InvalidInput(f"{args.file}:1: the header needs an 'email' column")
            for row in reader:
                line = reader.line_num
                reason = (row.get("reason") or "manual").strip()
                try:
                    email = check_address(row.get("email") or "")
                except ValueError as exc:
                    problems.append(f"{args.file}:{line}: {exc}")
                    continue
                if reason not in REASONS:
                    problems.append(f"{args.file}:{line}: reason {reason!r} is not one of {', '.join(REASONS)}")
                    continue
                rows.append((email, reason))
        except csv.Error as exc:
            raise InvalidInput(f"{args.file}:{reader.line_num}: {exc}") from None
    with open_senddock(args) as sd:
        added = sum(sd.suppress(email, reason=reason) for email, reason in rows)
    for problem in problems:
        out.problem(problem)
    out.result({"added": added, "already": len(rows) - added, "rejected": len(problems)},
               f"{added} suppressed, {len(rows) - added} already were, {plural(len(problems), 'row')} rejected")
    return EXIT_PROBLEMS if problems else EXIT_OK


def suppressions_export(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        rows = sd.suppressions_list()
    try:
        stream = sys.stdout if args.file == "-" else open(args.file, "w", encoding="utf-8", newline="")  # noqa: SIM115
    except OSError as exc:
        raise InvalidInput(f"{args.file}: cannot write: {exc.strerror}") from None
    try:
        writer = csv.writer(stream)
        writer.writerow(EXPORT_COLUMNS)
        for row in rows:
            writer.writerow(csv_row(row[c] for c in EXPORT_COLUMNS))
    finally:
        if stream is not sys.stdout:
            stream.close()
    if args.file != "-":
        out.result({"exported": len(rows), "file": args.file},
                   f"{plural(len(rows), 'address', 'addresses')} written to {args.file}")
    return EXIT_OK


# -- subscribers -----------------------------------------------------------------------------------


def subscribers_unsubscribe(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        status = sd.unsubscribe(args.email)
    out.result({"email": args.email, "status": status}, f"{args.email}: {status} and suppressed")
    return EXIT_OK


def subscribers_blocklist(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        sd.blocklist(args.email)
    out.result({"email": args.email, "status": "blocklisted"}, f"{args.email}: blocklisted and suppressed")
    return EXIT_OK


def subscribers_ls(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        rows = sd.subscribers(args.list)
    out.result({"subscribers": rows}, lambda: table(
        ["id", "email", "name", "status"], [[r["id"], r["email"], r["name"], r["status"]] for r in rows]
    ) if rows else "no subscribers")
    return EXIT_OK


def subscribers_show(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        found = sd.subscriber(args.email)

    def human() -> str:
        lines = [f"{found['email']} ({found['name'] or 'no name'}): {found['status']}",
                 f"lists: {', '.join(found['lists']) or 'none'}"]
        if found["suppressed_reason"]:
            lines.append(f"suppressed since {found['suppressed_at']}: {found['suppressed_reason']}"
                         + "".join(f", {v}" for v in (found["suppressed_code"], found["suppressed_diagnostic"]) if v))
        else:
            lines.append("not suppressed")
        return "\n".join(lines)

    out.result(found, human)
    return EXIT_OK


# -- where the mail went ---------------------------------------------------------------------------


def campaign_log(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        rows = sd.delivery_log(args.id, email=args.email, outcome=args.outcome, in_doubt=args.in_doubt)
        pruned_at = None if rows else sd.campaign_status(args.id).pruned_at
    if pruned_at is not None:
        out.result({"campaign_id": args.id, "attempts": [], "pruned_at": pruned_at},
                   f"campaign {args.id}'s per-recipient detail was pruned on {pruned_at:%Y-%m-%d} (retention); "
                   f"`senddock campaign status {args.id}` has its counts")
        return EXIT_OK
    if args.in_doubt:
        emails = sorted({r["email"] for r in rows})
        out.result({"campaign_id": args.id, "in_doubt": emails, "attempts": rows},
                   lambda: "\n".join(emails) if emails else "nobody may have received two copies")
        return EXIT_OK
    out.result({"campaign_id": args.id, "attempts": rows}, lambda: table(
        ["at", "email", "attempt", "node", "outcome", "code", "reply"],
        [[r["at"], r["email"], r["attempt"], r["node"],
          r["outcome"] + (f" ({r['reason']})" if r["reason"] and r["reason"] != "bounced" else "")
          + (" (in doubt)" if r["in_doubt"] else ""),
          " ".join(str(c) for c in (r["code"], r["enhanced_code"]) if c), (r["message"] or "")[:60]] for r in rows],
    ) if rows else "no attempts yet")
    return EXIT_OK


def nodes(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        rows = sd.nodes()
    out.result({"nodes": rows}, lambda: table(
        ["name", "host", "pid", "state", "heartbeat", "in flight", "started", "config"],
        [[r["name"], r["host"], r["pid"], "stopped" if r["stopped_at"] else ("alive" if r["alive"] else "dead"),
          f"{r['heartbeat_age']:.1f}s ago", r["in_flight"], r["started_at"], _config_cell(r)] for r in rows],
    ) if rows else "no nodes have run")
    return EXIT_OK


def _config_cell(row: dict) -> str:
    """The node's config digest, marked when it is not the digest of the config this command read."""
    shown = short_digest(row["config_digest"])
    return shown + " (differs)" if row["config_matches"] is False else shown
