"""The lines `campaign status` and its `--watch` view share: a paused campaign, pacing."""

from __future__ import annotations

from datetime import datetime, timezone

from senddock.durations import format_duration
from senddock.wording import plural


def probe_line(status) -> str:
    """How a pause for relay trouble is getting on: it resumes by itself once the relay answers."""
    line = "resumes by itself when the relay answers"
    if status.next_probe_at is not None:
        wait = (status.next_probe_at - datetime.now(timezone.utc)).total_seconds()
        line += f"; next probe in {format_duration(max(0.0, wait))}"
    if status.probes_failed:
        line += f"; {plural(status.probes_failed, 'probe')} failed, last: {status.last_probe}"
    return line


def warning_line(status) -> str:
    """A pause senddock made itself, said loudly: when, why and what to do."""
    since = ""
    if status.paused_at is not None:
        ago = (datetime.now(timezone.utc) - status.paused_at).total_seconds()
        since = f" (since {status.paused_at.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC, " \
                f"{format_duration(max(0.0, ago))} ago)"
    return f"warning{since}: {status.warning}"


# Not senddock.core.pacing_status.PACING_COLUMNS: importing it would load psycopg for `--help`.
PACING_COLUMNS = ("pacing", "configured", "effective", "last minute")


def pacing_table(limits) -> str:
    """Per pacing limit (senddock.core.pacing_status.LimitStatus): rate configured, effective
    (slowed down by throttling), measured over the last minute."""
    from senddock.cli.output import table

    return table(PACING_COLUMNS, [limit.columns() for limit in limits])
