"""What the senders hand the completer: each result to record, each job to put back unstarted.

Made before either (the runner builds the senders with it, then the completer), so neither is
built with the other. While a group of deliveries waits for the runway (see completer.LINGER),
results join it without waking the completer for each: it is woken from here once the wait should
end (a sender took the last job waiting, a result that is not a delivery came, or the close).
"""

from __future__ import annotations

import queue as queues
import threading
from collections.abc import Callable
from dataclasses import dataclass

from senddock.store.jobs import ClaimedJob, ResultRow
from senddock.outcome import Classification


@dataclass
class Done:
    """What a sender hands over: a result to record, or a job to put back unstarted."""

    job: ClaimedJob
    row: ResultRow | None = None  # None: the send never began, the job goes back as it was
    verdict: Classification | None = None
    # Set once the result is committed and acted on (a breaker tripped, a pause registered): until
    # then no sender begins another job of the campaign (see Senders._settled).
    committed: threading.Event | None = None


class Inbox:
    """Thread-safe: every sender puts, the completer takes."""

    def __init__(self) -> None:
        self._items: queues.SimpleQueue[Done] = queues.SimpleQueue()
        self._lock = threading.Lock()
        self.pending = 0  # handed over and not committed yet (read by the idle check)
        self._waiting_on_runway = False
        self._wake = threading.Event()
        self.closing = threading.Event()  # no more will come: record what is left and stop

    # -- the senders' end ----------------------------------------------------------------------

    def put(self, done: Done) -> None:
        with self._lock:
            self.pending += 1
        self._items.put(done)
        if self._waiting_on_runway and (done.row is None or done.row.result.outcome != "sent"):
            self._wake.set()  # anything but a delivery is committed at once

    def runway_empty(self) -> None:
        """A sender took the last job waiting for the senders: a group waiting for more results
        (see LINGER) is committed now, so the next sender to finish finds its next job."""
        if self._waiting_on_runway:
            self._wake.set()

    def close(self) -> None:
        """No more results will come (the senders have stopped)."""
        self.closing.set()
        self._items.put(Done(job=None))  # type: ignore[arg-type]  # wakes the completer
        self._wake.set()

    # -- the completer's end -------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> Done:
        """The next item, waiting up to ``timeout`` (None: not at all); queue.Empty if none came."""
        return self._items.get_nowait() if timeout is None else self._items.get(timeout=timeout)

    def empty(self) -> bool:
        return self._items.empty()

    def drained(self) -> bool:
        """Closed, and everything handed over taken."""
        return self.closing.is_set() and self._items.empty()

    def committed(self, count: int) -> None:
        with self._lock:
            self.pending -= count

    def wait_for_runway(self, left: float, waiting: Callable[[], int]) -> bool:
        """While jobs wait for the senders (``waiting()``), wait up to ``left`` seconds for a sender
        to take the last of them (or for a result that is not a delivery, or the close): the
        results joining meanwhile do not wake the completer one by one. False when no job waits
        any more. The flag is raised before the state is read: a sender that empties the runway
        after this reads the flag and wakes the completer, one before is seen here; a wake left
        over from an earlier wait only makes the caller look again."""
        self._waiting_on_runway = True
        try:
            if waiting() == 0:
                return False
            if self._items.empty():
                self._wake.wait(left)
            return True
        finally:
            self._wake.clear()
            self._waiting_on_runway = False
