"""Who claims: a node's identity as the queue's rows record it, and the advisory lock's class."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

# First key of every node's advisory lock: pg_advisory_lock(LOCK_CLASS, nodes.lock_id).
LOCK_CLASS = 0x5E4D


@dataclass(frozen=True)
class NodeIdentity:
    id: uuid.UUID
    name: str
    host: str
    pid: int

    @classmethod
    def new(cls, name: str) -> NodeIdentity:
        """``name`` may be empty until the lifeline has chosen one (see node_names)."""
        return cls(id=uuid.uuid4(), name=name, host=socket.gethostname(), pid=os.getpid())
