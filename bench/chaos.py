"""The chaos suite: faults injected into real broadcasts, and what the relay received afterwards.

    python bench/chaos.py [--recipients 5000] [--kills 20] [--scenarios kills,pg-crash,...] [--concurrency 2] [--json]

Each scenario sends one broadcast (--recipients readers, campaign 1 of its own database) through
two `senddock run` processes (--concurrency sends in flight each: the config's `concurrency`, or
`workers` on an install whose schema has no `concurrency` yet; --workers is the same option) to an in-process SMTP sink with --delay of latency
per message, and injects its fault mid-broadcast:

  kills          --kills `kill -9` in total, alternating nodes, each node restarted at once under
                 its name; every kill lands on an incarnation that is sending
  pg-crash       a Postgres crash-restart (SIGKILL of one backend) at 40% sent
  pg-restart     a fast shutdown and restart of Postgres at 40% sent
  smtp-outage    the relay gone for --outage seconds at 30% sent, back on the same port; nobody
                 touches the campaign: it must resume by itself
  relay-refusal  at 30% sent the relay refuses every recipient with "550 Requested action not
                 taken: mailbox unavailable" (no enhanced code); once the campaign pauses, the
                 harness plays the operator: fixes the relay, `campaign requeue ID --reason R` for
                 each failure reason, `campaign resume ID`
  failover       on a primary and an asynchronous streaming standby of its own (pg_basebackup -R;
                 nodes on a multi-host DSN, target_session_attrs=read-write, lease 15s): at 50%
                 sent the primary's walsenders are stopped for --lag seconds, then every process
                 of the primary is killed, and the standby is promoted --promote-after seconds
                 later; both nodes live on

Always on a throw-away embedded Postgres that the script starts and stops (a crash or restart of
Postgres is part of the suite; failover makes its own pair), never on a configured server: there
is no --dsn.

One table: delivered (distinct recipients the relay received), dropped (recipients it never
received once the campaign finished, or gave up: no progress for --resume-timeout seconds),
duplicates (recipients received more than once), how many of those `senddock campaign log 1
--in-doubt --json` lists, suppressed wrongly (suppressions of addresses the relay accepts), and
the time to resume: for kills the median from a node's restart to the first message that
incarnation sends, otherwise from the fault's end (Postgres answering again, the relay back, the
operator's resume) to the relay's next message.

A scenario passes when nothing is dropped, every duplicate is listed as in doubt, there are at
most one duplicate per worker per kill (kills x workers; for the outage one per worker in flight;
none for Postgres faults or the refusal), and no address is suppressed (for the refusal: not more
than the breaker's window, 2 nodes x (transport.max_consecutive_failures + workers)). Exit status 0
when every scenario passes, 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from senddock.chaos import SCENARIOS, Options, format_table, run_chaos
from senddock.cli.logs import configure_logging


def _scenarios(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown scenario {', '.join(unknown) or '(none)'}; "
                                         f"choose from {', '.join(SCENARIOS)}")
    return names


def main() -> int:
    defaults = Options()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipients", type=int, default=defaults.recipients)
    parser.add_argument("--kills", type=int, default=defaults.kills, help="kill -9 in the kills scenario")
    parser.add_argument("--scenarios", type=_scenarios, default=list(SCENARIOS), metavar="A,B,...",
                        help=f"which to run, in this order (default: {','.join(SCENARIOS)})")
    parser.add_argument("--concurrency", "--workers", dest="workers", type=int, default=defaults.workers,
                        help="sends in flight per node (config concurrency; workers before issue 14's engine)")
    parser.add_argument("--outage", type=float, default=defaults.outage, metavar="SECONDS",
                        help="how long the relay is gone in smtp-outage")
    parser.add_argument("--delay", type=float, default=defaults.delay, metavar="SECONDS",
                        help="the relay's latency per message")
    parser.add_argument("--resume-timeout", type=float, default=defaults.resume_timeout, metavar="SECONDS",
                        help="give a scenario up after this long without progress (a paused campaign included)")
    parser.add_argument("--lag", type=float, default=defaults.lag, metavar="SECONDS",
                        help="failover: how long the primary's walsenders are stopped before it dies")
    parser.add_argument("--promote-after", type=float, default=defaults.promote_after, metavar="SECONDS",
                        help="failover: from the primary's death to the standby's promotion")
    parser.add_argument("--logs", type=Path, metavar="DIR", help="keep each scenario's node logs and config here")
    parser.add_argument("--json", action="store_true", help="exactly one JSON object on stdout")
    args = parser.parse_args()
    options = Options(recipients=args.recipients, kills=args.kills, workers=args.workers, outage=args.outage,
                      delay=args.delay, resume_timeout=args.resume_timeout, lag=args.lag,
                      promote_after=args.promote_after)
    # senddock's own log lines in this process (migrations) go to stderr, never among the results.
    configure_logging("warning", "json")
    # SIGTERM unwinds like Ctrl-C: the nodes, the relay and the throw-away Postgres are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else \
        (lambda line: print(line, flush=True))
    try:
        rows = run_chaos(options, args.scenarios, logs=args.logs, say=say)
    except KeyboardInterrupt:
        print("interrupted: the nodes, the relay and the throw-away Postgres are stopped", file=sys.stderr)
        return 130
    passed = all(r.passed for r in rows)
    if args.json:
        print(json.dumps({"benchmark": "chaos", "passed": passed,
                          "options": {k: getattr(options, k) for k in ("recipients", "kills", "workers", "outage",
                                                                       "delay", "resume_timeout", "breaker", "lag",
                                                                       "promote_after")},
                          "scenarios": [r.as_dict() for r in rows]}))
    else:
        print()
        print(format_table(rows))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
