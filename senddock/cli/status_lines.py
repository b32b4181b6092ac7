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


# Not senddock.domain.pacing_status.PACING_COLUMNS: importing it would load psycopg for `--help`.
PACING_COLUMNS = ("pacing", "configured", "effective", "last minute")


def pacing_table(limits) -> str:
    """Per pacing limit (senddock.domain.pacing_status.LimitStatus): rate configured, effective
    (slowed down by throttling), measured over the last minute."""
    from senddock.cli.output import table

    return table(PACING_COLUMNS, [limit.columns() for limit in limits])


def bounce_line(summary: dict) -> str:
    """``bounces: hard 3 (1.20%), soft 1 (0.40%), complaints 2 (0.80%, above the 0.3% line)``."""
    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value * 100:.2f}%"

    limit = summary["complaint_rate_limit"]
    over = summary["complaint_rate"] is not None and summary["complaint_rate"] >= limit
    line = (f"bounces: hard {summary['hard']} ({rate(summary['hard_rate'])}), soft {summary['soft']} "
            f"({rate(summary['soft_rate'])}), complaints {summary['complaints']} ({rate(summary['complaint_rate'])}")
    return line + (f", at or above the {limit * 100:.1f}% Gmail and Yahoo allow bulk senders)" if over else ")")
