"""The claimer's gate to the shared limits: which claimed jobs may begin now, and when the others may.

A job subject to a limit (the `pacing` section, its campaign's own rate) is claimed unmarked; the
gate takes the limits for every group of jobs that share them (one ``pacing_take`` per group),
and one synchronous statement (``jobs_begin``) marks the admitted ones begun and puts the others
back as retries due when their limits have room: **no attempt spent, never in doubt** (their send
never began), and jobs of other domains in the same claim go on. Held-back jobs are spread over
the limit's schedule (one interval apart, after what this node booked before) rather than all due
at once, so a held domain costs a claim now and then, not a claim per poll.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

import structlog

from senddock.core.pacer import Pacer
from senddock.core.queue import ClaimedJob, Queue
from senddock.pacing.limits import Limit, PacingSettings, limits_for
from senddock.pacing.rates import Rate, parse_campaign_rate

log = structlog.get_logger(__name__)


def campaign_rate(stored: str | None) -> Rate | None:
    """A campaign's stored rate (``100/min`` or ``100/min burst 10``, as the claim returns it with
    each job, so `campaign set-rate` applies from every node's next claim); None when it has none,
    or when it cannot be read (written into the table by hand): logged, and the config's limits
    still hold; pacing must not stop a node."""
    if not stored:
        return None
    try:
        return parse_campaign_rate(stored)
    except ValueError as exc:
        log.warning("campaign_rate_unreadable", error=str(exc))
        return None


class PacingGate:
    def __init__(self, pacing: PacingSettings, transport: str) -> None:
        self._pacing = pacing
        self._transport = transport
        # Per set of limits: the latest due time this node gave a held-back job.
        self._booked: dict[tuple[str, ...], datetime] = {}
        self.next_due: float | None = None  # monotonic time the earliest held-back job falls due
        self._holding_until = 0.0  # monotonic time the last job this node held back falls due

    @property
    def configured(self) -> bool:
        """Whether the config limits anything (campaign rates aside): then no claim marks begun."""
        p = self._pacing
        return p.global_rate is not None or bool(p.transports) or any(g.rate for g in p.domains)

    @property
    def holding(self) -> bool:
        """Jobs this node held back are not due yet: a node told to exit when idle waits for them."""
        return time.monotonic() < self._holding_until

    def limits(self, job: ClaimedJob) -> tuple[Limit, ...]:
        return limits_for(self._pacing, transport=self._transport, domain=job.domain,
                          campaign_id=job.campaign_id, campaign_rate=campaign_rate(job.send_rate))

    def admit(self, queue: Queue, token: uuid.UUID, jobs: Sequence[ClaimedJob]) -> list[ClaimedJob]:
        """Take the limits for ``jobs`` (claimed unmarked under ``token``); mark the admitted ones
        begun, put the others back due when their limits have room. Returns the jobs marked begun."""
        groups: dict[tuple[Limit, ...], list[ClaimedJob]] = defaultdict(list)
        for job in jobs:
            groups[self.limits(job)].append(job)
        pacer = Pacer(queue.conn)
        admitted: list[ClaimedJob] = []
        held: list[tuple[ClaimedJob, datetime]] = []
        for limits, group in groups.items():
            if not limits:
                admitted += group
                continue
            taken = pacer.take(limits, len(group))
            admitted += group[:taken.admitted]
            rest = group[taken.admitted:]
            if rest:
                held += self._book(limits, rest, taken.next_at or taken.at, taken.at)
        marked = queue.begin(token, admitted, held) if admitted or held else set()
        if held:
            log.debug("jobs_paced", held=len(held), admitted=len(marked))
        return [j for j in admitted if j.id in marked]

    def _book(self, limits: tuple[Limit, ...], jobs: list[ClaimedJob], next_at: datetime,
              now: datetime) -> list[tuple[ClaimedJob, datetime]]:
        """Due times one interval of the strictest limit apart, after this node's earlier bookings."""
        key = tuple(limit.key for limit in limits)
        step = timedelta(seconds=max(limit.rate.interval for limit in limits))
        start = max(next_at, self._booked.get(key, next_at) + step)
        dues = [(job, start + i * step) for i, job in enumerate(jobs)]
        self._booked[key] = dues[-1][1]
        first = time.monotonic() + max(0.0, (start - now).total_seconds())
        self._holding_until = max(self._holding_until, time.monotonic() + (dues[-1][1] - now).total_seconds())
        self.next_due = first if self.next_due is None or self.next_due < time.monotonic() else min(self.next_due, first)
        return dues
