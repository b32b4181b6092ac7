"""Controlling a campaign in flight: pause, resume, requeue, cancel, unsuppress, its rate; its history."""

from __future__ import annotations

import argparse

from senddock.cli import argtypes
from senddock.cli.commands import BURST_HELP, open_senddock, rate_words
from senddock.cli.output import Output, plural, table
from senddock.errors import EXIT_OK


def add_commands(camp, command, positive_int, positive_count) -> None:
    command(camp, "pause", campaign_pause, "stop sending a campaign (in-flight sends finish); resume continues it"
            ).add_argument("id", type=positive_int, metavar="ID")
    command(camp, "resume", campaign_resume, "continue a paused campaign from where it stopped").add_argument(
        "id", type=positive_int, metavar="ID")
    p = command(camp, "requeue", campaign_requeue,
                "after fixing a sending problem, put the jobs that failed for REASON back in line")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--reason", required=True, metavar="REASON",
                   help="a failure reason from `campaign status` (never bounced, complained, unsubscribed, suppressed)")
    command(camp, "cancel", campaign_cancel, "fail every unsent job of a campaign as cancelled").add_argument(
        "id", type=positive_int, metavar="ID")
    p = command(camp, "unsuppress", campaign_unsuppress,
                "undo the suppressions a campaign's bounces made and put their jobs back in line")
    p.add_argument("id", type=positive_int, metavar="ID")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--since-pause", action="store_true",
                       help="those of the results that tripped its bounce-rate breaker, and after")
    which.add_argument("--all", action="store_true", help="every suppression its bounces made")
    p = command(camp, "set-rate", campaign_set_rate,
                "give a campaign its own rate, or none; on a sending one every node applies it from its next claim")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("rate", type=argtypes.send_rate, metavar="RATE",
                   help="N/s, N/min, N/h or N/day (e.g. 100/min), all nodes together; none removes it")
    p.add_argument("--burst", type=argtypes.burst, metavar="N", help=BURST_HELP)
    p.set_defaults(words={"rate": "RATE"})
    p = command(camp, "history", campaign_history,
                "a campaign's status changes, newest first: every pause with its reason, resume, finish")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--limit", type=positive_count, default=20, metavar="N", help="at most N changes (default 20)")


def _status_line(sd, campaign_id: int, what: str, out: Output) -> int:
    status = sd.campaign_status(campaign_id)
    out.result(status.as_dict(), f"campaign {campaign_id}: {what}; now {status.status}: {status.sent} sent, "
                                 f"{status.failed} failed, {status.pending + status.retry + status.sending} to go")
    return EXIT_OK


def campaign_pause(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        sd.pause_campaign(args.id)
        return _status_line(sd, args.id, "paused (sends in flight finish)", out)


def campaign_resume(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        sd.resume_campaign(args.id)
        campaign = sd.campaign(args.id)
        if campaign.status != "scheduled" or campaign.send_at is None:
            return _status_line(sd, args.id, "resumed", out)
        status = sd.campaign_status(args.id)
    # Paused before its time: it waits for that time again, nothing is sent before.
    when = campaign.send_at.astimezone().isoformat(timespec="seconds")
    out.result({**status.as_dict(), "send_at": campaign.send_at},
               f"campaign {args.id}: resumed; scheduled for {when}: {plural(status.pending, 'recipient')} "
               "enqueued, nothing is sent before then")
    return EXIT_OK


def campaign_requeue(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        count = sd.requeue_campaign(args.id, args.reason)
        return _status_line(sd, args.id, f"requeued {plural(count, 'job')} that failed as {args.reason}", out)


def campaign_cancel(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        count = sd.cancel_campaign(args.id)
        return _status_line(sd, args.id, f"cancelled, {plural(count, 'unsent job')} failed as cancelled", out)


def campaign_unsuppress(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        done = sd.unsuppress_campaign(args.id, since_pause=args.since_pause)
        paused = sd.campaign_status(args.id).status == "paused"
        what = (f"{plural(done.unsuppressed, 'address', 'addresses')} unsuppressed, "
                f"{plural(done.requeued, 'job')} back in line" + ("; `campaign resume` sends them" if paused else ""))
        return _status_line(sd, args.id, what, out)


# When a new rate starts to count, by the campaign's status.
_APPLIES = {"sending": "every node applies it from its next claim", "paused": "it applies once resumed",
            "scheduled": "it applies from its send time", "draft": "it applies once sent"}


def campaign_set_rate(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        done = sd.set_campaign_rate(args.id, args.rate, burst=args.burst)
    shown = done.as_dict()
    now = (f"rate {rate_words(shown['rate'])}" if done.rate else "no rate of its own (the config's pacing still holds)")
    out.result(shown, f"campaign {args.id} ({done.status}): {now}, was {rate_words(shown['previous_rate'])}; "
                      f"{_APPLIES[done.status]}")
    return EXIT_OK


def campaign_history(args: argparse.Namespace, out: Output) -> int:
    from senddock.domain.campaign_control import actor_words  # psycopg with it: not to parse argv

    with open_senddock(args) as sd:
        changes = sd.campaign_history(args.id, args.limit)

    def human() -> str:
        if not changes:
            return f"campaign {args.id}: still a draft, no status change yet"
        return table(["at", "from", "to", "reason", "by"],
                     [[f"{c.at:%Y-%m-%d %H:%M:%S%z}", c.from_status or "-", c.to_status,
                       (c.reason or "") + (" (resumes by itself)" if c.auto_resume else ""), actor_words(c.actor)]
                      for c in changes])

    out.result({"campaign_id": args.id, "changes": [c.as_dict() for c in changes]}, human)
    return EXIT_OK
