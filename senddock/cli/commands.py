"""Handlers of the operator commands: each takes the parsed arguments and an Output, returns an exit status."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from senddock.cli import argtypes
from senddock.cli.output import Output, plural, table
from senddock.cli.status_lines import bounce_line, pacing_table, probe_line, warning_line
from senddock.config import Config, find_config_path
from senddock.loading import load_config
from senddock.errors import EXIT_OK, EXIT_PROBLEMS, ConfigError, InvalidInput

# The engine and its libraries (psycopg, Jinja2...) are imported by the commands that use them:
# `senddock --help` must not pay for them (see tests/unit/test_cli_imports.py).
if TYPE_CHECKING:
    from senddock.api import Senddock


def open_config(args: argparse.Namespace) -> Config:
    """The command's config, loaded once per invocation: a config given as a pipe (``-c /dev/stdin``)
    can be read only once, so its errors are kept too, never read again as an empty file."""
    if getattr(args, "loaded_config", None) is None:
        failed = getattr(args, "config_error", None)
        if failed is not None:
            raise failed
        try:
            args.loaded_config = load_config(find_config_path(args.config, os.environ))
        except ConfigError as exc:
            args.config_error = exc
            raise
    return args.loaded_config


def fallback_note(label: str, encoding: str, out: Output) -> Callable[[int], None]:
    """For ``--encoding A,B``: each line read in B is named on stderr (exit status unchanged: the
    operator asked for it, and should still look at those lines)."""
    primary, _, fallback = encoding.partition(",")

    def note(line: int) -> None:
        out.problem(f"{label}:{line}: not {primary.strip()} text, read as {fallback.strip()}")

    return note


def open_senddock(args: argparse.Namespace) -> Senddock:
    from senddock.api import Senddock

    return Senddock(open_config(args))


# -- configuration and plugins ---------------------------------------------------------------------


def check_config(args: argparse.Namespace, out: Output) -> int:
    path = find_config_path(args.config, os.environ)
    if path is None:
        raise ConfigError(["no config file: pass -c FILE, set SENDDOCK_CONFIG, or create config/senddock.yaml"])
    config = open_config(args)
    shown = config.redacted() if args.show else None
    warnings = config_warnings(config, path)
    for warning in warnings:
        out.problem(f"warning: {warning}")
    database = database_in_use(config)
    payload = {"ok": True, "path": str(path), "errors": [], "warnings": warnings, "database": database}
    if shown is not None:
        payload["config"] = shown

    def human() -> str:
        lines = f"config OK\ndatabase: {database}"
        if shown is None:
            return lines
        import yaml

        return lines + "\n" + yaml.safe_dump(shown, sort_keys=False)

    out.result(payload, human)
    return EXIT_OK


def database_in_use(config: Config) -> str:
    """Which database the commands will use, resolved (a relative embedded.path is relative to the
    config's folder: said in full, so a config elsewhere cannot quietly mean another database)."""
    if config.database.dsn:
        from senddock.redact import redact_dsn

        return redact_dsn(config.database.dsn)
    return f"embedded Postgres in {config.database.embedded_path}"


def config_warnings(config: Config, path: Path) -> list[str]:
    """What a valid config will do that its author probably does not want, as ``FILE::$.path: why``."""
    from senddock.mail.unsubscribe import missing_links

    missing = missing_links(config.unsubscribe)
    if missing is None:
        return []
    return [f"{path}::$.unsubscribe: {missing}; `campaign send` refuses without it unless given --no-unsubscribe"]


def plugins(args: argparse.Namespace, out: Output) -> int:
    from senddock.plugins import describe

    config = open_config(args)
    rows = describe(config.plugin_manager, config.plugin_origins)
    for row in rows:
        row["transports"] = sorted(t for t, owner in config.transport_providers.items() if owner == row["name"])
    payload = {"active_transport": config.transport, "plugins": rows}

    def human() -> str:
        lines = [table(["plugin", "origin", "transports", "hooks"], [
            [r["name"], r["origin"], r["transports"], r["hooks"]] for r in rows
        ])]
        provider = config.transport_providers[config.transport]
        lines.append(f"\nactive transport: {config.transport} (from {provider})")
        return "\n".join(lines)

    out.result(payload, human)
    return EXIT_OK


def migrate(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        applied = sd.migrate()
    names = [f"{m.version:04d}_{m.name}" for m in applied]
    out.result({"applied": names}, "\n".join(f"applied {n}" for n in names) or "schema is up to date")
    return EXIT_OK


# -- lists and subscribers -------------------------------------------------------------------------


def lists_create(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        list_id = sd.create_list(args.name)
    out.result({"id": list_id, "name": args.name}, f"created list {args.name!r} (id {list_id})")
    return EXIT_OK


def lists_ls(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        found = sd.lists()
    out.result(
        {"lists": found},
        lambda: table(["id", "name", "active", "members", "created"],
                      [[x.id, x.name, x.active, x.members, x.created_at] for x in found]) if found else "no lists yet",
    )
    return EXIT_OK


def subscribers_import(args: argparse.Namespace, out: Output) -> int:
    path = Path(args.file)
    with open_senddock(args) as sd, _progress(out, f"importing {path.name}") as on_progress:
        summary = sd.import_subscribers(path, args.list, on_reject=lambda r: out.problem(str(r)),
                                        on_normalise=lambda n: out.problem(str(n)), on_progress=on_progress,
                                        encoding=args.encoding, on_fallback=fallback_note(args.file, args.encoding, out))
    normalised = f", normalised {summary.normalised}" if summary.normalised else ""
    out.result(
        summary,
        f"imported {summary.imported}, updated {summary.updated}, unchanged {summary.unchanged}, "
        f"rejected {summary.rejected}{normalised}",
    )
    # A name made one line is a problem found in the input, like a rejected row: the file needs
    # fixing at its source, even though every such row was imported.
    return EXIT_PROBLEMS if summary.rejected or summary.normalised else EXIT_OK


class _progress:
    """A rich progress bar on a terminal; a no-op callback otherwise."""

    def __init__(self, out: Output, label: str) -> None:
        self._out, self._label = out, label
        self._bar = None

    def __enter__(self):
        if not self._out.interactive:
            return lambda done, total: None
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        self._bar = Progress(
            "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
            transient=True,
        )
        self._bar.start()
        task = self._bar.add_task(self._label, total=None)
        return lambda done, total: self._bar.update(task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


# -- campaigns --------------------------------------------------------------------------------------


def _read_body(path: str | None, option: str) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"{option} {path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"{option} {path}: not UTF-8 text") from None


BURST_HELP = ("sends that may leave at once after an idle spell (default: one second's worth, at least 1), "
              "less what pacing.latency_margin keeps back")


def add_rate_options(p: argparse.ArgumentParser, *, none_removes: bool = False) -> None:
    """--rate and --burst, spelled as the config's pacing section spells a rate and its burst."""
    p.add_argument("--rate", type=argtypes.send_rate, metavar="RATE",
                   help="the campaign's own rate, all nodes together: N/s, N/min, N/h or N/day (e.g. 100/min)"
                        + ("; none removes it" if none_removes else ""))
    p.add_argument("--burst", type=argtypes.burst, metavar="N", help=BURST_HELP)


def campaign_create(args: argparse.Namespace, out: Output) -> int:
    text_body = _read_body(args.text, "--text")
    html_body = _read_body(args.html, "--html")
    with open_senddock(args) as sd:
        campaign_id = sd.create_campaign(
            name=args.name,
            lists=args.list,
            subject=args.subject,
            from_addr=args.from_addr,
            reply_to=args.reply_to,
            text_body=text_body,
            html_body=html_body,
            rate=args.rate,
            burst=args.burst,
        )
    out.result({"id": campaign_id}, str(campaign_id))
    return EXIT_OK


def campaign_ls(args: argparse.Namespace, out: Output) -> int:
    from dataclasses import asdict

    from senddock.pacing.rates import campaign_rate_view

    with open_senddock(args) as sd:
        found = sd.campaigns()
    # `rate` as `campaign status` shows it ({"rate", "burst"}), not the stored text.
    listed = [{**{k: v for k, v in asdict(c).items() if k != "send_rate"}, "rate": campaign_rate_view(c.send_rate)}
              for c in found]
    out.result(
        {"campaigns": listed},
        lambda: table(
            ["id", "name", "status", "lists", "broadcast", "recipients", "rate", "send at", "created"],
            [[c.id, c.name, c.status, c.lists, c.broadcast_id, c.enqueued, c.send_rate, c.send_at, c.created_at]
             for c in found],
        ) if found else "no campaigns yet",
    )
    return EXIT_OK


def rate_words(rate: dict | None) -> str:
    """``100/min (burst 1)`` or ``none of its own``, from the ``{"rate", "burst"}`` of `--json`."""
    if rate is None:
        return "none of its own"
    return rate["rate"] if rate["burst"] is None else f"{rate['rate']} (burst {rate['burst']})"


def campaign_send(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        result = sd.send_campaign(args.id, send_at=args.at, require_unsubscribe=not args.no_unsubscribe)
        # An --at a few seconds behind the clock sends now: say what happened, not what was asked.
        scheduled = args.at is not None and sd.campaign(args.id).status == "scheduled"
    when = f", scheduled for {args.at.isoformat()}" if scheduled else ""
    for warning in result.warnings:
        out.problem(f"warning: campaign {result.campaign_id}: {warning}")
    out.result(
        {**{k: getattr(result, k) for k in ("campaign_id", "broadcast_id", "enqueued", "skipped",
                                             "skipped_suppressed", "skipped_unsubscribed")},
         "send_at": args.at, "warnings": list(result.warnings)},
        f"campaign {result.campaign_id}: broadcast {result.broadcast_id} enqueued "
        f"{plural(result.enqueued, 'recipient')}{when}, "
        f"skipped {result.skipped} ({result.skipped_suppressed} suppressed, "
        f"{result.skipped_unsubscribed} unsubscribed or blocklisted)",
    )
    return EXIT_OK


def campaign_status(args: argparse.Namespace, out: Output) -> int:
    if args.watch:
        from senddock.cli.watch import watch

        with open_senddock(args) as sd:
            return watch(sd, args.id, out, interval=args.interval)
    with open_senddock(args) as sd:
        status = sd.campaign_status(args.id)

    def human() -> str:
        lines = [f"campaign {status.campaign_id}: {status.status}"
                 + (f" ({status.paused_reason})" if status.paused_reason else "")]
        if status.rate is not None:
            lines.append(f"rate: {rate_words(status.rate)}, all nodes together")
        if status.warning:
            lines.append(warning_line(status))
        if status.auto_resume:
            lines.append(probe_line(status))
        if status.broadcast_id is None:
            lines.append("not sent yet")
            if status.pacing:
                lines.append(pacing_table(status.pacing))
            return "\n".join(lines)
        lines.append(f"broadcast {status.broadcast_id}: {plural(status.total, 'recipient')}, "
                     f"{status.skipped} skipped")
        lines.append(table(
            ["pending", "sending", "retry", "sent", "failed", "bounced"],
            [[status.pending, status.sending, status.retry, status.sent, status.failed, status.bounced]],
        ))
        for reason, count in status.failed_by_reason.items():
            lines.append(f"  failed {reason}: {count}")
        lines.append(bounce_line(status.bounce_summary))
        if status.pruned_at is not None:
            lines.append(f"per-recipient detail pruned on {status.pruned_at:%Y-%m-%d} (retention): these counts are "
                         "those it had")
        if status.pacing:
            lines.append(pacing_table(status.pacing))
        return "\n".join(lines)

    out.result(status.as_dict(), human)
    return EXIT_OK


def status(args: argparse.Namespace, out: Output) -> int:
    with open_senddock(args) as sd:
        limits = sd.pacing_status()

    def human() -> str:
        if not limits:
            return "pacing: no limit configured (the `pacing` section of the config)"
        return pacing_table(limits)

    out.result({"pacing": [limit.as_dict() for limit in limits]}, human)
    return EXIT_OK
