"""Campaigns, their broadcast (the enqueue), and status read from the jobs themselves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import class_row, dict_row

from senddock.domain.campaign_rate import send_rate_text
from senddock.domain.lists import get_list
from senddock.store.queries import query
from senddock.errors import InvalidInput, InvalidState, NotFound
from senddock.mail.addresses import check_mailbox
from senddock.mail.render_limits import DEFAULT_LIMITS, RenderLimits
from senddock.pacing.rates import campaign_rate_view
from senddock.wording import is_status

if TYPE_CHECKING:
    from senddock.domain.pacing_status import LimitStatus
if TYPE_CHECKING:  # Jinja2 (~25 ms to import) for the commands that check templates, not `campaign status`
    from senddock.mail.templates import Analysis

_TEMPLATE_OPTION = {"subject": "{=subject}", "text": "{=text_body}", "html": "{=html_body}"}


@dataclass(frozen=True)
class Campaign:
    id: int
    name: str
    subject: str
    from_addr: str
    reply_to: str | None
    text_body: str | None
    html_body: str | None
    status: str
    paused_reason: str | None
    broadcast_id: int | None
    send_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    paused_at: datetime | None
    auto_resume: bool  # paused for relay trouble: resumes by itself once the relay answers a probe
    probe_at: datetime | None
    probes: int
    probe_result: str | None
    bounce_window_from: int | None
    send_rate: str | None  # its own rate as stored: `100/min`, `100/min burst 5` (send_rate_text)
    lists: list[str]
    # When its broadcast's per-recipient rows were pruned (retention), and the counts kept then.
    pruned_at: datetime | None = None
    final_counts: dict[str, Any] | None = None


@dataclass(frozen=True)
class CampaignSummary:
    id: int
    name: str
    subject: str
    status: str
    broadcast_id: int | None
    send_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    enqueued: int | None
    send_rate: str | None
    lists: list[str]


@dataclass(frozen=True)
class EnqueueResult:
    campaign_id: int
    broadcast_id: int
    enqueued: int
    skipped: int
    skipped_suppressed: int
    skipped_unsubscribed: int
    warnings: tuple[str, ...] = ()  # sent anyway, but worth a look (values that render empty)


@dataclass(frozen=True)
class CampaignStatus:
    """The broadcast's counts, from the tallies its jobs keep (failed includes bounced; skipped kept on the broadcast)."""

    campaign_id: int
    status: str
    paused_reason: str | None
    broadcast_id: int | None
    # Its own rate, as the config spells one: {"rate": "100/min", "burst": 1}; None: only the config's pacing.
    rate: dict[str, Any] | None = None
    # A pause for relay trouble resumes by itself: when the next probe is due, how many failed, the last answer.
    auto_resume: bool = False
    next_probe_at: datetime | None = None
    probes_failed: int = 0
    last_probe: str | None = None
    total: int = 0
    pending: int = 0
    sending: int = 0
    retry: int = 0
    sent: int = 0
    failed: int = 0
    bounced: int = 0  # refused at the send (failed as bounced)
    skipped: int = 0
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    # Told after the send (bounces by mail, SES notifications), one per job.
    later_hard: int = 0
    later_soft: int = 0
    complaints: int = 0
    # A pause senddock made itself (not `campaign pause`): when, and what the operator should know.
    paused_at: datetime | None = None
    warning: str | None = None
    # Per pacing limit, rate configured / effective / measured (senddock.domain.pacing_status); empty
    # when no limit is configured.
    pacing: tuple[LimitStatus, ...] = ()
    # When the per-recipient rows were pruned (retention): the counts above are those kept then.
    pruned_at: datetime | None = None

    @property
    def reached(self) -> int:
        """Messages a receiving server answered for: sent, or refused as bounced."""
        return self.sent + self.bounced

    @property
    def bounce_summary(self) -> dict[str, Any]:
        """Hard, soft and complaint counts with their rates: bounces over the messages that reached a
        server, complaints over those sent, against the complaint rate Gmail and Yahoo hold bulk
        senders to."""
        hard = self.bounced + self.later_hard
        return {
            "hard": hard, "soft": self.later_soft, "complaints": self.complaints,
            "hard_rate": _share(hard, self.reached), "soft_rate": _share(self.later_soft, self.reached),
            "complaint_rate": _share(self.complaints, self.sent), "complaint_rate_limit": COMPLAINT_RATE_LIMIT,
        }

    def as_dict(self) -> dict[str, Any]:
        counts = {k: v for k, v in asdict(self).items() if k not in ("later_hard", "later_soft", "complaints")}
        return {**counts, "bounces": self.bounce_summary, "pacing": [limit.as_dict() for limit in self.pacing]}


# Gmail's and Yahoo's bulk sender rules (2024): keep spam complaints below 0.3%.
COMPLAINT_RATE_LIMIT = 0.003


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


@dataclass(frozen=True)
class CampaignDraft:
    """A campaign's content as the operator gives it: what `campaign create` and `campaign edit` check."""

    name: str
    lists: tuple[str, ...]
    subject: str
    from_addr: str
    reply_to: str | None = None
    text_body: str | None = None
    html_body: str | None = None
    send_rate: str | None = None  # stored form, from send_rate_text


def check_draft(conn: psycopg.Connection, draft: CampaignDraft, *, unsubscribe_configured: bool,
                limits: RenderLimits = DEFAULT_LIMITS) -> tuple[CampaignDraft, list[int]]:
    """Every check a campaign's content must pass, the same at create and at edit: one function,
    so a check added here holds for both. Returns the draft normalised (name trimmed, addresses as
    they will be stored) and the ids of its lists; raises InvalidInput / NotFound naming the option.
    """
    if not draft.name.strip():
        raise InvalidInput("{=name}: a campaign needs a name")
    if not draft.subject.strip():
        raise InvalidInput("{=subject}: a campaign needs a subject")
    if not draft.lists:
        raise InvalidInput("{=lists}: a campaign needs at least one list")
    if draft.text_body is None and draft.html_body is None:
        raise InvalidInput("a campaign needs a body: give {=text_body} and/or {=html_body}")
    from_addr = check_mailbox(draft.from_addr, what="{=from_addr}")
    reply_to = check_mailbox(draft.reply_to, what="{=reply_to}") if draft.reply_to else None
    check_content(draft.subject, draft.text_body, draft.html_body, unsubscribe_configured=unsubscribe_configured,
                  limits=limits)
    list_ids = [get_list(conn, list_name).id for list_name in draft.lists]
    return replace(draft, name=draft.name.strip(), from_addr=from_addr, reply_to=reply_to,
                   lists=tuple(dict.fromkeys(draft.lists))), list_ids


def create_campaign(
    conn: psycopg.Connection,
    *,
    name: str,
    lists: Sequence[str],
    subject: str,
    from_addr: str,
    reply_to: str | None = None,
    text_body: str | None = None,
    html_body: str | None = None,
    rate: str | None = None,
    burst: int | None = None,
    unsubscribe_configured: bool = False,
    limits: RenderLimits = DEFAULT_LIMITS,
) -> int:
    """``unsubscribe_configured``: the config has an unsubscribe link to offer (see check_content).
    ``rate`` (``100/min``) with its ``burst``: the campaign's own limit (see send_rate_text).
    ``limits``: what one render may cost (the config's ``templates``)."""
    send_rate = send_rate_text(rate, burst)  # before anything is written: a bad rate creates nothing
    with conn.transaction():
        draft, list_ids = check_draft(conn, CampaignDraft(
            name=name, lists=tuple(lists), subject=subject, from_addr=from_addr, reply_to=reply_to,
            text_body=text_body, html_body=html_body, send_rate=send_rate),
            unsubscribe_configured=unsubscribe_configured, limits=limits)
        campaign_id = conn.execute(
            query("campaign_create"),
            {
                "name": draft.name,
                "subject": draft.subject,
                "from_addr": draft.from_addr,
                "reply_to": draft.reply_to,
                "text_body": draft.text_body,
                "html_body": draft.html_body,
                "send_rate": draft.send_rate,
            },
        ).fetchone()[0]
        for list_id in list_ids:
            conn.execute(query("campaign_add_list"), {"campaign_id": campaign_id, "list_id": list_id})
    return campaign_id


def check_content(subject: str, text_body: str | None, html_body: str | None, *,
                  unsubscribe_configured: bool, limits: RenderLimits = DEFAULT_LIMITS) -> Analysis:
    """Refuse templates that cannot render for anyone: a syntax error, or a variable that never
    exists (``{{ name }}`` for ``{{ subscriber.name }}``), each named with its option and line.
    Returns what the templates read (the attributes every recipient must have: see send).

    ``unsubscribe_configured``: whether ``unsubscribe_url`` exists (an ``unsubscribe`` section with a
    secret and a url or mailto); a template using it is refused without one.
    """
    from senddock.mail.templates import CampaignTemplates, TemplateError, analyse, trial_render, variable_list

    try:
        trial_render(CampaignTemplates.compile(subject, text_body, html_body, limits=limits), unsubscribe_configured)
    except TemplateError as exc:
        line = f"line {exc.line}: " if exc.line else ""
        raise InvalidInput(f"{_TEMPLATE_OPTION[exc.field]}: template error, {line}{exc.detail}") from None
    analysis = analyse(subject, text_body, html_body, unsubscribe_configured=unsubscribe_configured)
    if analysis.problems:
        lines = [f"{_TEMPLATE_OPTION[p.field]}, line {p.line}: {p.detail}" for p in analysis.problems]
        # One line: it is what `--json` carries as its error.
        raise InvalidInput("; ".join(lines) + f"; the variables are: {variable_list()}")
    return analysis


def get_campaign(conn: psycopg.Connection, campaign_id: int) -> Campaign:
    with conn.cursor(row_factory=class_row(Campaign)) as cur:
        found = cur.execute(query("campaign_get"), {"campaign_id": campaign_id}).fetchone()
    if found is None:
        raise NotFound(f"no campaign with id {campaign_id}")
    return found


@dataclass(frozen=True)
class SampleRecipient:
    subscriber_id: int
    email: str
    name: str
    attributes: dict[str, Any]


def sample_recipients(conn: psycopg.Connection, campaign_id: int, each: int = 20) -> list[SampleRecipient]:
    """Some of the subscribers a send would reach (the oldest and the newest ``each``)."""
    list_ids = [row[0] for row in conn.execute(query("campaign_list_ids"), {"campaign_id": campaign_id})]
    with conn.cursor(row_factory=class_row(SampleRecipient)) as cur:
        return cur.execute(query("campaign_sample_recipients"), {"list_ids": list_ids, "each": each}).fetchall()


@dataclass(frozen=True)
class MissingAttribute:
    key: str
    missing: int  # recipients without it
    examples: list[str]  # up to 5 of their addresses


def missing_attributes(conn: psycopg.Connection, campaign_id: int, keys: Sequence[str]) -> list[MissingAttribute]:
    """The attributes among ``keys`` that some recipient a send would enqueue lacks."""
    if not keys:
        return []
    list_ids = [row[0] for row in conn.execute(query("campaign_list_ids"), {"campaign_id": campaign_id})]
    with conn.cursor(row_factory=class_row(MissingAttribute)) as cur:
        return cur.execute(query("campaign_missing_attributes"), {"list_ids": list_ids, "keys": list(keys)}).fetchall()


@dataclass(frozen=True)
class EmptyValue:
    key: str  # name, or attributes.KEY
    empty: int  # recipients whose value is empty
    examples: list[str]  # up to 5 of their addresses


def empty_values(conn: psycopg.Connection, campaign_id: int, keys: Sequence[str]) -> list[EmptyValue]:
    """The values among ``keys`` (``name``, ``attributes.KEY``) that some recipient a send would
    enqueue has empty."""
    if not keys:
        return []
    list_ids = [row[0] for row in conn.execute(query("campaign_list_ids"), {"campaign_id": campaign_id})]
    with conn.cursor(row_factory=class_row(EmptyValue)) as cur:
        return cur.execute(query("campaign_empty_values"), {"list_ids": list_ids, "keys": list(keys)}).fetchall()


def subscriber_by_email(conn: psycopg.Connection, email: str) -> SampleRecipient | None:
    with conn.cursor(row_factory=class_row(SampleRecipient)) as cur:
        return cur.execute(query("subscriber_by_email"), {"email": email}).fetchone()


def campaign_content(conn: psycopg.Connection, campaign_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(query("campaign_content"), {"campaign_id": campaign_id}).fetchone()
    if found is None:
        raise NotFound(f"no campaign with id {campaign_id}")
    return found


def all_campaigns(conn: psycopg.Connection) -> list[CampaignSummary]:
    with conn.cursor(row_factory=class_row(CampaignSummary)) as cur:
        return cur.execute(query("campaign_all")).fetchall()


def check_not_sent(conn: psycopg.Connection, campaign_id: int) -> None:
    """Refuse a campaign that was sent before the checks of its recipients scan them for nothing
    (send_campaign checks again under its lock: this is the early answer, not the guard)."""
    campaign = get_campaign(conn, campaign_id)
    _refuse_unless_draft(campaign_id, campaign.status, campaign.broadcast_id)


def _refuse_unless_draft(campaign_id: int, status: str, broadcast_id: int | None) -> None:
    if status != "draft" and broadcast_id is None:  # cancelled before it was sent
        raise InvalidState(
            f"campaign {campaign_id} {is_status(status)} (it was never sent): `senddock campaign clone {campaign_id}` "
            "makes a draft of it to send")
    if status != "draft":
        raise InvalidState(
            f"campaign {campaign_id} was already sent (broadcast {broadcast_id}, status {status}); a campaign is "
            f"sent once: `senddock campaign clone {campaign_id}` makes a draft of it to send again"
        )


def send_campaign(conn: psycopg.Connection, campaign_id: int, send_at: datetime | None = None) -> EnqueueResult:
    """Create the campaign's broadcast and enqueue one pending job per recipient, in one transaction.

    Only active subscribers of the campaign's lists whose address is not suppressed are enqueued;
    the rest are counted as skipped. With nobody to enqueue nothing changes (InvalidState): the
    campaign stays a draft. Nodes are woken with NOTIFY when the transaction commits.
    """
    with conn.transaction():
        locked = conn.execute(query("campaign_lock"), {"campaign_id": campaign_id}).fetchone()
        if locked is None:
            raise NotFound(f"no campaign with id {campaign_id}")
        _, status, broadcast_id = locked
        _refuse_unless_draft(campaign_id, status, broadcast_id)
        list_ids = [row[0] for row in conn.execute(query("campaign_list_ids"), {"campaign_id": campaign_id})]
        broadcast_id = conn.execute(query("broadcast_create"), {"campaign_id": campaign_id}).fetchone()[0]
        with conn.cursor(row_factory=dict_row) as cur:
            counts = cur.execute(
                query("broadcast_enqueue"), {"broadcast_id": broadcast_id, "list_ids": list_ids}
            ).fetchone()
        if not counts["enqueued"]:
            # Raised inside the transaction: the broadcast goes with it and the campaign stays a
            # draft, to send once its lists have someone to reach (a send is once only).
            raise InvalidState(_nobody_to_send_to(conn, campaign_id, counts))
        params = {**counts, "broadcast_id": broadcast_id, "campaign_id": campaign_id, "send_at": send_at}
        conn.execute(query("broadcast_record_counts"), params)
        conn.execute(query("campaign_start"), params)
        conn.execute(query("notify_jobs"), params)
    return EnqueueResult(
        campaign_id=campaign_id,
        broadcast_id=broadcast_id,
        enqueued=counts["enqueued"],
        skipped=counts["skipped_suppressed"] + counts["skipped_unsubscribed"],
        skipped_suppressed=counts["skipped_suppressed"],
        skipped_unsubscribed=counts["skipped_unsubscribed"],
    )


def _nobody_to_send_to(conn: psycopg.Connection, campaign_id: int, counts: dict[str, int]) -> str:
    from senddock.wording import plural

    names = get_campaign(conn, campaign_id).lists
    lists = f"{'list' if len(names) == 1 else 'lists'} {', '.join(names)}"
    suppressed, unsubscribed = counts["skipped_suppressed"], counts["skipped_unsubscribed"]
    if not suppressed + unsubscribed:
        why = f"its {lists} {'has' if len(names) == 1 else 'have'} no subscribers"
    else:
        why = (f"all {plural(suppressed + unsubscribed, 'subscriber')} of its {lists} would be skipped "
               f"({suppressed} suppressed, {unsubscribed} unsubscribed or blocklisted)")
    return f"campaign {campaign_id} not sent: nobody to send to, {why}; it is still a draft"


def campaign_status(conn: psycopg.Connection, campaign_id: int) -> CampaignStatus:
    campaign = get_campaign(conn, campaign_id)
    base = {
        "campaign_id": campaign.id,
        "status": campaign.status,
        "paused_reason": campaign.paused_reason,
        "broadcast_id": campaign.broadcast_id,
        "rate": campaign_rate_view(campaign.send_rate),
    }
    if campaign.status == "paused":
        base.update(paused_at=campaign.paused_at, warning=pause_warning(campaign))
    if campaign.status == "paused" and campaign.auto_resume:
        base.update(auto_resume=True, next_probe_at=campaign.probe_at, probes_failed=campaign.probes,
                    last_probe=campaign.probe_result)
    if campaign.broadcast_id is None:
        return CampaignStatus(**base)
    if campaign.final_counts is not None:  # pruned: the counts it had then, forever
        return CampaignStatus(**base, **campaign.final_counts, pruned_at=campaign.pruned_at)
    # One statement: `status --watch` calls this every refresh, and nothing of it stays open between.
    with conn.cursor(row_factory=dict_row) as cur:
        counts = cur.execute(query("broadcast_counts"), {"broadcast_id": campaign.broadcast_id}).fetchone()
    return CampaignStatus(**base, **counts)


OPERATOR_PAUSE = "paused by the operator"


def pause_warning(campaign: Campaign) -> str | None:
    """What an operator must know about a pause senddock made itself; None for their own pause."""
    reason = campaign.paused_reason
    if reason is None or reason == OPERATOR_PAUSE:
        return None
    cid = campaign.id
    if campaign.auto_resume:
        todo = "it resumes by itself once the relay answers a probe"
    elif reason == "bounce_rate":
        todo = (f"too many recipients bounced: read `senddock campaign log {cid} --outcome bounce`; if the "
                f"bounces are real, `senddock campaign resume {cid}`; if the relay lied, `senddock campaign "
                f"unsuppress {cid} --since-pause` first")
    elif reason.startswith(("template_error: from:", "template_error: reply_to:")):
        option = "--from" if reason.startswith("template_error: from:") else "--reply-to"
        todo = (f"nothing could be sent with that address: `senddock campaign cancel {cid}`, then "
                f"`senddock campaign clone {cid}`, `senddock campaign edit NEW_ID {option} ADDR` and send the copy")
    elif reason.startswith("template_error"):
        todo = (f"a recipient's data does not render (their job waits in line, nothing failed): correct it "
                f"(`senddock subscribers import` the fixed rows), then `senddock campaign resume {cid}`")
    else:
        todo = (f"fix the cause, put back what failed for it with `senddock campaign requeue {cid} --reason "
                f"REASON`, then `senddock campaign resume {cid}`")
    return f"senddock paused this campaign: {reason}; {todo}"
