"""`campaign status --watch`: follow a broadcast until it is finished, paused or cancelled.

A pause for relay trouble resumes by itself once the relay answers: the view stays, showing it.

On a terminal a live view (rich): a progress bar of done/total, counts per status, send rate and
ETA, failures by reason. Piped, one plain line per interval. With --json, one JSON object (the
final status) when it ends, as every command prints.
"""

from __future__ import annotations

import time
from collections import deque

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from senddock.cli.status_lines import PACING_COLUMNS, bounce_line, probe_line, warning_line
from senddock.cli.output import Output
from senddock.domain.campaigns import CampaignStatus
from senddock.errors import EXIT_OK

ENDED = ("finished", "paused", "cancelled", "draft")


def ended(status: CampaignStatus) -> bool:
    return status.status in ENDED and not status.auto_resume


class Rate:
    """Messages done per second over the last ``window`` seconds, and the time left at that pace."""

    def __init__(self, window: float = 10.0) -> None:
        self._samples: deque[tuple[float, int]] = deque()
        self._window = window

    def add(self, done: int, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        self._samples.append((at, done))
        while len(self._samples) > 2 and at - self._samples[0][0] > self._window:
            self._samples.popleft()

    @property
    def per_second(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0

    def eta(self, remaining: int) -> float | None:
        rate = self.per_second
        return remaining / rate if rate > 0 else None


def done(status: CampaignStatus) -> int:
    return status.sent + status.failed


def plain_line(status: CampaignStatus, rate: Rate) -> str:
    eta = rate.eta(status.total - done(status))
    reasons = ", ".join(f"{r} {n}" for r, n in status.failed_by_reason.items())
    return (f"campaign {status.campaign_id}: {status.status} {done(status)}/{status.total} "
            f"(sent {status.sent}, failed {status.failed}, retry {status.retry}, pending {status.pending}, "
            f"sending {status.sending}) {rate.per_second:.0f}/s"
            + (f" ETA {eta:.0f}s" if eta is not None and status.status == "sending" else "")
            + (f" [failed: {reasons}]" if reasons else "")
            + (f" [paused: {status.paused_reason}; {probe_line(status)}]" if status.auto_resume else ""))


def _view(status: CampaignStatus, rate: Rate, bar: Progress, task) -> Group:
    bar.update(task, completed=done(status), total=max(status.total, 1),
               description=f"campaign {status.campaign_id} {status.status}")
    counts = Table(box=None, show_header=True, header_style="bold")
    for column in ("pending", "sending", "retry", "sent", "failed", "bounced", "rate", "ETA"):
        counts.add_column(column, justify="right")
    eta = rate.eta(status.total - done(status))
    counts.add_row(*(str(getattr(status, c)) for c in ("pending", "sending", "retry", "sent", "failed", "bounced")),
                   f"{rate.per_second:.0f}/s", f"{eta:.0f}s" if eta is not None else "-")
    parts = [bar, counts, bounce_line(status.bounce_summary)]
    if status.failed_by_reason:
        failures = Table(box=None, show_header=True, header_style="bold")
        failures.add_column("failed by reason")
        failures.add_column("jobs", justify="right")
        for reason, count in sorted(status.failed_by_reason.items(), key=lambda kv: -kv[1]):
            failures.add_row(reason, str(count))
        parts.append(failures)
    if status.pacing:
        pacing = Table(box=None, show_header=True, header_style="bold")
        for column in PACING_COLUMNS:
            pacing.add_column(column, justify="left" if column == "pacing" else "right")
        for limit in status.pacing:
            pacing.add_row(*limit.columns())
        parts.append(pacing)
    if status.warning:
        parts.append(Text(warning_line(status), style="bold red"))
    elif status.paused_reason:
        parts.append(f"paused: {status.paused_reason}")
    if status.auto_resume:
        parts.append(probe_line(status))
    return Group(*parts)


def watch(sd, campaign_id: int, out: Output, interval: float = 1.0) -> int:
    rate = Rate()
    status = sd.campaign_status(campaign_id)  # a wrong id fails here, before any view starts
    if out.interactive:
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        task = bar.add_task("", total=max(status.total, 1))
        with Live(_view(status, rate, bar, task), console=Console(stderr=False), refresh_per_second=4) as live:
            while True:
                rate.add(done(status))
                live.update(_view(status, rate, bar, task))
                if ended(status):
                    break
                time.sleep(interval)
                status = sd.campaign_status(campaign_id)
        return EXIT_OK
    while True:
        rate.add(done(status))
        if not out.json_mode:
            print(plain_line(status, rate), flush=True)
        if ended(status):
            break
        time.sleep(interval)
        status = sd.campaign_status(campaign_id)
    if status.warning and not out.json_mode:
        print(warning_line(status), flush=True)
    if out.json_mode:
        out.result(status.as_dict())
    return EXIT_OK
