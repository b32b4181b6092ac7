"""What this node began and recorded lately: the memory that survives a failover the database forgets.

An asynchronous standby acknowledges nothing: what the primary committed in its last moments
(claims, begin marks, results) may never reach it. After a promotion the new primary can show a
job this node sent as ``pending`` again (its claim and result both lost), or as claimed but never
begun (its begin mark lost). Recovery alone would send such a job again with no record of the
first send. So each node keeps, in memory:

- every job it has begun and not yet recorded (what is in flight, bounded by its slots);
- every result it committed in the last ``recovery.failover_window`` (sized to the replication lag
  an operator accepts).

When the node meets a new server epoch (a promotion, or a crash that lost WAL) it settles before
anyone claims again (see Completer._server_lost_wal): its jobs in flight are taken back under
their claims and marked begun (``jobs_reclaim``), its results are committed again where they are
missing (``jobs_results_recorded``), and only then does it mark itself settled in the new epoch
(``nodes.settled_epoch``). Claims wait until every live node has settled (``jobs_claim``).

What this cannot cover: a node that dies with the old primary (its memory goes with it), and a
replication lag longer than the window (older results are forgotten).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the queue's value types, for annotations only
    from senddock.store.jobs import ClaimedJob, ResultRow

_NO_ATTRIBUTES = MappingProxyType({})


class Journal:
    """Thread-safe: the claimer and the completer write it, the completer reads it to settle."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._lock = threading.Condition()
        self._in_flight: dict[int, ClaimedJob] = {}
        self._results: deque[tuple[float, ResultRow]] = deque()
        self._beginning = 0  # begin statements whose jobs are not journaled yet (see beginning)

    # -- written as jobs begin and end ---------------------------------------------------------

    def beginning(self) -> _Beginning:
        """``with journal.beginning(): <statement that marks jobs begun>; journal.began(jobs)``:
        a settle waits for a begin whose reply has come but whose jobs are not journaled yet."""
        return _Beginning(self)

    def began(self, jobs: Iterable[ClaimedJob]) -> None:
        with self._lock:
            for job in jobs:
                self._in_flight[job.id] = _slim(job)

    def ended(self, jobs: Iterable[ClaimedJob]) -> None:
        """Put back unstarted (or given up): nothing of them to settle."""
        with self._lock:
            for job in jobs:
                self._in_flight.pop(job.id, None)

    def recorded(self, rows: Sequence[ResultRow]) -> None:
        """Results committed: kept for the window, no longer in flight."""
        now = time.monotonic()
        with self._lock:
            for row in rows:
                self._in_flight.pop(row.job.id, None)
                if self.window > 0:
                    self._results.append((now, replace(row, job=_slim(row.job))))
            self._forget(now)

    # -- read when the server lost WAL -----------------------------------------------------------

    def snapshot(self, wait: float) -> tuple[list[ClaimedJob], list[ResultRow]]:
        """The jobs in flight and the results of the window, once no begin is half-journaled (at
        most ``wait`` seconds: a begin whose reply came is journaled microseconds later)."""
        with self._lock:
            self._lock.wait_for(lambda: self._beginning == 0, wait)
            self._forget(time.monotonic())
            return list(self._in_flight.values()), [row for _, row in self._results]

    def __len__(self) -> int:
        with self._lock:
            return len(self._results)

    def _forget(self, now: float) -> None:
        horizon = now - self.window
        while self._results and self._results[0][0] < horizon:
            self._results.popleft()


class _Beginning:
    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def __enter__(self) -> None:
        with self._journal._lock:
            self._journal._beginning += 1

    def __exit__(self, *exc: object) -> None:
        with self._journal._lock:
            self._journal._beginning -= 1
            self._journal._lock.notify_all()


def _slim(job: ClaimedJob) -> ClaimedJob:
    """What settling needs of a job (its id, claim, broadcast, campaign, address): not the
    subscriber's name and attributes, which a window of results would keep alive for nothing."""
    if not job.attributes and not job.name:
        return job
    return replace(job, name="", attributes=_NO_ATTRIBUTES)
