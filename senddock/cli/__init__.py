"""The ``senddock`` command: parses argv, configures logging, turns errors into one clear line and an exit status.

Exit status: 0 ok, 1 the command ran but found problems in its input (rejected rows, an unknown id,
a wrong state), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from senddock import __version__
from senddock.cli import addresses, admin, argtypes, bounces, commands, control, drafts, engine, events, mail, retention, webhooks
from senddock.cli.logs import configure_logging, flush_logs
from senddock.cli.output import Output
from senddock.cli.words import FLAGS
from senddock.errors import (
    EXIT_PROBLEMS,
    EXIT_USAGE,
    ConfigError,
    SenddockError,
    error_line,
)
from senddock.redact import redact_text


_PROG = "senddock"


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors through the same channel as every other error.

    A subcommand's error names it (`senddock lists create: ...`); the top level's needs no name:
    the channel already says `senddock: error:`.
    """

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message if self.prog == _PROG else f"{self.prog}: {message}")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def, override]
        # argparse hands a command's unknown arguments up to the top level, whose error would not
        # say which command refused them: the command's own parser reports them.
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and "handler" in self._defaults:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._closest_option(extras)}")
        return namespace, extras

    def _closest_option(self, extras: list[str]) -> str:
        import difflib

        options = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
        for extra in extras:
            close = difflib.get_close_matches(extra.split("=", 1)[0], options, n=1) if extra.startswith("--") else []
            if close:
                return f" (did you mean {close[0]}?)"
        return ""


class _UsageError(Exception):
    pass


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (a positive whole number)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (a positive whole number)")
    return value


def _aware_time(text: str):
    from datetime import datetime

    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time (e.g. 2026-12-24T09:00:00+01:00)") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no zone: add one, e.g. +01:00 or Z")
    return value


def _template_variables_help() -> str:
    from senddock.mail.template_variables import VARIABLES

    width = max(len(name) for name, _ in VARIABLES)
    rows = "\n".join(f"  {name.ljust(width)}  {meaning}" for name, meaning in VARIABLES)
    return ("The subject and bodies are Jinja2 templates; they may use:\n" + rows + "\n"
            "Where a value may be missing or empty, give it a default:\n"
            "  {{ subscriber.attributes.city | default(\"your city\", true) }}\n"
            "(true: an empty CSV cell, stored as \"\", is replaced too; without it only a missing one is)")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: an option given before the subcommand is not reset by the subcommand's default.
    common.add_argument("-c", "--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="config file (default: $SENDDOCK_CONFIG, then config/senddock.yaml)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print exactly one JSON object on stdout")

    parser = _Parser(prog=_PROG, description="A crash-safe mailing pipeline on a Postgres queue.")
    parser.add_argument("--version", action="version", version=f"senddock {__version__}")
    parser.add_argument("-c", "--config", metavar="FILE", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", default=False, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(subparsers, name: str, handler, help_text: str) -> argparse.ArgumentParser:
        p = subparsers.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    p = command(sub, "check-config", commands.check_config, "validate the config file")
    p.add_argument("--show", action="store_true", help="print the effective config, secrets masked")
    command(sub, "plugins", commands.plugins, "list registered plugins, their hooks and the active transport")
    command(sub, "migrate", commands.migrate, "apply pending database migrations")
    command(sub, "status", commands.status,
            "pacing per limit: rate configured, effective (slowed down by throttling), measured over the last minute")

    lists = sub.add_parser("lists", help="mailing lists").add_subparsers(
        dest="subcommand", metavar="SUBCOMMAND", required=True, parser_class=_Parser)
    command(lists, "create", commands.lists_create, "create a list").add_argument("name")
    command(lists, "ls", commands.lists_ls, "show the lists and their member counts")

    subs = sub.add_parser("subscribers", help="subscribers").add_subparsers(
        dest="subcommand", metavar="SUBCOMMAND", required=True, parser_class=_Parser)
    p = command(subs, "import", commands.subscribers_import,
                "import a CSV file (header row: email, optional name, other columns become attributes)")
    p.add_argument("file", metavar="FILE.csv")
    p.add_argument("--list", required=True, metavar="NAME", help="list to add the subscribers to")
    addresses.add_encoding_option(p)

    camp = sub.add_parser("campaign", help="campaigns").add_subparsers(
        dest="subcommand", metavar="SUBCOMMAND", required=True, parser_class=_Parser)
    p = command(camp, "create", commands.campaign_create, "create a draft campaign; prints its id")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _template_variables_help()
    p.add_argument("--name", required=True)
    p.add_argument("--list", required=True, action="append", metavar="NAME", help="target list (repeatable)")
    p.add_argument("--subject", required=True)
    p.add_argument("--from", dest="from_addr", required=True, metavar="ADDR")
    p.add_argument("--reply-to", metavar="ADDR")
    p.add_argument("--text", metavar="FILE", help="plain-text body")
    p.add_argument("--html", metavar="FILE", help="HTML body")
    commands.add_rate_options(p)
    command(camp, "ls", commands.campaign_ls, "list campaigns")
    p = command(camp, "send", commands.campaign_send, "enqueue the campaign's broadcast")
    p.add_argument("id", type=_positive_int, metavar="ID")
    p.add_argument("--no-unsubscribe", action="store_true",
                   help="send even though no unsubscribe link is configured (no List-Unsubscribe header)")
    p.add_argument("--at", type=_aware_time, metavar="TIME",
                   help="send at this time (ISO 8601 with its zone, e.g. 2026-12-24T09:00:00+01:00); nothing "
                        "is claimed before then")
    p = command(camp, "status", commands.campaign_status, "counts of the campaign's broadcast")
    p.add_argument("id", type=_positive_int, metavar="ID")
    p.add_argument("--watch", action="store_true",
                   help="follow it until it is finished, paused or cancelled (a live view on a terminal)")
    p.add_argument("--interval", type=argtypes.refresh_interval, default=1.0, metavar="SECONDS", help=argparse.SUPPRESS)
    engine.add_commands(sub, camp, command, _positive_int)
    mail.add_commands(sub, camp, command, _positive_int)
    control.add_commands(camp, command, _positive_int, argtypes.positive_count)
    drafts.add_commands(camp, command, _positive_int)
    supp = sub.add_parser("suppressions", help="the suppression list every campaign respects").add_subparsers(
        dest="subcommand", metavar="SUBCOMMAND", required=True, parser_class=_Parser)
    addresses.add_commands(supp, subs, camp, sub, command, _positive_int)
    events.add_commands(sub.add_parser("events", help="provider notifications").add_subparsers(
        dest="subcommand", metavar="SUBCOMMAND", required=True, parser_class=_Parser), command)
    bounces.add_commands(sub.add_parser("bounces", help="bounces, complaints and replies that come back by mail"
                                        ).add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True,
                                                         parser_class=_Parser), command)
    admin.add_commands(sub.add_parser("admin", help="the web dashboard's operator account").add_subparsers(
        dest="subcommand", metavar="SUBCOMMAND", required=True, parser_class=_Parser), command)
    retention.add_commands(sub, command, _positive_int)
    webhooks.add_commands(sub.add_parser("webhooks", help="outgoing webhooks: their endpoints and events"
                                         ).add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True,
                                                          parser_class=_Parser), command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    out = Output(json_mode="--json" in argv)
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        out.error(str(exc), EXIT_USAGE)
        return EXIT_USAGE
    out = Output(json_mode=args.json)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    _configure_logging_from(args)
    try:
        return _run(args, out)
    finally:
        flush_logs()


def _run(args: argparse.Namespace, out: Output) -> int:
    try:
        return args.handler(args, out)
    except ConfigError as exc:
        out.error(str(exc), exc.exit_code, exc.errors)
        return exc.exit_code
    except SenddockError as exc:
        # Values named as this command's flags (a command may name one its own way: set-rate's RATE).
        out.error(exc.worded({**FLAGS, **getattr(args, "words", {})}), exc.exit_code)
        return exc.exit_code
    except Exception as exc:
        # psycopg is imported by the commands that reach the database, not here: a database
        # error can only come from a command that loaded it.
        psycopg = sys.modules.get("psycopg")
        if psycopg is None or not isinstance(exc, psycopg.Error):
            raise
        if isinstance(exc, psycopg.OperationalError):
            out.error(f"database error: {error_line(exc, dsns=_dsns(args))}", EXIT_USAGE)
            return EXIT_USAGE
        if isinstance(exc, (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement)):
            # Only a pooler in transaction mode mixes up psycopg's prepared statements.
            out.error(f"database error: {error_line(exc)}: database.dsn goes through a pooler in transaction mode; "
                      "set database.pool_mode: transaction (and database.direct_dsn for `senddock run`)", EXIT_USAGE)
            return EXIT_USAGE
        out.error(f"database error: {redact_text(str(exc).strip(), _dsns(args))}", EXIT_PROBLEMS)
        return EXIT_PROBLEMS
    except KeyboardInterrupt:
        out.error("interrupted", 130)
        return 130


def _dsns(args: argparse.Namespace) -> list[str | None]:
    """The connection strings of the command's config, whose secrets no error may show."""
    config = getattr(args, "loaded_config", None)
    return [config.database.dsn, config.database.direct_dsn] if config is not None else []


def _configure_logging_from(args: argparse.Namespace) -> None:
    """Use the config's logging section when the config loads; its errors are reported by the command."""
    try:
        settings = commands.open_config(args).logging
        configure_logging(settings.level, settings.format)
    except SenddockError:
        configure_logging()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
