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
from datetime import datetime, timedelta, timezone

import structlog

from senddock.core.pacer import Pacer
from senddock.store.jobs import ClaimedJob, JobQueue
from senddock.pacing.limits import DomainGroup, Limit, PacingSettings, limits_for, throttled_limit
from senddock.pacing.rates import Rate, parse_campaign_rate

log = structlog.get_logger(__name__)

# Seconds until a job held back by its domain group's concurrency is due again.
CONCURRENCY_RETRY = 0.2


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
        return (p.global_rate is not None or bool(p.transports)
                or any(g.rate or g.concurrency for g in p.domains))

    @property
    def holding(self) -> bool:
        """Jobs this node held back are not due yet: a node told to exit when idle waits for them."""
        return time.monotonic() < self._holding_until

    def limits(self, job: ClaimedJob) -> tuple[Limit, ...]:
        return limits_for(self._pacing, transport=self._transport, domain=job.domain,
                          campaign_id=job.campaign_id, campaign_rate=campaign_rate(job.send_rate))

    def admit(self, queue: JobQueue, token: uuid.UUID, jobs: Sequence[ClaimedJob]) -> list[ClaimedJob]:
        """Take the limits for ``jobs`` (claimed unmarked under ``token``); mark the admitted ones
        begun, put the others back due when their limits have room. Returns the jobs marked begun.

        With a domain group's ``concurrency``, counting its sends in flight (all nodes), taking
        the rates and marking the admitted ones begun are one transaction under that group's lock,
        so two nodes never fill the same room."""
        groups: dict[tuple[Limit, ...], list[ClaimedJob]] = defaultdict(list)
        for job in jobs:
            groups[self.limits(job)].append(job)
        capped = sorted({g.name for g in map(self._group, jobs) if g is not None and g.concurrency})
        if not capped:
            return self._admit(queue, token, groups, {})
        with queue.conn.transaction():
            queue.lock_concurrency([f"concurrency:{name}" for name in capped])
            room: dict[str, int] = {}
            for group in self._pacing.domains:
                if group.name in capped:
                    room[group.name] = group.concurrency
            for domain, count in queue.in_flight_by_domain().items():
                group = self._pacing.group_for(domain)
                if group is not None and group.name in room:
                    room[group.name] -= count
            return self._admit(queue, token, groups, room)

    def throttled(self, queue: JobQueue, jobs: Sequence[ClaimedJob]) -> None:
        """Throttling replies to these sends: slow down (adaptive pacing) the limit of the provider
        that sent each, once per statement for all nodes (see senddock.pacing.adaptive)."""
        if not self._pacing.adaptive:
            return
        keys = {limit.key for limit in (throttled_limit(self.limits(job)) for job in jobs) if limit is not None}
        if keys:
            Pacer(queue.conn, self._pacing.adaptive).throttled(sorted(keys))

    def _group(self, job: ClaimedJob) -> DomainGroup | None:
        return self._pacing.group_for(job.domain)

    def _admit(self, queue: JobQueue, token: uuid.UUID, groups: dict[tuple[Limit, ...], list[ClaimedJob]],
               room: dict[str, int]) -> list[ClaimedJob]:
        pacer = Pacer(queue.conn, self._pacing.adaptive, self._pacing.latency_margin)
        admitted: list[ClaimedJob] = []
        held: list[tuple[ClaimedJob, datetime]] = []
        for limits, group in groups.items():
            # Jobs of one set of limits share a domain group (its key is among the limits) or have
            # none with a concurrency, unless the group has no rate: then split them by group.
            for name, jobs in self._by_capped_group(group, room).items():
                fits = len(jobs) if name is None else max(0, min(len(jobs), room[name]))
                if fits and limits:
                    taken = pacer.take(limits, fits)
                    fits, next_at, now = taken.admitted, taken.next_at or taken.at, taken.at
                else:
                    next_at = now = None
                admitted += jobs[:fits]
                if name is not None:
                    room[name] -= fits
                rest = jobs[fits:]
                if not rest:
                    continue
                if next_at is None or fits == len(jobs) or (name is not None and room[name] <= 0):
                    # Held for the group's concurrency: due again shortly (room frees as sends end).
                    held += self._book(("concurrency", name or ""), rest, None, CONCURRENCY_RETRY)
                else:
                    held += self._book(tuple(limit.key for limit in limits), rest, (next_at, now),
                                       max(limit.rate.interval for limit in limits))
        marked = queue.begin(token, admitted, held) if admitted or held else set()
        if held:
            log.debug("jobs_paced", held=len(held), admitted=len(marked))
        return [j for j in admitted if j.id in marked]

    def _by_capped_group(self, jobs: list[ClaimedJob], room: dict[str, int]) -> dict[str | None, list[ClaimedJob]]:
        split: dict[str | None, list[ClaimedJob]] = defaultdict(list)
        for job in jobs:
            group = self._group(job)
            split[group.name if group is not None and group.name in room else None].append(job)
        return split

    def _book(self, key: tuple[str, ...], jobs: list[ClaimedJob], when: tuple[datetime, datetime] | None,
              step_seconds: float) -> list[tuple[ClaimedJob, datetime]]:
        """Due times ``step_seconds`` apart, after this node's earlier bookings of ``key``, from
        ``when`` = (next allowed, the limiter's now), or from now for concurrency."""
        now = when[1] if when else datetime.now(timezone.utc)
        next_at = when[0] if when else now + timedelta(seconds=step_seconds)
        step = timedelta(seconds=step_seconds if when else 0)
        start = max(next_at, self._booked.get(key, next_at) + step) if when else next_at
        dues = [(job, start + i * step) for i, job in enumerate(jobs)]
        if when:
            self._booked[key] = dues[-1][1]
        # Wake when the limit has room again (jobs booked earlier may be due by then: a limit that
        # is asked late has lost that time), or when the first of these falls due.
        first = time.monotonic() + max(0.0, (min(next_at, start) - now).total_seconds())
        self._holding_until = max(self._holding_until, time.monotonic() + (dues[-1][1] - now).total_seconds())
        self.next_due = first if self.next_due is None or self.next_due < time.monotonic() else min(self.next_due, first)
        return dues
