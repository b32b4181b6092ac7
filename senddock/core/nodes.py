"""A node: one incarnation of `senddock run`, and its lifeline to the database.

The lifeline is one dedicated, unpooled connection that holds the incarnation's session advisory
lock (so others can prove it dead), heartbeats, and LISTENs for new work. The claimer and the senders ask it whether
the node may still send: a node cut off from Postgres stops sending before anyone can take its jobs.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

import psycopg
import structlog
from psycopg.rows import dict_row

from senddock.config import Config
from senddock.config.digest import config_digest
from senddock.store.db import Database
from senddock.core.epoch import ensure_epoch
from senddock.core.node_names import NOT_A_SESSION, NodeNameTaken, NotASession, check_lock_is_ours, claim_name
from senddock.store.node_identity import LOCK_CLASS, NodeIdentity
from senddock.store.pooler import shares_sessions
from senddock.store.queries import query
from senddock.core.waits import Waits
from senddock.errors import SenddockError, error_line

log = structlog.get_logger(__name__)

NOTIFY_CHANNEL = "senddock_jobs"
# How often the lifeline, waiting for notifications, looks whether the node is stopping: a node's
# last step on the way out waits for it (it marks the node stopped), up to this long.
STOP_CHECK = 0.05


def fence_after(heartbeat: float, lease: float) -> float:
    """Seconds without a good heartbeat after which a node fences itself (claims nothing, starts no
    send): the lease minus two heartbeats, so its sends in flight have those two heartbeats to end
    before anyone may take its jobs (at the lease, on the database's clock, from the last heartbeat
    that reached it); but never less than two heartbeats, or a heartbeat a moment late fences it.
    At the shortest lease the config takes (three heartbeats) that is two heartbeats, one left
    before the lease. Before: always lease minus two heartbeats, one heartbeat there, and a node
    at heartbeat 1s, lease 3s put its jobs back as fenced every few seconds (219 against 870 msg/s)."""
    return max(2 * heartbeat, lease - 2 * heartbeat)


class Lifeline(threading.Thread):
    """Keeps the node's lock, heartbeat and LISTEN alive; reconnects with backoff when Postgres goes away."""

    def __init__(self, config: Config, db: Database, node: NodeIdentity, wake: Callable[[], None],
                 waits: Waits | None = None) -> None:
        super().__init__(name="senddock-lifeline", daemon=True)
        self._config = config
        self._db = db
        self.node = node  # its name is chosen (or checked) when the lifeline first connects
        self._wake = wake
        # Recorded with the node: which config it runs with (`senddock nodes` compares it with a file).
        self.config_digest = config_digest(config)
        self._waits = waits or Waits()  # heartbeats in progress, for the node's watchdog
        self._heartbeat = config.recovery.heartbeat
        self._lease = config.recovery.lease
        self._stop_event = threading.Event()
        self._last_ok = time.monotonic()
        self._fence_after = fence_after(self._heartbeat, self._lease)
        self._fenced = False
        self._fence_lock = threading.Lock()
        self._lock_held = False
        self.lock_id: int | None = None
        self.epoch: uuid.UUID | None = None  # the server epoch this lifeline last connected in
        self.registered = threading.Event()
        # Why the node must not run: a SenddockError to report as it is (its name is taken, a
        # pooler in transaction mode), or the first line of another error with secrets masked.
        self.error: SenddockError | str | None = None
        # Session locks and LISTEN need a real session: behind PgBouncer in transaction mode,
        # database.direct_dsn names a direct one.
        self._dsn = db.session_dsn

    # -- what the claimer, the senders and the completer ask -----------------------------------

    def may_send(self) -> bool:
        """False while the lifeline's lock is not held, and once the last good heartbeat is older
        than :func:`fence_after` (the node *fences* itself: it claims nothing and starts no send).

        Without the lock, a new incarnation of this node's name may take its jobs at once; after
        the lease anyone may. Stopping first keeps a message from being sent twice. Measured on
        the monotonic clock, immune to wall-clock jumps.
        """
        age = time.monotonic() - self._last_ok
        fenced = age >= self._fence_after
        if fenced != self._fenced:
            self._fence_changed(fenced, age)
        return self._lock_held and not fenced

    def _fence_changed(self, fenced: bool, age: float) -> None:
        """Said once each way: a node fences itself only when its heartbeats really fail."""
        with self._fence_lock:
            if fenced == self._fenced:
                return
            self._fenced = fenced
        if fenced:
            log.warning("node_fenced", node=self.node.name, last_heartbeat_s=round(age, 1),
                        fence_after_s=self._fence_after, lease_s=self._lease,
                        meaning="no heartbeat has reached the database for this long: the node claims nothing and "
                                "starts no send until one does, before anyone may take its jobs")
        else:
            log.warning("node_unfenced", node=self.node.name, meaning="a heartbeat reached the database again")

    def stop(self) -> None:
        self._stop_event.set()

    # -- the thread ------------------------------------------------------------------------------

    def run(self) -> None:
        backoff = 0.1
        while not self._stop_event.is_set():
            try:
                with self._connect() as conn:
                    backoff = 0.1
                    self._serve(conn)
            except (NodeNameTaken, NotASession) as exc:
                # Another live process holds this node's name (it took it while we were away): two
                # live processes of one name could take each other's jobs. Or the lifeline's
                # connection is no session of its own (a pooler in transaction mode): its lock
                # would prove nothing. Either way, stop the node.
                self._lock_held = False
                self.error = exc
                log.error("node_name_taken" if isinstance(exc, NodeNameTaken) else "lifeline_not_a_session",
                          node=self.node.name, error=str(exc))
                self.registered.set()
                return
            except Exception as exc:
                self._lock_held = False  # the session that held it is gone
                if not self.registered.is_set() and not isinstance(exc, (psycopg.OperationalError, OSError)):
                    # Registration failed for good (a DSN libpq cannot parse...): the runner reports it.
                    self.error = exc if isinstance(exc, SenddockError) else error_line(exc, dsns=[self._dsn])
                    self.registered.set()
                    return
                if self._stop_event.is_set():
                    break
                log.warning("lifeline_lost", error=error_line(exc, dsns=[self._dsn]), retry_in=backoff)
                self._stop_event.wait(backoff)
                backoff = min(backoff * 2, self._heartbeat)

    def _connect(self) -> psycopg.Connection:
        name = self.node.name or "?"
        return psycopg.connect(self._dsn, **self._db.session_kwargs(application_name=f"senddock-lifeline {name}"[:63]))

    def _serve(self, conn: psycopg.Connection) -> None:
        # Before the lock: a lock proves this incarnation alive only within the epoch it was taken in.
        # The completer compares it with its own: a change means results may be lost even where its
        # connection never broke (behind a pooler).
        known_epoch = self.epoch
        self.epoch = ensure_epoch(conn).id
        if shares_sessions(conn, self._connect):
            # Before any lock is taken: through a pooler it would stay with a server connection
            # after the node is gone. (An idle pooler hands the same server connection back every
            # time, so the lock checks below alone may pass; a second client's transaction shows it.)
            raise NotASession(NOT_A_SESSION)
        name = claim_name(conn, self.node.name or None, node_id=self.node.id, lock_class=LOCK_CLASS,
                          lease=self._lease, stopping=self._stop_event, reconnecting=self.lock_id is not None)
        # On every connection: a promoted standby may have lost the row (see node_register). A new
        # node has settled in the current epoch; a returning one in the epoch it knew, and must
        # settle in a new one (the completer does, see journal).
        self.node = replace(self.node, name=name)
        self.lock_id = conn.execute(
            query("node_register"),
            {"node_id": self.node.id, "name": self.node.name, "host": self.node.host, "pid": self.node.pid,
             "settled_epoch": known_epoch or self.epoch, "config_digest": self.config_digest},
        ).fetchone()[0]
        self._take_lock(conn)
        check_lock_is_ours(conn, LOCK_CLASS, self.lock_id)
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        self._beat(conn)
        self._lock_held = True
        self.registered.set()
        log.info("lifeline_up", node=self.node.name, node_id=str(self.node.id), lock_id=self.lock_id)
        self._wake()  # work may have arrived while we were away
        next_beat = time.monotonic() + self._heartbeat
        while not self._stop_event.is_set():
            timeout = max(0.0, min(next_beat - time.monotonic(), STOP_CHECK))
            woke = False
            for _ in conn.notifies(timeout=timeout, stop_after=1):
                woke = True
            if woke:
                self._wake()
            if time.monotonic() >= next_beat:
                self._beat(conn)
                next_beat = time.monotonic() + self._heartbeat
        self._lock_held = False
        conn.execute(query("node_stopped"), {"node_id": self.node.id})

    def _take_lock(self, conn: psycopg.Connection) -> None:
        """After a reconnect the old session may linger on the server for a moment: wait for it."""
        deadline = time.monotonic() + self._lease
        while not conn.execute(query("node_lock"), {"lock_class": LOCK_CLASS, "lock_id": self.lock_id}).fetchone()[0]:
            if time.monotonic() > deadline or self._stop_event.is_set():
                raise psycopg.OperationalError("the node's lifeline lock is still held by an old session")
            time.sleep(0.2)

    def _beat(self, conn: psycopg.Connection) -> None:
        # The time before the statement: heartbeat_at is the statement's start on the database.
        sent = time.monotonic()
        with self._waits.watch("heartbeat", conn):
            row = conn.execute(query("node_heartbeat"),
                               {"node_id": self.node.id, "lock_class": LOCK_CLASS, "lock_id": self.lock_id}).fetchone()
        if row is None:
            # Not the session that holds our lock: a pooler moved us (a lock that is gone comes
            # with a broken connection, which raises).
            self._lock_held = False
            raise NotASession(NOT_A_SESSION)
        self._last_ok = sent



def list_nodes(conn: psycopg.Connection, lease: float) -> list[dict]:
    """Live nodes and those seen in the last day: heartbeat age, jobs in flight, alive or not."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("nodes_list"), {"lease": lease}).fetchall()
