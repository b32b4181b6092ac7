"""What a node has in flight: its send slots, the jobs claimed ahead (the deck) and the claims it holds.

A *slot* is taken when a job is marked begun and given back once its result is committed (or the
job is put back unstarted): the jobs that may be in doubt after a kill -9 are never more than the
slots. Without pacing limits a node has ``RUNWAY`` slots per sender: while a sender sends, its
next job is already marked begun, so it goes on without waiting for the commit of its last result
(the slots are the sends in flight plus the results waiting for the completer, or the next jobs
marked in their place). The *deck* holds jobs claimed ahead of a free slot and not marked begun:
the completer marks some of them begun in the very commit that frees the slots they take, so a
freed slot is refilled without a claim on its way, and a kill -9 puts them back as they were
(never begun, never in doubt). A *claim* (one claim statement's token) is held from before the
claim commits until every one of its jobs is settled: its result durable, or the job put back.
This node's orphan recovery leaves held claims alone.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the queue's value type, for annotations only
    from senddock.store.jobs import ClaimedJob

# Slots per sender without pacing limits: the send in hand and the next one, marked begun. With one
# (a slot free only once its result committed) a sender idles through every commit. It doubles what
# a kill -9 may leave in doubt: 2 x concurrency. (Measured: docs/benchmarks.md.)
RUNWAY = 2

# The fewest jobs a deck holds (claim_batch permitting): a deck is claimed again once down to half,
# so a deck sized to a small node's slots would claim a few jobs every few sends. Its jobs are
# claimed, never begun: a kill -9 leaves them as they were. At a broadcast's end they wait on this
# node (a broadcast smaller than a node's slots and deck may go to one node whole).
DECK_FLOOR = 32


class Slots:
    """A counting semaphore that can be taken many at a time, and read."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._used = 0
        self._changed = threading.Condition()

    @property
    def in_use(self) -> int:
        with self._changed:
            return self._used

    def wait_free(self, timeout: float, or_else: Callable[[], bool] = lambda: False) -> int:
        """How many are free, waiting up to ``timeout`` seconds for at least one (or for
        ``or_else()``, checked whenever the slots or the deck change)."""
        with self._changed:
            self._changed.wait_for(lambda: self._used < self.size or or_else(), timeout)
            return self.size - self._used

    def notify(self) -> None:
        """Something a waiter's ``or_else`` reads has changed (the deck)."""
        with self._changed:
            self._changed.notify_all()

    def take(self, n: int) -> None:
        with self._changed:
            if self._used + n > self.size:
                raise RuntimeError(f"taking {n} slots with {self.size - self._used} free")
            self._used += n

    def give(self, n: int = 1) -> None:
        with self._changed:
            self._used -= n
            self._changed.notify_all()

    def wait_empty(self, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._used == 0, timeout)


class Deck:
    """Jobs claimed ahead of a free slot, not marked begun, in claim order: each with the monotonic
    time its claim's reply arrived. Refilled by the claimer once it is down to half; taken from the
    head by the completer (for the slots its commit frees) or by the claimer (a slot freed with
    nothing to refill it)."""

    def __init__(self, size: int, slots: Slots) -> None:
        self.size = size  # 0: no deck (a pacing limit decides when each job may begin)
        self._slots = slots  # woken when jobs are taken: the claimer waits there for room too
        self._jobs: deque[tuple[ClaimedJob, float]] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)

    def wants_more(self) -> bool:
        """Down to half or less: worth a claim (claims of half a deck or more, not one per send)."""
        with self._lock:
            return self.size > 0 and len(self._jobs) <= self.size // 2

    def room(self) -> int:
        with self._lock:
            return self.size - len(self._jobs)

    def put(self, jobs: Iterable[tuple[ClaimedJob, float]], *, front: bool = False) -> None:
        with self._lock:
            if front:
                self._jobs.extendleft(reversed(list(jobs)))
            else:
                self._jobs.extend(jobs)
        self._slots.notify()

    def take(self, n: int, ready: Callable[[ClaimedJob], bool] = lambda job: True) -> list[tuple[ClaimedJob, float]]:
        """Up to ``n`` jobs from the head, stopping at the first that is not ``ready``: the order of
        the claim is kept (a job that must pass a limit waits for the claimer, and the jobs
        behind it for that)."""
        taken = []
        with self._lock:
            while self._jobs and len(taken) < n and ready(self._jobs[0][0]):
                taken.append(self._jobs.popleft())
            # The claimer waits for a free slot or a deck down to half: a take that leaves more
            # than half changes neither (woken after every group commit, it found nothing to do).
            wanted = len(self._jobs) <= self.size // 2
        if taken and wanted:
            self._slots.notify()
        return taken


class HeldClaims:
    """Claim tokens this node holds, with how many of each claim's jobs are not settled yet."""

    def __init__(self) -> None:
        self._open: Counter[uuid.UUID] = Counter()
        self._tokens: set[uuid.UUID] = set()
        self._lock = threading.Lock()

    def hold(self, token: uuid.UUID) -> None:
        """Before the claim commits, so recovery never takes a claim about to be sent."""
        with self._lock:
            self._tokens.add(token)

    def expect(self, token: uuid.UUID, jobs: int) -> None:
        """The claim came back: ``jobs`` of it must be settled before it is let go."""
        with self._lock:
            if jobs:
                self._open[token] += jobs
            elif not self._open[token]:
                self._drop(token)

    def settle(self, token: uuid.UUID, jobs: int = 1) -> None:
        with self._lock:
            self._open[token] -= jobs
            if self._open[token] <= 0:
                self._drop(token)

    def let_go(self, token: uuid.UUID) -> None:
        with self._lock:
            self._drop(token)

    def tokens(self) -> list[uuid.UUID]:
        with self._lock:
            return list(self._tokens)

    def __len__(self) -> int:
        with self._lock:
            return len(self._tokens)

    def _drop(self, token: uuid.UUID) -> None:
        self._open.pop(token, None)
        self._tokens.discard(token)


class Halts:
    """Campaigns seen to stop sending, with the monotonic time this node saw it: paused by this node
    (a pause outcome, a breaker), or paused or cancelled elsewhere (a group commit's results said
    so). A job marked begun before then and still waiting for a sender (see RUNWAY) goes back
    unsent, as a claim after the pause would not have taken it. A job claimed after it (the
    campaign was resumed since) is sent."""

    def __init__(self) -> None:
        self._at: dict[int, float] = {}
        self._lock = threading.Lock()

    def add(self, campaign_id: int) -> None:
        with self._lock:
            self._at[campaign_id] = time.monotonic()

    def stops(self, campaign_id: int, claimed_at: float) -> bool:
        """Whether a job of ``campaign_id`` whose claim's reply arrived at ``claimed_at`` (monotonic)
        was claimed before this node paused its campaign."""
        at = self._at.get(campaign_id)  # a dict read is atomic: no lock on every send's path
        return at is not None and claimed_at <= at
