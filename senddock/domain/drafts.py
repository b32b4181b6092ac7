"""Fixing campaigns: edit a draft, clone any campaign, delete one that is not being sent.

Each of them first locks the campaign's row (campaign_lock, FOR UPDATE), as `campaign send`
does: on two nodes, an edit or a delete racing a send either acts before the send (which then
waits for it) or sees the campaign sent and refuses. Neither acts on a state it did not see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import psycopg
from psycopg.rows import dict_row

from senddock.domain import campaigns
from senddock.mail.render_limits import DEFAULT_LIMITS, RenderLimits
from senddock.domain.campaign_rate import send_rate_text
from senddock.domain.campaigns import Campaign, CampaignDraft, get_campaign
from senddock.store.queries import query
from senddock.store.retention import drop_partitions
from senddock.errors import InvalidInput, InvalidState, NotFound, UsageError
from senddock.wording import is_status, plural

# What `campaign edit` can change, by the name its option and its JSON report use (`burst` goes
# with `rate`: it is part of the rate, never a change of its own).
EDITABLE = ("name", "subject", "from", "reply_to", "text", "html", "lists", "rate")
_DRAFT_FIELD = {"name": "name", "subject": "subject", "from": "from_addr", "reply_to": "reply_to",
                "text": "text_body", "html": "html_body", "lists": "lists", "rate": "send_rate"}


@dataclass(frozen=True)
class Edited:
    campaign_id: int
    changed: list[str]  # names from EDITABLE, in that order
    before: CampaignDraft
    after: CampaignDraft


@dataclass(frozen=True)
class Deleted:
    """What a delete removed; suppressions_kept: those its bounces made, left in place."""

    id: int
    status: str
    broadcast_id: int | None
    lists: int = 0
    jobs: int = 0
    delivery_attempts: int = 0
    delivery_events: int = 0
    claim_floors: int = 0
    campaign_events: int = 0  # its status changes (`campaign history`)
    suppressions_kept: int = 0


def _locked(conn: psycopg.Connection, campaign_id: int) -> Campaign:
    """The campaign, its row locked until the transaction ends."""
    if conn.execute(query("campaign_lock"), {"campaign_id": campaign_id}).fetchone() is None:
        raise NotFound(f"no campaign with id {campaign_id}")
    return get_campaign(conn, campaign_id)


def _draft_of(campaign: Campaign) -> CampaignDraft:
    return CampaignDraft(name=campaign.name, lists=tuple(campaign.lists), subject=campaign.subject,
                         from_addr=campaign.from_addr, reply_to=campaign.reply_to,
                         text_body=campaign.text_body, html_body=campaign.html_body, send_rate=campaign.send_rate)


def edit_campaign(conn: psycopg.Connection, campaign_id: int, *, unsubscribe_configured: bool = False,
                  burst: int | None = None, limits: RenderLimits = DEFAULT_LIMITS,
                  **changes: str | Sequence[str] | None) -> Edited:
    """Change a draft's content (keys of EDITABLE; ``reply_to=""`` removes the Reply-To,
    ``rate="none"`` its own rate; ``burst`` goes with ``rate``). The content as it would be after
    the edit goes through the same checks as `campaign create` (``unsubscribe_configured``: whether
    templates may use ``unsubscribe_url``)."""
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise TypeError(f"edit_campaign: cannot change {', '.join(sorted(unknown))}")
    if not changes and burst is None:
        raise UsageError("campaign edit: nothing to change: give at least one of {=name}, {=subject}, {=from_addr}, "
                         "{=reply_to}, {=text_body}, {=html_body}, {=lists}, {=rate}")
    if "rate" in changes or burst is not None:
        changes["rate"] = send_rate_text(changes.get("rate"), burst)  # refused before the lock
    with conn.transaction():
        campaign = _locked(conn, campaign_id)
        if campaign.status != "draft":
            raise InvalidState(_not_editable(campaign))
        before = _draft_of(campaign)
        wanted = {_DRAFT_FIELD[k]: (tuple(v) if k == "lists" else v) for k, v in changes.items()}
        # campaigns.check_draft, looked up at call time: create's own checks, whatever they become.
        after, list_ids = campaigns.check_draft(conn, replace(before, **wanted),
                                                unsubscribe_configured=unsubscribe_configured, limits=limits)
        changed = [k for k in EDITABLE if getattr(after, _DRAFT_FIELD[k]) != getattr(before, _DRAFT_FIELD[k])]
        if "lists" in changed and sorted(after.lists) == sorted(before.lists):
            changed.remove("lists")  # the same lists in another order
        if changed:
            conn.execute(query("campaign_update_content"), {
                "campaign_id": campaign_id, "name": after.name, "subject": after.subject,
                "from_addr": after.from_addr, "reply_to": after.reply_to, "text_body": after.text_body,
                "html_body": after.html_body, "send_rate": after.send_rate,
            })
        if "lists" in changed:
            conn.execute(query("campaign_lists_clear"), {"campaign_id": campaign_id})
            for list_id in list_ids:
                conn.execute(query("campaign_add_list"), {"campaign_id": campaign_id, "list_id": list_id})
    return Edited(campaign_id, changed, before, after)


def _not_editable(campaign: Campaign) -> str:
    clone = f"`senddock campaign clone {campaign.id}`"
    if campaign.status == "scheduled":
        when = campaign.send_at.isoformat() if campaign.send_at else "later"
        return (f"campaign {campaign.id} is scheduled for {when}: its recipients are enqueued and its templates "
                f"were checked against them, so it cannot change; cancel it (`senddock campaign cancel "
                f"{campaign.id}`), then edit a copy ({clone}) and send that")
    sent = f"was sent (broadcast {campaign.broadcast_id})" if campaign.broadcast_id else "is not a draft"
    return (f"campaign {campaign.id} is {campaign.status} and {sent}: only a draft can be edited; "
            f"to send a fixed version, make a draft copy with {clone} and edit that")


def clone_campaign(conn: psycopg.Connection, campaign_id: int, name: str | None = None) -> int:
    """A new draft with the content, rate and lists of campaign ``campaign_id`` (any state); its id."""
    if name is not None and not name.strip():
        raise InvalidInput("{=name}: a campaign needs a name")
    with conn.transaction():
        row = conn.execute(query("campaign_clone"),
                           {"campaign_id": campaign_id, "name": name.strip() if name else None}).fetchone()
    if row is None:
        raise NotFound(f"no campaign with id {campaign_id}")
    return row[0]


# Never sent: nothing in it is history. A scheduled campaign's jobs are all pending (nothing is
# claimed before it starts sending, and starting it needs the row this delete holds).
_UNSENT = ("draft", "scheduled")
# Its jobs may be claimed and in flight on any node at any moment: cancel first.
_LIVE = ("sending", "paused")


def delete_campaign(conn: psycopg.Connection, campaign_id: int, *, force: bool = False) -> Deleted:
    """Delete a campaign and what belongs to it alone, in one transaction; never its suppressions.

    A draft or a scheduled campaign goes as it is, and so does one cancelled before it was sent (no
    broadcast); a cancelled or finished one with a delivery history only with ``force``; a sending
    or paused one never: cancel it first.
    """
    with conn.transaction():
        campaign = _locked(conn, campaign_id)
        if campaign.status in _LIVE:
            raise InvalidState(
                f"campaign {campaign_id} is {campaign.status}: its jobs may be in flight on any node; cancel it "
                f"first (`senddock campaign cancel {campaign_id}`), then delete it with {{=force}}")
        params = {"campaign_id": campaign_id, "broadcast_id": campaign.broadcast_id}
        with conn.cursor(row_factory=dict_row) as cur:
            counts = cur.execute(query("campaign_delete_counts"), params).fetchone()
        if counts["in_flight"]:
            raise InvalidState(f"campaign {campaign_id} {is_status(campaign.status)} but {counts['in_flight']} of its sends "
                               "are still in flight: wait for them to finish (`senddock campaign status "
                               f"{campaign_id}` shows SENDING 0), then delete it")
        if counts["unapplied_bounces"]:
            raise InvalidState(f"campaign {campaign_id}: {counts['unapplied_bounces']} of its bounces are not yet "
                               "applied to the suppression list (a node running `senddock run` applies them "
                               "within a poll); deleting it now would lose them, so try again then")
        # A campaign cancelled before it was sent has no broadcast: no history to lose, no --force.
        if campaign.status not in _UNSENT and campaign.broadcast_id is not None and not force:
            raise InvalidState(
                f"campaign {campaign_id} is {campaign.status}: deleting it removes its delivery history "
                f"(broadcast {campaign.broadcast_id}: {plural(counts['jobs'], 'job')}, {counts['sent']} sent, "
                f"{plural(counts['delivery_attempts'], 'delivery attempt')}, "
                f"{plural(counts['delivery_events'], 'provider event')}); add {{=force}} to delete it anyway"
                + (f" (the {plural(counts['suppressions_kept'], 'suppression')} its bounces made "
                   f"{'is' if counts['suppressions_kept'] == 1 else 'are'} kept)" if counts["suppressions_kept"] else ""))
        with conn.cursor(row_factory=dict_row) as cur:
            removed = cur.execute(query("campaign_delete"), params).fetchone()
        if removed["in_flight"]:
            # A claim that was committing while this ran took some of its jobs: a send may be starting.
            raise InvalidState(f"campaign {campaign_id}: {removed['in_flight']} of its jobs were claimed by a "
                               "node meanwhile; nothing was deleted, cancel it and try again")
    if campaign.broadcast_id is not None:
        drop_partitions(conn, campaign.broadcast_id)  # emptied above: nothing of the broadcast is left
    return Deleted(
        id=campaign_id, status=campaign.status, broadcast_id=campaign.broadcast_id, lists=removed["lists"],
        jobs=removed["jobs"], delivery_attempts=removed["delivery_attempts"],
        delivery_events=removed["delivery_events"], claim_floors=removed["claim_floors"],
        campaign_events=removed["campaign_events"],
        suppressions_kept=counts["suppressions_kept"],
    )
