"""Commands about the message itself: campaign preview, send-test, and serve (unsubscribe links)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Iterator

from senddock.cli import argtypes
from senddock.cli.commands import open_config, open_senddock
from senddock.cli.output import Output
from senddock.errors import EXIT_OK, EXIT_PROBLEMS, UsageError
from senddock.mail.addresses import check_address


def add_commands(sub, camp, command, positive_int) -> None:
    p = command(camp, "preview", campaign_preview,
                "print the campaign's message, rendered and signed for one subscriber")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--email", metavar="ADDR", help="the subscriber to render for (default: the first one it reaches)")
    p.add_argument("--raw", action="store_true", help="print the message exactly as sent (MIME source)")

    p = command(sub, "send-test", send_test,
                "render the campaign and send it to one address now, through the configured transport")
    p.add_argument("--campaign", type=positive_int, required=True, metavar="ID")
    p.add_argument("--to", required=True, metavar="ADDR", help="the one address to send to")
    p.add_argument("--email", metavar="ADDR", help="render with this subscriber's data (default: the first one)")

    p = command(sub, "serve", serve, "answer unsubscribe links (RFC 8058 one-click) over HTTP")
    p.add_argument("--host", help="default: serve.host (127.0.0.1)")
    p.add_argument("--port", type=argtypes.port, help="default: serve.port (8025)")


def _parts(data: bytes) -> tuple[dict[str, str], list[dict[str, str]]]:
    from email import message_from_bytes
    from email.policy import default as default_policy

    parsed = message_from_bytes(data, policy=default_policy)
    headers = {name: str(value) for name, value in parsed.items()}
    parts = [{"content_type": part.get_content_type(), "body": part.get_content().replace("\r\n", "\n")}
             for part in parsed.walk() if not part.is_multipart()]
    return headers, parts


def campaign_preview(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        message, data = sd.preview(args.id, email=args.email)
    headers, parts = _parts(data)

    def human() -> str:
        if args.raw:
            return data.decode("ascii", "replace").replace("\r\n", "\n")
        lines = [f"{name}: {value}" for name, value in headers.items()]
        for part in parts:
            lines += ["", f"--- {part['content_type']} ---", part["body"].rstrip("\n")]
        return "\n".join(lines)

    out.result({"campaign_id": args.id, "recipient": message.recipient.email, "headers": headers, "parts": parts,
                "raw": data.decode("ascii", "replace")}, human)
    return EXIT_OK


def _one_address(option: str, value: str) -> str:
    """``value`` checked as an import checks an address; a usage error naming ``option`` otherwise.

    send-test sends to one recipient: a list such as ``a@x.com, b@y.com`` is said to be one, not
    merely an invalid address."""
    if value.count("@") > 1 and any(sep in value for sep in ",;"):
        raise UsageError(f"{option}: one recipient only, not a list: {value!r}")
    try:
        return check_address(value)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def send_test(args: argparse.Namespace, out: Output) -> int:
    # Checked before the database is touched: a bad address is a usage error, like a bad option.
    args.to = _one_address("--to", args.to)
    email = _one_address("--email", args.email) if args.email is not None else None
    with open_senddock(args) as sd:
        message, result, verdict = sd.send_test(args.campaign, args.to, email=email)
    reply = " ".join(str(p) for p in (result.code, result.enhanced_code, result.text) if p)
    payload = {
        "campaign_id": args.campaign, "to": args.to, "message_id": message.message_id, "sent": result.ok,
        "transport": result.transport, "phase": result.phase, "code": result.code,
        "enhanced_code": result.enhanced_code, "text": result.text,
        "outcome": verdict.outcome.value, "reason": verdict.reason,
    }
    if result.ok:
        out.result(payload, f"sent to {args.to} via {result.transport}: {reply or 'accepted'}")
        return EXIT_OK
    out.result(payload, f"not sent to {args.to} via {result.transport} ({result.phase}): {reply}\n"
                        f"classified: {verdict.outcome.value} ({verdict.reason})")
    return EXIT_PROBLEMS


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """SIGTERM and Ctrl-C stop it gracefully and the command exits 0, like `senddock run`
        (uvicorn itself re-raises the signal after shutting down)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def _bounce_receiver(args: argparse.Namespace, config):
    """`bounces receive` inside serve, when bounces.receive.in_serve says so; None otherwise."""
    if not config.bounces.receive.in_serve:
        return None
    import structlog

    from senddock.bounces.receiver import start_receiver

    sd = open_senddock(args)
    try:
        receiver = start_receiver(config, sd.apply_mail)
    except UsageError:
        sd.close()
        raise
    structlog.get_logger(__name__).info("bounce_receiver_started",
                                        listen=f"{receiver.settings.host}:{receiver.port}")
    receiver.on_stop = sd.close
    return receiver


def serve(args: argparse.Namespace, out: Output) -> int:
    import structlog
    import uvicorn

    log = structlog.get_logger(__name__)
    _Server = _server_class()

    from senddock.store.db import Database
    from senddock.web.http_limits import HttpLimits
    from senddock.web.serve import create_app

    config = open_config(args)
    settings = config.serve
    with open_senddock(args) as sd:
        sd.ensure_schema()
    receiver = _bounce_receiver(args, config)
    db = Database(config.database, application_name="senddock-serve")
    app = create_app(config, db)
    host, port = args.host or settings.host, args.port or settings.port
    tls = {}
    if settings.tls_cert_file:
        tls = {"ssl_certfile": str(config.folder / settings.tls_cert_file),
               "ssl_keyfile": str(config.folder / settings.tls_key_file)}
    log.info("serve_started", host=host, port=port, tls=bool(tls))
    limits = HttpLimits.from_settings(settings)
    # access_log off: request paths carry unsubscribe tokens.
    server = _Server(uvicorn.Config(app, host=host, port=port, access_log=False, log_config=None,
                                    **limits.uvicorn_options(), **tls))
    try:
        server.run()
    finally:
        db.close()
        if receiver is not None:
            receiver.stop()
    if not server.started:
        raise UsageError(f"cannot serve on {host}:{port} (is the port taken?)")
    out.result({"stopped": True}, "stopped")
    return EXIT_OK
