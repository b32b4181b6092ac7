"""The server's epoch: which life of the Postgres server (between two losses of WAL) this is.

Results commit asynchronously, so a crash-restart or a failover can lose the last of them. An
UNLOGGED marker row (``server_epoch``, migration 3) is emptied by crash recovery and is empty on
a promoted standby; the first connection that finds it empty starts a new epoch. Claims record
their epoch, so recovery knows which batches' results may be gone, and the liveness proof of an
advisory lock counts only for locks taken in the current epoch.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import psycopg
import structlog

from senddock.store.queries import query

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ServerEpoch:
    id: uuid.UUID
    started_at: datetime
    new: bool  # started by this call: the database is new, or its server lost the end of its WAL
    in_flight: bool = False  # when it started here, jobs were being sent: they are recovered as in doubt


def ensure_epoch(conn: psycopg.Connection) -> ServerEpoch:
    """The current epoch, started here if there is none. Call it on every new connection before
    claiming, recovering or taking a node's lock (a crash breaks every connection first)."""
    for _ in range(5):
        # None: a concurrent starter won the insert after this statement's snapshot; ask again.
        row = conn.execute(query("server_epoch_ensure")).fetchone()
        if row is not None:
            epoch = ServerEpoch(*row)
            if epoch.new and epoch.in_flight:
                log.warning("server_epoch_started", epoch=str(epoch.id),
                            meaning="the database server lost the end of its WAL (a crash-restart, a failover): "
                                    "live nodes commit again what it lost before anyone claims, and the jobs of "
                                    "nodes that died while sending are recovered as in doubt")
            elif epoch.new:  # a new database, or a crash while nothing was being sent: nothing to fear
                log.info("server_epoch_started", epoch=str(epoch.id))
            return epoch
    raise psycopg.OperationalError("the server epoch could not be read")
