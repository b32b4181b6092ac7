"""`senddock prune`: per-recipient history past its retention goes, totals stay."""

from __future__ import annotations

import argparse

from senddock.cli.commands import open_senddock
from senddock.cli.output import Output
from senddock.errors import EXIT_OK
from senddock.wording import plural


def add_commands(sub, command, positive_int) -> None:
    p = command(sub, "prune", prune,
                "drop what the retention says is due: ended broadcasts' per-recipient rows (their campaigns keep "
                "their counts), old inbound mail records and status history")
    p.add_argument("--dry-run", action="store_true", help="say what would go, change nothing")
    p.add_argument("--campaign", type=positive_int, metavar="ID",
                   help="prune this ended campaign's detail now, whatever its age (e.g. to erase it)")


def prune(args: argparse.Namespace, out: Output) -> int:
    from senddock.store.retention import PruneReport  # psycopg: not for every command's start

    with open_senddock(args) as sd:
        if args.campaign is not None:
            one = sd.prune_campaign(args.campaign, dry_run=args.dry_run)
            result = PruneReport(dry_run=args.dry_run, pruned=[one]).as_dict()
        else:
            result = sd.prune(dry_run=args.dry_run).as_dict()
    out.result(result, lambda: _human(result))
    return EXIT_OK


def _human(result: dict) -> str:
    verb = "would prune" if result["dry_run"] else "pruned"
    lines = [f"{verb} campaign {p['campaign_id']} ({p['name']}): "
             + ", ".join(f"{plural(n, 'row')} of {table}" for table, n in p["rows"].items() if n)
             + f"; {_megabytes(p['bytes_returned'])} of disk" for p in result["pruned"]]
    lines += [f"left for later: campaign {s['campaign_id']}: {s['reason']}" for s in result["skipped"]]
    gone = ", ".join(f"{plural(n, 'row')} of {table}" for table, n in result["expired"].items() if n)
    if gone:
        lines.append(f"{'would expire' if result['dry_run'] else 'expired'} by age: {gone}")
    return "\n".join(lines) or "nothing is due"


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"
