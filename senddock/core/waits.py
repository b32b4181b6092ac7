"""A node's statements that wait: a claim, a group commit or a heartbeat that has not returned.

A commit can wait forever without any error: a promoted standby that still carries
``synchronous_standby_names`` makes every commit wait for a standby that does not exist (wait
event ``SyncRep``). A node then said nothing for minutes. So the claimer, the completer and the
lifeline say when such a statement starts and ends (:meth:`Waits.watch`), and a watchdog thread
(:class:`Watchdog`) looks every second: a statement older than ``database.stuck_after`` is logged
once per that interval (``database_waits``: which, for how long, and the wait event
``pg_stat_activity`` shows for its backend, read on a connection of the watchdog's own), turns
``/readyz`` to 503 with the same words, and shows in ``senddock_database_wait_seconds``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import structlog

from senddock.store.queries import query
from senddock.errors import error_line

log = structlog.get_logger(__name__)

# What a node's statements are, as the metric and the log name them.
KINDS = ("claim", "results", "heartbeat")


@dataclass(frozen=True)
class Waiting:
    kind: str
    seconds: float
    backend_pid: int | None
    wait_event: str | None = None  # "IPC/SyncRep": pg_stat_activity's type and event, when read


class Waits:
    """Statements in progress, by kind; cheap enough for every claim and commit (a dict entry)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str, float, int | None]] = {}
        self._ids = itertools.count()

    @contextmanager
    def watch(self, kind: str, conn: psycopg.Connection) -> Iterator[None]:
        token = next(self._ids)
        pid = conn.info.backend_pid if not conn.closed else None
        with self._lock:
            self._running[token] = (kind, time.monotonic(), pid)
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(token, None)

    def oldest(self) -> dict[str, tuple[float, int | None]]:
        """Per kind, the age of its oldest statement in progress and that statement's backend."""
        now = time.monotonic()
        with self._lock:
            running = list(self._running.values())
        oldest: dict[str, tuple[float, int | None]] = {}
        for kind, started, pid in running:
            age = now - started
            if kind not in oldest or age > oldest[kind][0]:
                oldest[kind] = (age, pid)
        return oldest


class Watchdog(threading.Thread):
    """Looks at a node's :class:`Waits` every second; see the module's docstring."""

    def __init__(self, waits: Waits, *, stuck_after: float, connect: Callable[[], psycopg.Connection],
                 gauge, interval: float = 1.0) -> None:
        super().__init__(name="senddock-watchdog", daemon=True)
        self._waits = waits
        self._stuck_after = stuck_after
        self._connect = connect  # a connection of its own: the pool may be held by the stuck statements
        self._gauge = gauge  # senddock_database_wait_seconds, by kind
        self._stopping = threading.Event()
        self._interval = interval
        self._said_at = float("-inf")
        self.stuck: list[Waiting] = []  # read by /readyz

    def run(self) -> None:
        while not self._stopping.wait(self._interval):
            self.look()

    def stop(self) -> None:
        self._stopping.set()

    def look(self) -> list[Waiting]:
        oldest = self._waits.oldest()
        for kind in KINDS:
            self._gauge.labels(statement=kind).set(round(oldest.get(kind, (0.0, None))[0], 3))
        stuck = [Waiting(kind, age, pid) for kind, (age, pid) in oldest.items() if age >= self._stuck_after]
        if stuck and time.monotonic() - self._said_at >= self._stuck_after:
            self._said_at = time.monotonic()
            stuck = self._with_wait_events(stuck)
            log.warning("database_waits",
                        statements={w.kind: {"seconds": round(w.seconds, 1), "wait_event": w.wait_event} for w in stuck},
                        meaning="statements of this node have waited longer than database.stuck_after: a commit "
                                "waiting for a synchronous standby (SyncRep), a lock, or a server that stopped "
                                "answering; the node sends nothing new it cannot record")
        elif stuck:
            known = {w.kind: w.wait_event for w in self.stuck}
            stuck = [Waiting(w.kind, w.seconds, w.backend_pid, known.get(w.kind)) for w in stuck]
        self.stuck = stuck
        return stuck

    def _with_wait_events(self, stuck: list[Waiting]) -> list[Waiting]:
        pids = [w.backend_pid for w in stuck if w.backend_pid is not None]
        events: dict[int, str] = {}
        if pids:
            try:
                with self._connect() as conn, conn.transaction():
                    conn.execute("SET LOCAL statement_timeout = 2000")  # a server that stopped answering
                    events = {pid: f"{kind}/{event}" for pid, kind, event in
                              conn.execute(query("backend_wait_events"), {"pids": pids})}
            except psycopg.Error as exc:
                log.debug("wait_events_unread", error=error_line(exc))
        return [Waiting(w.kind, w.seconds, w.backend_pid, events.get(w.backend_pid)) for w in stuck]

    def reasons(self) -> list[str]:
        """What /readyz says while statements are stuck."""
        return [f"a {w.kind} statement has waited {w.seconds:.0f}s" + (f" ({w.wait_event})" if w.wait_event else "")
                for w in self.stuck]
