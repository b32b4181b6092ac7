"""Commands around the sending engine: run, sink, demo."""

from __future__ import annotations

import argparse
import signal
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from senddock.cli import argtypes
from senddock.cli.commands import open_config, open_senddock
from senddock.cli.output import Output, plural
from senddock.durations import parse_duration
from senddock.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from senddock.sink import Received


def run(args: argparse.Namespace, out: Output) -> int:
    from senddock.core.runner import Runner  # the engine: imported by the command that runs it

    config = open_config(args)
    with open_senddock(args) as sd:
        sd.ensure_schema()
    runner = Runner(config, concurrency=args.concurrency, node_name=args.node, exit_when_idle=args.exit_when_idle)
    stop_on_signals(runner.request_stop)
    summary = runner.run()
    out.result(summary, lambda: "stopped: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.items())))
    return EXIT_OK


def stop_on_signals(stop) -> None:
    # Only set a flag here: a handler that logs could deadlock on a lock the interrupted main
    # thread holds (the log buffer's).
    def handler(signum, frame):  # noqa: ARG001
        stop()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def sink(args: argparse.Namespace, out: Output) -> int:
    from senddock.sink import FailRule, RateRule, Sink  # aiosmtpd, asyncio: only for the sink

    try:
        rules = [FailRule.parse(text) for text in args.fail]
        limit = RateRule.parse(args.limit) if args.limit else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    def show(message: Received) -> None:
        # The time first (UTC, milliseconds): a relay's rate is read from this log (bench/paced_nodes.py).
        at = datetime.fromtimestamp(message.at, timezone.utc).isoformat(timespec="milliseconds")
        line = f"{at}  {' '.join(message.recipients)}  {message.message_id}  {message.subject}"
        out.problem(line) if out.json_mode else print(line, flush=True)

    # The port the config's nodes send to, unless told: a sink on 1025 while smtp.port said
    # 2525 received nothing, and the nodes failed every send.
    port, where = (args.port, "--port") if args.port is not None else (_config_smtp_port(args), "smtp.port")
    try:
        server = Sink(args.host, port, rules=rules, limit=limit, delay=args.delay,
                      save_dir=Path(args.save) if args.save else None, on_message=show)
        server.start()
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{port} ({where}): {exc.strerror or exc}") from None
    stop = threading.Event()
    stop_on_signals(stop.set)
    out.problem(f"senddock sink listening on {args.host}:{server.port} (Ctrl-C to stop)")
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    received = server.received
    # connections: how many SMTP sessions delivered them (a pooling client's count shows here).
    limited = len(server.handler.limited)
    out.result({"received": len(received), "connections": len({m.peer for m in received}), "limited": limited},
               f"received {plural(len(received), 'message')}"
               + (f"; {plural(limited, 'recipient')} refused over --limit" if limit else ""))
    return EXIT_OK


def _config_smtp_port(args: argparse.Namespace) -> int:
    return int(open_config(args).section("smtp")["port"])


def demo(args: argparse.Namespace, out: Output) -> int:
    from senddock.cli.logs import configure_logging
    from senddock.demo import run_demo

    configure_logging("error")  # the demo tells its own story; the engine's log lines would drown it
    show = out.problem if out.json_mode else (lambda line: print(line, flush=True))
    bar = None
    if out.interactive:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn())
    if bar is None:
        summary = run_demo(crash=args.crash, show=show, progress=None)
    else:
        with bar:
            task = bar.add_task("sending", total=None)
            summary = run_demo(crash=args.crash, show=bar.console.print,
                               progress=lambda done, total: bar.update(task, completed=done, total=total))

    def human() -> str:
        lines = [
            f"campaign {summary['campaign_id']} {summary['status']} in {summary['seconds']}s:",
            f"  sent        {summary['sent']} of {summary['recipients']}",
            f"  retried     {summary['retried']} (deferred once by the server, then sent)",
            f"  bounced     {summary['bounced']} (mailbox does not exist)",
            f"  suppressed  {summary['suppressed']} (later campaigns skip them)",
            f"  duplicates  {summary['duplicates']} at the SMTP server by Message-ID",
        ]
        if summary["crashed"]:
            lines.append(f"  in doubt    {summary['in_doubt']} (their send may have begun when the process died; "
                         f"duplicates among them: {summary['duplicates_explained_by_in_doubt']} of "
                         f"{summary['duplicates']})")
        return "\n".join(lines)

    out.result(summary, human)
    ok = summary["status"] == "finished" and summary["duplicates"] == summary["duplicates_explained_by_in_doubt"]
    return EXIT_OK if ok else 1


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_commands(sub, camp, command, positive_int) -> None:
    p = command(sub, "demo", demo, "a whole broadcast on a throw-away embedded Postgres and SMTP sink")
    p.add_argument("--crash", action="store_true", help="kill -9 the sending process mid-broadcast and restart it")

    p = command(sub, "run", run, "send: drain due jobs, many sends in flight, until stopped")
    p.add_argument("--concurrency", "--workers", dest="concurrency", type=argtypes.concurrency_count, metavar="N",
                   help="sends in flight (default: config concurrency, 50); --workers is its former name")
    p.add_argument("--node", type=argtypes.node_name, metavar="NAME", help="stable node name (default: config node.name, then host name)")
    p.add_argument("--exit-when-idle", action="store_true", help="exit once nothing is due or in flight")

    p = command(sub, "sink", sink, "a development SMTP server that prints (and can save) what it receives")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=argtypes.port, help="default: the config's smtp.port (1025 without one)")
    p.add_argument("--save", metavar="DIR", help="save each message as an .eml file")
    p.add_argument("--delay", type=_duration, default=0.0, metavar="DURATION",
                   help="wait this long before accepting each message, as a real relay does (e.g. 50ms)")
    p.add_argument("--fail", action="append", default=[], metavar="PATTERN=REPLY",
                   help="answer matching recipients, e.g. 'bounce*@*=550 5.1.1 no such user' "
                        "(prefix mail: to match the sender at MAIL FROM, data: to refuse at DATA); "
                        "PATTERN xN=REPLY answers each address only its first N times, then accepts it: "
                        "'later*@* x2=450 4.2.0 mailbox busy' is a deferral that delivers on the third try")
    p.add_argument("--limit", metavar="RATE=REPLY",
                   help="answer recipients beyond RATE with REPLY, as a provider that throttles: "
                        "e.g. '5/s=421 4.7.28 Our system has detected an unusual rate' (a second's worth at once)")

