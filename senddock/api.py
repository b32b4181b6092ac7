"""The public Python API for applications that embed senddock; the CLI is a thin layer over it.

    with Senddock.open("config/senddock.yaml") as sd:
        sd.create_list("news")
        sd.add_subscriber("ada@example.com", name="Ada", lists=["news"])
        cid = sd.create_campaign(name="Hello", lists=["news"], subject="Hi", from_addr="me@example.com",
                                 text_body="Hello!")
        sd.send_campaign(cid)
        print(sd.campaign_status(cid).sent)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from senddock.config import Config
from senddock.loading import load_config
from senddock.config.digest import config_digest
from senddock.domain import campaign_control, campaigns, drafts, events, lists, sending, subscribers
from senddock.store import migrations, retention
from senddock.core import nodes, results
from senddock.domain.campaigns import (
    Campaign,
    CampaignStatus,
    CampaignSummary,
    EnqueueResult,
)
from senddock.store.db import Database
from senddock.domain.lists import MailingList
from senddock.domain.pacing_status import LimitStatus, pacing_status
from senddock.domain.subscribers import ImportSummary, Normalised, Rejection
from senddock.store.suppressions import Suppressions, list_suppressions, remove_suppression
from senddock.errors import DatabaseError, InvalidInput, NotFound
from senddock.mail import mime
from senddock.mail.addresses import check_address
from senddock.outcome import (
    CampaignContent,
    Classification,
    EventError,
    Message,
    SendResult,
)
from senddock.plugins import call_each
from senddock.webhooks import admin as webhook_admin
from senddock.config.webhooks import subscriptions

# Rendering (Jinja2, cryptography for DKIM) and address checks (email_validator) are imported by the
# methods that use them: a status query or a list must not load them (see bench/cli_latency.py).
if TYPE_CHECKING:
    from senddock.domain.mail_events import MailOutcome
    from senddock.mail.compose import Composer

__all__ = [
    "Senddock",
    "Campaign",
    "CampaignStatus",
    "CampaignSummary",
    "EnqueueResult",
    "ImportSummary",
    "MailingList",
    "Normalised",
    "Rejection",
]


class Senddock:
    """senddock opened on one configuration and its database."""

    def __init__(self, config: Config, *, database: Database | None = None) -> None:
        self.config = config
        self.db = database or Database(config.database)
        self.suppressions = Suppressions(self.db)
        self._schema_checked = False
        self._composer: Composer | None = None

    @classmethod
    def open(cls, config_path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None) -> Senddock:
        return cls(load_config(config_path, environ=environ))

    def __enter__(self) -> Senddock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    # -- schema ----------------------------------------------------------------------------------

    def migrate(self) -> list[migrations.Migration]:
        """Apply pending migrations (idempotent, safe to run from several nodes at once)."""
        with self.db.connect_session() as conn:
            if self.db.settings.direct_dsn is None and self.db.transaction_pooled:
                with self.db.connect() as lock_conn:
                    applied = migrations.migrate(conn, lock_conn=lock_conn)
            else:
                applied = migrations.migrate(conn)
        self._schema_checked = True
        return applied

    def ensure_schema(self) -> None:
        """Migrate when ``database.auto_migrate`` allows it; otherwise refuse a database that needs it."""
        if self._schema_checked:
            return
        with self.db.connection() as conn:
            todo = migrations.pending(conn)
        if todo:
            if not self.config.database.auto_migrate:
                names = ", ".join(f"{m.version:04d}_{m.name}" for m in todo)
                raise DatabaseError(f"the database needs migrations ({names}): run `senddock migrate`")
            self.migrate()
        self._schema_checked = True

    def _conn(self):
        self.ensure_schema()
        return self.db.connection()

    # -- lists and subscribers -------------------------------------------------------------------

    def create_list(self, name: str) -> int:
        with self._conn() as conn:
            return lists.create_list(conn, name)

    def lists(self) -> list[MailingList]:
        with self._conn() as conn:
            return lists.all_lists(conn)

    def add_subscriber(
        self,
        email: str,
        *,
        name: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        lists: Sequence[str] = (),
    ) -> int:
        with self._conn() as conn:
            return subscribers.add_subscriber(conn, email, name=name, attributes=attributes, lists=lists)

    def add_subscribers(self, emails: Sequence[str], *, lists: Sequence[str] = ()) -> list[int]:
        with self._conn() as conn:
            return subscribers.add_subscribers(conn, emails, lists=lists)

    def import_subscribers(
        self,
        path: str | os.PathLike[str],
        list_name: str,
        *,
        on_reject: Callable[[Rejection], None] = lambda r: None,
        on_progress: Callable[[int, int], None] = lambda done, total: None,
        on_normalise: Callable[[Normalised], None] = lambda n: None,
        encoding: str = "utf-8",
        on_fallback: Callable[[int], None] = lambda line: None,
    ) -> ImportSummary:
        with self._conn() as conn:
            return subscribers.import_csv(conn, path, list_name, on_reject=on_reject, on_progress=on_progress,
                                          on_normalise=on_normalise, encoding=encoding, on_fallback=on_fallback)

    # -- campaigns -------------------------------------------------------------------------------

    def create_campaign(
        self,
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
    ) -> int:
        """A draft campaign; its id. ``rate`` (``100/min``; N/s, N/min, N/h or N/day) with its
        optional ``burst``: the campaign's own limit, beside the config's pacing; a bad one raises
        UsageError and nothing is created."""
        with self._conn() as conn:
            return campaigns.create_campaign(
                conn,
                name=name,
                lists=lists,
                subject=subject,
                from_addr=from_addr,
                reply_to=reply_to,
                text_body=text_body,
                html_body=html_body,
                rate=rate,
                burst=burst,
                unsubscribe_configured=self._unsubscribe_configured(), limits=self._render_limits(),
            )

    def _render_limits(self):
        from senddock.mail.render_limits import render_limits

        return render_limits(self.config.templates)

    def _unsubscribe_configured(self) -> bool:
        return self.config.unsubscribe.configured

    def edit_campaign(self, campaign_id: int, **changes: Any) -> drafts.Edited:
        """Change a draft: any of ``name``, ``subject``, ``from``, ``reply_to`` ("" removes it), ``text``,
        ``html``, ``lists``, ``rate`` ("none" removes it) with ``burst``; the result is checked exactly as
        :meth:`create_campaign` checks its content.
        A campaign that was sent or scheduled raises InvalidState (clone it instead)."""
        with self._conn() as conn:
            return drafts.edit_campaign(conn, campaign_id, unsubscribe_configured=self._unsubscribe_configured(),
                                        limits=self._render_limits(),
                                        **changes)

    def clone_campaign(self, campaign_id: int, *, name: str | None = None) -> int:
        """A new draft with the campaign's content, rate and lists (any state); returns its id."""
        with self._conn() as conn:
            return drafts.clone_campaign(conn, campaign_id, name)

    def delete_campaign(self, campaign_id: int, *, force: bool = False) -> drafts.Deleted:
        """Delete a draft or scheduled campaign; a cancelled or finished one with ``force`` (its
        broadcast, jobs, delivery log and events go; the suppressions it caused stay)."""
        with self._conn() as conn:
            return drafts.delete_campaign(conn, campaign_id, force=force)

    def campaign(self, campaign_id: int) -> Campaign:
        with self._conn() as conn:
            return campaigns.get_campaign(conn, campaign_id)

    def campaigns(self) -> list[CampaignSummary]:
        with self._conn() as conn:
            return campaigns.all_campaigns(conn)

    def send_campaign(self, campaign_id: int, *, send_at: datetime | None = None,
                      require_unsubscribe: bool = False) -> EnqueueResult:
        """Enqueue the campaign's broadcast, once its templates rendered for a sample of recipients.

        With ``send_at`` (timezone-aware) in the future the campaign is ``scheduled``: its jobs are
        enqueued now and nothing is claimed before then. With ``require_unsubscribe`` (what `campaign
        send` does unless given --no-unsubscribe) a config without unsubscribe links is refused:
        bulk mail without List-Unsubscribe is what Gmail and Yahoo refuse.
        """
        sending.check_send_at(send_at)
        if require_unsubscribe:
            sending.check_unsubscribe_links(campaign_id, self.config.unsubscribe)
        with self._conn() as conn:
            checked = sending.check_campaign(conn, campaign_id, unsubscribe_configured=self._unsubscribe_configured(),
                                             limits=self._render_limits())
        sending.check_sample_renders(self.composer, checked)
        with self._conn() as conn:
            return replace(campaigns.send_campaign(conn, campaign_id, send_at), warnings=checked.warnings)

    def pause_campaign(self, campaign_id: int) -> None:
        """Stop claiming its jobs (every node, within a send); in-flight sends finish."""
        with self._conn() as conn:
            campaign_control.pause_campaign(conn, campaign_id, webhooks=subscriptions(self.config.data))

    def cancel_campaign(self, campaign_id: int) -> int:
        """Fail its unsent jobs as cancelled; returns how many."""
        with self._conn() as conn:
            return campaign_control.cancel_campaign(conn, campaign_id)

    def requeue_campaign(self, campaign_id: int, reason: str) -> int:
        """Put its jobs failed for ``reason`` back in line (never bounced, complained, unsubscribed,
        suppressed); returns how many."""
        with self._conn() as conn:
            return campaign_control.requeue_campaign(conn, campaign_id, reason)

    def set_campaign_rate(self, campaign_id: int, rate: str, *, burst: int | None = None) -> campaign_control.RateSet:
        """Give the campaign its own rate (``100/min``, with an optional ``burst``) or none (``"none"``):
        a draft, scheduled, sending or paused one (a finished or cancelled one raises InvalidState).
        Every node applies it from its next claim; a bad rate raises UsageError."""
        with self._conn() as conn:
            return campaign_control.set_campaign_rate(conn, campaign_id, rate, burst)

    @property
    def composer(self) -> Composer:
        if self._composer is None:
            from senddock.mail.compose import Composer

            self._composer = Composer(self.config)
        return self._composer

    def preview(self, campaign_id: int, *, email: str | None = None) -> tuple[Message, bytes]:
        """The campaign's message, rendered and signed for one subscriber (by default the first one
        the campaign reaches), exactly as a node's sender would build it."""
        with self._conn() as conn:
            content = CampaignContent(**campaigns.campaign_content(conn, campaign_id))
            sending.check_stored_addresses(content, prefix=f"campaign {campaign_id}")
            recipient = self._sample_subscriber(conn, campaign_id, email)
        message = sending.render_one(self.composer, content, recipient, kind="preview")
        return message, mime.message_bytes(message)

    def send_test(self, campaign_id: int, to: str, *, email: str | None = None) -> tuple[Message, SendResult, Classification]:
        """Render the campaign (for ``email``'s subscriber, or the first one) and send it to ``to``
        through the configured transport, synchronously; nothing is queued or recorded."""
        try:
            to = check_address(to)
        except ValueError as exc:
            raise InvalidInput(f"{{=to}}: {exc}") from None
        message, _ = self.preview(campaign_id, email=email)
        test_id = mime.one_off_message_id("test", mime.sender_domain(message.campaign.from_addr))
        message = replace(message, recipient=replace(message.recipient, email=to), message_id=test_id)
        pm, state = self.config.plugin_manager, {}
        try:
            result = results.send(pm, self.config, message, state)
            verdict = results.classify(pm, self.config, result, message)
        finally:
            call_each(pm.hook.worker_stopped, worker_state=state, config=self.config)
        return message, result, verdict

    def _sample_subscriber(self, conn, campaign_id: int, email: str | None) -> campaigns.SampleRecipient:
        if email is not None:
            found = campaigns.subscriber_by_email(conn, email)
            if found is None:
                raise NotFound(f"no subscriber {email}")
            return found
        sample = campaigns.sample_recipients(conn, campaign_id, each=1)
        if not sample:
            raise NotFound(f"campaign {campaign_id} reaches no active subscriber: give {{=email}}")
        return sample[0]

    def resume_campaign(self, campaign_id: int) -> None:
        """Put a paused campaign back to sending (after fixing what paused it); one paused before its
        ``send_at`` goes back to scheduled and starts at that time."""
        with self._conn() as conn:
            campaign_control.resume_campaign(conn, campaign_id)

    def unsuppress_campaign(self, campaign_id: int, *, since_pause: bool = True) -> campaign_control.Unsuppressed:
        """Undo the suppressions the campaign's bounces made (``since_pause``: those of the window that
        tripped its bounce-rate breaker) and put their jobs back in line; resume it afterwards."""
        with self._conn() as conn:
            return campaign_control.unsuppress_campaign(conn, campaign_id, since_pause=since_pause)

    def campaign_status(self, campaign_id: int) -> CampaignStatus:
        """Its counts, and its pacing limits (the configured ones and its own rate) as they stand."""
        with self._conn() as conn:
            status = campaigns.campaign_status(conn, campaign_id)
            limits = pacing_status(conn, self.config.pacing, transport=self.config.transport, campaign_id=campaign_id)
        return replace(status, pacing=limits)

    def pacing_status(self) -> tuple[LimitStatus, ...]:
        """Every pacing limit, rate configured / effective / measured over the last minute; the
        campaigns' own rates for those sending. Empty when no limit is configured."""
        with self._conn() as conn:
            return pacing_status(conn, self.config.pacing, transport=self.config.transport)

    def campaign_history(self, campaign_id: int, limit: int = 20) -> list[campaign_control.CampaignEvent]:
        """Its latest status changes, newest first: who paused it, when, why; when it resumed, finished."""
        with self._conn() as conn:
            return campaign_control.campaign_events(conn, campaign_id, limit)

    # -- provider notifications ------------------------------------------------------------------

    def ingest_event(self, document: Mapping[str, Any]) -> events.Applied:
        """Apply one provider notification (an SES/SNS bounce, complaint or delivery).

        Raises InvalidInput when no plugin reads it or it is malformed, and
        :class:`senddock.domain.events.UnknownMessage` when it is about a message no job sent.
        """
        self.ensure_schema()
        pm = self.config.plugin_manager
        try:
            parsed = pm.hook.parse_provider_event(document=document, config=self.config)
        except EventError as exc:
            raise InvalidInput(str(exc)) from None
        if parsed is None:
            raise InvalidInput("not a notification any installed plugin reads (e.g. SES via SNS)")
        return events.apply_events(self.db, pm, self.config, self.suppressions, parsed)

    def apply_mail(self, raw: bytes, *, via: str, origin: str | None = None,
                   envelope_recipients: Sequence[str] = ()) -> MailOutcome:
        """Read one message that came back by mail (a bounce, a complaint, a reply) and apply it:
        see :mod:`senddock.domain.mail_events`. ``via`` is receive, fetch or ingest;
        ``envelope_recipients``, the RCPT TO addresses when it arrived by SMTP."""
        from senddock.bounces.parsing import parse_mail
        from senddock.domain.mail_events import apply_mail

        self.ensure_schema()
        parsed = parse_mail(self.config, raw, envelope_recipients)
        return apply_mail(self.db, self.config.plugin_manager, self.config, self.suppressions, parsed,
                          via=via, origin=origin)

    def delivery_log(self, campaign_id: int, *, email: str | None = None, outcome: str | None = None,
                     in_doubt: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
        with self._conn() as conn:
            return campaign_control.delivery_log(conn, campaign_id, email=email, outcome=outcome, in_doubt=in_doubt,
                                                 limit=limit)

    def prune(self, *, dry_run: bool = False) -> retention.PruneReport:
        """Prune what the config's retention says is due now (see senddock.store.retention)."""
        with self._conn() as conn:
            return retention.prune_due(conn, self.config.retention, dry_run=dry_run)

    def prune_campaign(self, campaign_id: int, *, dry_run: bool = False) -> retention.Pruned:
        """Prune one ended campaign's broadcast detail now, whatever its age."""
        with self._conn() as conn:
            return retention.prune_campaign(conn, campaign_id, dry_run=dry_run)

    def nodes(self) -> list[dict[str, Any]]:
        """Live and recently seen nodes; ``config_matches``: whether a node's config digest equals
        this Senddock's config's (None for a node that recorded none)."""
        with self._conn() as conn:
            rows = nodes.list_nodes(conn, self.config.recovery.lease)
        ours = config_digest(self.config)
        return [{**row, "config_matches": None if row["config_digest"] is None else row["config_digest"] == ours}
                for row in rows]

    # -- webhooks --------------------------------------------------------------------------------

    def webhooks(self) -> dict[str, Any]:
        """Each endpoint with its events by status and its state, and the events failing lately."""
        with self._conn() as conn:
            return webhook_admin.status(conn, self.config.data)

    def replay_webhooks(self, *, event: str | None = None, since: datetime | None = None) -> list[dict[str, Any]]:
        with self._conn() as conn:
            return webhook_admin.replay(conn, event=event, since=since)

    def enable_webhook(self, which: str) -> str:
        with self._conn() as conn:
            return webhook_admin.enable(conn, self.config.data, which)

    # -- subscribers -----------------------------------------------------------------------------

    def unsubscribe(self, email: str) -> str:
        """Unsubscribe and suppress; returns the status now (a blocklisted subscriber stays so)."""
        with self._conn() as conn:
            return subscribers.set_status(conn, email, "unsubscribed", webhooks=subscriptions(self.config.data))

    def blocklist(self, email: str) -> str:
        with self._conn() as conn:
            return subscribers.set_status(conn, email, "blocklisted")

    def subscribers(self, list_name: str | None = None) -> list[dict[str, Any]]:
        with self._conn() as conn:
            return subscribers.list_subscribers(conn, list_name)

    def subscriber(self, email: str) -> dict[str, Any]:
        with self._conn() as conn:
            return subscribers.show_subscriber(conn, email)

    # -- suppressions ----------------------------------------------------------------------------

    def suppressions_list(self, *, reason: str | None = None, search: str | None = None) -> list[dict[str, Any]]:
        with self._conn() as conn:
            return list_suppressions(conn, reason=reason, search=search)

    def unsuppress(self, email: str) -> bool:
        """Future campaigns may reach the address again; nothing already failed is resent."""
        with self._conn() as conn:
            return remove_suppression(conn, email)

    def suppress(self, email: str, *, reason: str = "manual") -> bool:
        self.ensure_schema()
        return self.suppressions.add(email, reason=reason)
