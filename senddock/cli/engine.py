"""Commands around the sending engine: run, sink, campaign resume."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

import structlog

from senddock.cli.commands import open_config, open_senddock
from senddock.cli.output import Output
from senddock.core.runner import Runner
from senddock.errors import EXIT_OK, UsageError
from senddock.sink import FailRule, Received, Sink

log = structlog.get_logger(__name__)


def run(args: argparse.Namespace, out: Output) -> int:
    config = open_config(args)
    with open_senddock(args) as sd:
        sd.ensure_schema()
    runner = Runner(config, workers=args.workers, node_name=args.node, exit_when_idle=args.exit_when_idle)
    _stop_on_signals(runner.request_stop)
    summary = runner.run()
    out.result(summary, lambda: "stopped: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.items())))
    return EXIT_OK


def _stop_on_signals(stop) -> None:
    def handler(signum, frame):  # noqa: ARG001
        log.info("stop_requested", signal=signal.Signals(signum).name)
        stop()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def campaign_resume(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        sd.resume_campaign(args.id)
        status = sd.campaign_status(args.id)
    out.result(status.as_dict(), f"campaign {args.id}: resumed ({status.pending + status.retry} jobs to go)")
    return EXIT_OK


def sink(args: argparse.Namespace, out: Output) -> int:
    try:
        rules = [FailRule.parse(text) for text in args.fail]
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    def show(message: Received) -> None:
        line = f"{' '.join(message.recipients)}  {message.message_id}  {message.subject}"
        out.problem(line) if out.json_mode else print(line, flush=True)

    try:
        server = Sink(args.host, args.port, rules=rules, save_dir=Path(args.save) if args.save else None,
                      on_message=show)
        server.start()
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    stop = threading.Event()
    _stop_on_signals(stop.set)
    out.problem(f"senddock sink listening on {args.host}:{server.port} (Ctrl-C to stop)")
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    out.result({"received": len(server.received)}, f"received {len(server.received)} messages")
    return EXIT_OK


def add_commands(sub, camp, command, positive_int) -> None:
    p = command(sub, "run", run, "send: drain due jobs with worker threads until stopped")
    p.add_argument("--workers", type=int, metavar="N", help="worker threads (default: config workers)")
    p.add_argument("--node", metavar="NAME", help="stable node name (default: config node.name, then host name)")
    p.add_argument("--exit-when-idle", action="store_true", help="exit once nothing is due or in flight")

    p = command(sub, "sink", sink, "a development SMTP server that prints (and can save) what it receives")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=1025)
    p.add_argument("--save", metavar="DIR", help="save each message as an .eml file")
    p.add_argument("--fail", action="append", default=[], metavar="PATTERN=REPLY",
                   help="answer matching recipients, e.g. 'bounce*@*=550 5.1.1 no such user' "
                        "(prefix mail: to match the sender at MAIL FROM, data: to refuse at DATA)")

    command(camp, "resume", campaign_resume, "resume a paused campaign").add_argument(
        "id", type=positive_int, metavar="ID")
