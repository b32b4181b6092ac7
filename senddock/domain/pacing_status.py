"""Pacing as it stands, per limit: rate configured, effective (adaptive pacing's factor in force)
and measured (sends begun in the last minute), for `status` and `campaign status`.

One statement (``pacing_status``): `campaign status --watch` runs it every refresh. Sends are
counted by campaign and recipient domain in SQL and matched to domain groups here, with
``PacingSettings.group_for``, exactly as the claimer matches them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import psycopg

from senddock.store.queries import query
from senddock.pacing.limits import PacingSettings
from senddock.pacing.rates import Rate, format_rate_like, parse_rate

#: The span the measured rate is taken over (the statement's `interval '1 minute'`).
MEASURED_OVER = 60.0


@dataclass(frozen=True)
class LimitStatus:
    key: str  # global, transport:NAME, domain:GROUP, campaign:ID
    configured: Rate | None  # None: a domain group with a concurrency but no rate
    factor: float  # adaptive pacing's factor in force: 1 unless a provider throttled the limit
    sends_last_minute: int | None  # None: not known here (another transport's limit)

    @property
    def effective_per_second(self) -> float | None:
        return None if self.configured is None else self.configured.per_second * self.factor

    @property
    def measured_per_second(self) -> float | None:
        return None if self.sends_last_minute is None else self.sends_last_minute / MEASURED_OVER

    def columns(self) -> list[str]:
        """limit, configured, effective, measured: for a table, in the configured rate's unit."""
        if self.configured is None:
            configured = effective = "-"
        else:
            configured = self.configured.text
            effective = format_rate_like(self.effective_per_second, self.configured)
            if self.factor < 1:
                effective += f" ({self.factor:.0%}: throttled)"
        if self.sends_last_minute is None:
            measured = "-"
        else:
            like = self.configured or parse_rate("1/s")
            measured = format_rate_like(self.measured_per_second, like)
        return [self.key, configured, effective, measured]

    def as_dict(self) -> dict[str, Any]:
        return {
            "limit": self.key,
            "configured": None if self.configured is None else self.configured.text,
            "configured_per_second": None if self.configured is None else self.configured.per_second,
            "burst": None if self.configured is None else self.configured.burst,
            "factor": self.factor,
            "effective_per_second": self.effective_per_second,
            "sends_last_minute": self.sends_last_minute,
            "measured_per_second": self.measured_per_second,
        }


def pacing_status(conn: psycopg.Connection, pacing: PacingSettings, *, transport: str,
                  campaign_id: int | None = None) -> tuple[LimitStatus, ...]:
    """Every configured limit, most general first, then the campaigns' own rates: the one asked
    for (``campaign_id``), or every sending campaign's. Nothing when nothing is configured.
    ``transport``: this node's, whose limit every send counts towards (attempts do not record
    their transport, so another transport's limit shows no measured rate)."""
    configured: list[tuple[str, Rate | None]] = []
    if pacing.global_rate is not None:
        configured.append(("global", pacing.global_rate))
    configured += [(f"transport:{name}", rate) for name, rate in pacing.transports.items()]
    configured += [(f"domain:{group.name}", group.rate) for group in pacing.domains]
    params = {"keys": [key for key, _ in configured], "configured": bool(configured), "campaign_id": campaign_id}
    campaign_rates, factors, recent = conn.execute(query("pacing_status"), params).fetchone()
    for row in sorted(campaign_rates, key=lambda r: r["campaign_id"]):
        try:
            configured.append((f"campaign:{row['campaign_id']}", parse_rate(row["send_rate"])))
        except ValueError:
            continue  # a rate stored by a newer version, unreadable here: shown nowhere rather than wrongly
    if not configured:
        return ()

    in_force = {} if pacing.adaptive is None else {
        row["key"]: pacing.adaptive.in_force(row["factor"], row["halved_ago"], row.get("ceiling")) for row in factors}
    total, by_group, by_campaign = 0, Counter[str](), Counter[int]()
    for row in recent:
        total += row["sends"]
        by_campaign[row["campaign_id"]] += row["sends"]
        group = pacing.group_for(row["domain"])
        if group is not None:
            by_group[group.name] += row["sends"]

    def measured(key: str) -> int | None:
        kind, _, name = key.partition(":")
        if kind == "global":
            return total
        if kind == "transport":
            return total if name == transport else None
        if kind == "domain":
            return by_group[name]
        return by_campaign[int(name)]

    return tuple(
        LimitStatus(key=key, configured=rate,
                    factor=in_force.get(key, 1.0),
                    sends_last_minute=measured(key))
        for key, rate in configured
    )
