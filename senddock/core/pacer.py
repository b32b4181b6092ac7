"""The shared limiter: takes sends from the limits in ``pacing_limits``, for every node at once.

One statement per take (``pacing_take``): the limits a send is subject to (see
senddock.pacing.limits) are taken together, so a send is admitted by all of them or by none.
With adaptive pacing (senddock.pacing.adaptive), ``throttled`` halves the limits providers
throttled (``pacing_throttled``) and every take paces them at their factor in force.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import psycopg
import structlog

from senddock.store.queries import query
from senddock.pacing.adaptive import Adaptive
from senddock.pacing.limits import Limit

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Admission:
    wanted: int
    admitted: int  # 0..wanted: sends that may begin now; each limit has been charged for them
    at: datetime  # when the database decided (its clock_timestamp(); this machine's clock without limits)
    next_at: datetime | None  # when admitted < wanted: the earliest time the next send is allowed

    @property
    def wait(self) -> float:
        """Seconds from the decision until the next send is allowed (0 when all were admitted)."""
        return 0.0 if self.next_at is None else max(0.0, (self.next_at - self.at).total_seconds())


class Pacer:
    """Takes from shared limits on one connection (autocommit, or inside a READ COMMITTED
    transaction: the rows stay locked until it ends, so keep it short).

    A limit bounds sends as they begin; the relay counts them as they arrive. ``latency_margin``
    (seconds): how much later than the steady sends after them a burst's sends may reach the
    relay; each limit's tolerance keeps back what that would let a relay's second hold beyond
    rate + burst (``Rate.tolerance_within``)."""

    def __init__(self, conn: psycopg.Connection, adaptive: Adaptive | None = None,
                 latency_margin: float = 0.0) -> None:
        self.conn = conn
        self.adaptive = adaptive  # None: throttling changes nothing, and factors are not read
        self.latency_margin = latency_margin

    def take(self, limits: Sequence[Limit], n: int = 1) -> Admission:
        """Admit up to ``n`` sends under every one of ``limits`` at once."""
        if n < 1:
            raise ValueError(f"n must be at least 1, not {n}")
        if not limits:
            return Admission(wanted=n, admitted=n, at=datetime.now(timezone.utc), next_at=None)
        keys = [limit.key for limit in limits]
        if len(set(keys)) != len(keys):
            raise ValueError(f"a limit is named twice: {keys}")
        params = {
            "keys": keys,
            "intervals": [limit.rate.interval for limit in limits],
            "tolerances": [limit.rate.tolerance_within(self.latency_margin) for limit in limits],
            "n": n,
            "recovery": None if self.adaptive is None else self.adaptive.recovery,
        }
        admitted, at, next_at = self.conn.execute(query("pacing_take"), params).fetchone()
        return Admission(wanted=n, admitted=admitted, at=at, next_at=next_at)

    def throttled(self, keys: Sequence[str]) -> dict[str, float]:
        """A provider throttled sends under the limits ``keys`` (for a send, the one
        senddock.pacing.limits.throttled_limit names): halve each, unless it was halved less than
        ``hold`` ago. One statement for a whole batch of results. Returns the limits halved, with
        their new factor; nothing when adaptive pacing is off."""
        if self.adaptive is None or not keys:
            return {}
        params = {"keys": sorted(set(keys)), "floor": self.adaptive.floor, "recovery": self.adaptive.recovery,
                  "hold": self.adaptive.hold}
        halved = dict(self.conn.execute(query("pacing_throttled"), params).fetchall())
        for key, factor in sorted(halved.items()):
            log.warning("pacing_slowed", limit=key, factor=round(factor, 4))
        return halved
