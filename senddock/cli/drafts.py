"""Fixing a campaign: campaign edit, clone, delete."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from senddock.cli.commands import _read_body, add_rate_options, open_senddock
from senddock.cli.output import Output, plural
from senddock.errors import EXIT_OK

if TYPE_CHECKING:
    from senddock.domain.drafts import Deleted, Edited


def add_commands(camp, command, positive_int) -> None:
    p = command(camp, "edit", campaign_edit,
                "change a draft campaign (checked as `campaign create` checks it); prints what changed")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--name")
    p.add_argument("--subject")
    p.add_argument("--from", dest="from_addr", metavar="ADDR")
    p.add_argument("--reply-to", metavar="ADDR", help="'' removes it")
    p.add_argument("--text", metavar="FILE", help="plain-text body")
    p.add_argument("--html", metavar="FILE", help="HTML body")
    p.add_argument("--list", action="append", metavar="NAME",
                   help="target list (repeatable): the given lists replace the campaign's")
    add_rate_options(p, none_removes=True)
    p = command(camp, "clone", campaign_clone,
                "a new draft with a campaign's content, rate and lists (any campaign, a sent one too); prints its id")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--name", help="the copy's name (default: NAME (copy))")
    p = command(camp, "delete", campaign_delete,
                "delete a draft or scheduled campaign (--force: a cancelled or finished one, with its history)")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--force", action="store_true",
                   help="also a cancelled or finished campaign: its broadcast, jobs and delivery log go "
                        "(never the suppressions it caused)")


def campaign_edit(args: argparse.Namespace, out: Output) -> int:
    given = {"name": args.name, "subject": args.subject, "from": args.from_addr, "reply_to": args.reply_to,
             "text": _read_body(args.text, "--text"), "html": _read_body(args.html, "--html"), "lists": args.list,
             "rate": args.rate, "burst": args.burst}
    changes = {k: v for k, v in given.items() if v is not None}
    with open_senddock(args) as sd:
        edited = sd.edit_campaign(args.id, **changes)
    out.result({"id": edited.campaign_id, "changed": edited.changed}, lambda: _edit_lines(edited))
    return EXIT_OK


def _edit_lines(edited: Edited) -> str:
    from senddock.domain.drafts import _DRAFT_FIELD

    if not edited.changed:
        return f"campaign {edited.campaign_id}: nothing changed (it already had that content)"
    lines = [f"campaign {edited.campaign_id}: changed {', '.join(edited.changed)}"]
    for key in edited.changed:
        old, new = (getattr(d, _DRAFT_FIELD[key]) for d in (edited.before, edited.after))
        if key in ("text", "html"):
            lines.append(f"  {key}: {_size(old)} -> {_size(new)}")
        elif key == "lists":
            lines.append(f"  lists: {', '.join(old) or '-'} -> {', '.join(new)}")
        elif key == "rate":
            lines.append(f"  rate: {old or 'none'} -> {new or 'none'}")
        else:
            lines.append(f"  {key.replace('_', '-')}: {_value(old)} -> {_value(new)}")
    return "\n".join(lines)


def _value(value: str | None) -> str:
    return "none" if value is None else repr(value)


def _size(body: str | None) -> str:
    if body is None:
        return "none"
    return plural(len(body.splitlines()), "line")


def campaign_clone(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        new_id = sd.clone_campaign(args.id, name=args.name)
    # The id alone, as `campaign create` prints it: `id=$(senddock campaign clone 3)` works.
    out.result({"id": new_id, "cloned_from": args.id}, str(new_id))
    return EXIT_OK


def campaign_delete(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        deleted = sd.delete_campaign(args.id, force=args.force)
    out.result(deleted, lambda: _delete_line(deleted))
    return EXIT_OK


def _delete_line(d: Deleted) -> str:
    line = f"deleted campaign {d.id} ({d.status})"
    if d.broadcast_id is None:
        return line
    # What a person knows of a campaign; the internal tables (claim floors) are in --json only.
    line += (f": broadcast {d.broadcast_id}, {plural(d.jobs, 'job')}, "
             f"{plural(d.delivery_attempts, 'delivery attempt')}, {plural(d.delivery_events, 'provider event')}, "
             f"{plural(d.campaign_events, 'status change')}")
    if d.suppressions_kept:
        line += f"; kept the {plural(d.suppressions_kept, 'suppression')} its bounces made"
    return line
