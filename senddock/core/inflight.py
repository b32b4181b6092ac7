"""What a node has in flight: its send slots and the claims it holds.

A *slot* is taken when a job is marked begun and given back once its result is committed (or the
job is put back unstarted): the jobs that may be in doubt after a kill -9 are never more than the
slots, `concurrency`. A *claim* (one claim statement's token) is held from before the claim commits
until every one of its jobs is settled: its result durable, or the job put back. This node's
orphan recovery leaves held claims alone.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter


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

    def wait_free(self, timeout: float) -> int:
        """How many are free, waiting up to ``timeout`` seconds for at least one."""
        with self._changed:
            self._changed.wait_for(lambda: self._used < self.size, timeout)
            return self.size - self._used

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
