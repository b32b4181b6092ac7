"""A node's name, held by one live process at a time, and a lifeline that really is one session.

A name's earlier incarnations are recovered at once when their lock is gone (a restart resumes in
a second). That is only safe if two live processes never share a name: each holds the session
advisory lock ``(NAME_LOCK_CLASS, hashtext(name))`` on its lifeline for its whole life. An
explicit name (``--node``, ``node.name``) held by a live process is refused with who holds it;
without one, a process takes the first free of ``HOST``, ``HOST-2``, ``HOST-3``..., so two
processes on one host get two names and a restarted one gets its old name back.

Session locks need a real session. Behind a pooler in transaction mode, each transaction may run
on another server connection: the lock would belong to whichever session ran that statement, and
other clients' transactions would run on it. :func:`check_lock_is_ours` asks the server whether
the lock is held by the very backend answering, and a lifeline refuses to start when it is not.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid

import psycopg

from senddock.store.queries import query
from senddock.errors import DatabaseError, UsageError

NAME_LOCK_CLASS = 0x5E4E
MAX_DEFAULT_SLOTS = 100


class NodeNameTaken(UsageError):
    """The node name is held by a live process."""


NOT_A_SESSION = (
    "the node's lifeline is not a database session of its own: its connection goes through a pooler in "
    "transaction mode (PgBouncer pool_mode=transaction), where its advisory lock would prove nothing. Set "
    "database.direct_dsn to a direct or session-pooled connection for the lifeline")


class NotASession(DatabaseError):
    """The lifeline's connection is not one server session (a pooler in transaction mode)."""


def claim_name(conn: psycopg.Connection, requested: str | None, *, node_id: uuid.UUID, lock_class: int,
               lease: float, stopping: threading.Event, reconnecting: bool = False) -> str:
    """Take and hold the node's name: ``requested``, or the first free default slot. ``node_id``:
    this incarnation; ``reconnecting``: its lifeline is coming back, so a name it cannot take for
    want of a live holder is worth another try later (``OperationalError``), not a refusal."""
    if requested:
        _take(conn, requested, node_id=node_id, lock_class=lock_class, lease=lease, stopping=stopping,
              reconnecting=reconnecting)
        return requested
    host = socket.gethostname()
    for slot in range(1, MAX_DEFAULT_SLOTS + 1):
        name = host if slot == 1 else f"{host}-{slot}"
        try:
            _take(conn, name, node_id=node_id, lock_class=lock_class, lease=lease, stopping=stopping)
            return name
        except NodeNameTaken:
            continue
    raise NodeNameTaken(f"node names {host} to {host}-{MAX_DEFAULT_SLOTS} are all held by live nodes: "
                        "give one with {=node}")


def _take(conn: psycopg.Connection, name: str, *, node_id: uuid.UUID, lock_class: int, lease: float,
          stopping: threading.Event, reconnecting: bool = False) -> None:
    """Hold ``name``. A live incarnation holding it (heartbeat within the lease) refuses it at once.
    Otherwise its holder is gone and only its session lingers on the server: a dead host's (kept
    until TCP keepalive notices, possibly hours) or this node's own from before a network cut.
    Those lifeline sessions are ended, then the name taken; a gone node past its lease may have
    its jobs taken by anyone anyway, and it stops sending on its own before that."""
    deadline = time.monotonic() + lease
    params = {"name_class": NAME_LOCK_CLASS, "name": name, "node_id": node_id, "lock_class": lock_class}
    while not conn.execute(query("node_name_lock"), params).fetchone()[0]:
        holder = conn.execute(query("node_name_holder"), params).fetchone()
        if holder is not None and holder[3] < lease:
            host, pid, started_at, age = holder
            raise NodeNameTaken(
                f"node name {name!r} is held by a live node (host {host}, pid {pid}, running since "
                f"{started_at:%Y-%m-%d %H:%M:%S %Z}, last heartbeat {age:.0f}s ago): give this one another "
                "{=node}, or stop that one (a node that is gone is taken over once its heartbeat is older than "
                "recovery.lease)")
        conn.execute(query("node_name_end_lingering"), params)
        if time.monotonic() > deadline or stopping.is_set():
            message = f"node name {name!r} is held by another database session that is not a live senddock node"
            if reconnecting:
                raise psycopg.OperationalError(message)
            raise NodeNameTaken(message + ": give another {=node}")
        time.sleep(0.2)


def check_lock_is_ours(conn: psycopg.Connection, lock_class: int, lock_id: int) -> None:
    """Raise :class:`NotASession` unless the backend answering holds the node's lock."""
    for _ in range(3):  # a transaction pooler moves statements between server connections
        ours = conn.execute(query("node_lock_is_ours"), {"lock_class": lock_class, "lock_id": lock_id}).fetchone()[0]
        if not ours:
            raise NotASession(NOT_A_SESSION)
