"""What the dashboard's pages show, read with the same functions as `campaign status`, `campaign
log`, `campaign history` and `status` (senddock.api.Senddock), plus the per-minute activity the
charts draw. Functions here block on the database: the routes call them in a thread."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from psycopg.rows import dict_row

from senddock.api import Senddock
from senddock.domain import campaign_control
from senddock.domain.campaigns import Campaign, CampaignStatus
from senddock.store.queries import query

LOG_ROWS = 100  # attempts shown at once; a search by address narrows them
OVERVIEW_ROWS = 100  # campaigns on the front page, newest first
ACTIVE = ("sending", "scheduled", "paused")


@dataclass(frozen=True)
class Progress:
    """A campaign's progress as the bar, the counts and the live refresh show it."""

    status: CampaignStatus
    per_second: float  # jobs done per second over the last minute
    eta_seconds: float | None  # at that rate; None when not sending or nothing moves

    @property
    def done(self) -> int:
        return self.status.sent + self.status.failed

    @property
    def eta(self) -> str:
        return format_eta(self.eta_seconds)

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.status.total if self.status.total else 0.0

    def as_dict(self) -> dict[str, Any]:
        s = self.status
        return {"campaign_id": s.campaign_id, "status": s.status, "total": s.total, "done": self.done,
                "percent": round(self.percent, 1), "pending": s.pending, "sending": s.sending, "retry": s.retry,
                "sent": s.sent, "failed": s.failed, "bounced": s.bounced, "skipped": s.skipped,
                "per_second": round(self.per_second, 2), "per_minute": round(self.per_second * 60),
                "eta_seconds": None if self.eta_seconds is None else round(self.eta_seconds),
                "eta": format_eta(self.eta_seconds), "paused_reason": s.paused_reason, "warning": s.warning}


def progress(sd: Senddock, campaign_id: int) -> Progress:
    status = sd.campaign_status(campaign_id)  # NotFound for an unknown id
    per_second = 0.0
    if status.broadcast_id is not None and status.status == "sending":
        with sd.db.connection() as conn:
            done, seconds = conn.execute(query("campaign_recent_done"), {"campaign_id": campaign_id}).fetchone()
        per_second = done / seconds if seconds and seconds > 1 else 0.0
    remaining = status.total - status.sent - status.failed
    eta = remaining / per_second if status.status == "sending" and per_second > 0 and remaining > 0 else None
    return Progress(status=status, per_second=per_second, eta_seconds=eta)


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@dataclass(frozen=True)
class CampaignRow:
    """A line of the front page."""

    id: int
    name: str
    status: str
    lists: list[str]
    created_at: datetime
    enqueued: int | None  # None: never sent (a draft, or cancelled before its send)
    progress: Progress | None  # only for a campaign in flight


def overview(sd: Senddock) -> list[CampaignRow]:
    """The newest campaigns, the ones in flight first. Those in flight with their counts (what
    `campaign status` counts, from every job: a finished campaign's are on its own page, rather
    than one count over its jobs per campaign ever sent at each visit)."""
    summaries = sorted(sd.campaigns(), key=lambda c: (c.status not in ACTIVE, -c.id))[:OVERVIEW_ROWS]
    return [CampaignRow(id=c.id, name=c.name, status=c.status, lists=c.lists, created_at=c.created_at,
                        enqueued=c.enqueued,
                        progress=progress(sd, c.id) if c.broadcast_id is not None and c.status in ACTIVE else None)
            for c in summaries]


@dataclass(frozen=True)
class CampaignPage:
    campaign: Campaign
    progress: Progress
    minutes: list[dict[str, Any]]  # campaign_activity rows, oldest first
    in_doubt: list[str]  # recipients who may have received two copies
    log: list[dict[str, Any]]
    log_search: str | None
    history: list[campaign_control.CampaignEvent]


def campaign_page(sd: Senddock, campaign_id: int, *, email: str | None = None) -> CampaignPage:
    campaign = sd.campaign(campaign_id)
    minutes: list[dict[str, Any]] = []
    if campaign.broadcast_id is not None:
        with sd.db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            minutes = cur.execute(query("campaign_activity"), {"broadcast_id": campaign.broadcast_id,
                                                                "since": campaign.started_at or campaign.created_at,
                                                                "until": _activity_end(campaign)}).fetchall()
    in_doubt = sorted({row["email"] for row in sd.delivery_log(campaign_id, in_doubt=True)})
    return CampaignPage(
        campaign=campaign, progress=progress(sd, campaign_id), minutes=minutes, in_doubt=in_doubt,
        log=sd.delivery_log(campaign_id, email=email or None, limit=LOG_ROWS), log_search=email or None,
        history=sd.campaign_history(campaign_id, 20))


def _activity_end(campaign: Campaign) -> datetime:
    """The charts show the hour up to now while it sends, up to its end (or its pause) otherwise."""
    if campaign.status in ("finished", "cancelled") and campaign.finished_at is not None:
        return campaign.finished_at
    if campaign.status == "paused" and campaign.paused_at is not None:
        return campaign.paused_at
    return datetime.now(timezone.utc)
