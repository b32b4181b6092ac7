"""From a queued job to the Message handed to ``send_message``: templates rendered for the
recipient, list and unsubscribe headers, the DKIM signer.

Shared by the senders of ``senddock run``, ``campaign preview``, ``campaign send``'s sample check and ``send-test``, so
all four produce the same message for the same subscriber.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from senddock.config import Config
from senddock.errors import InvalidInput
from senddock.mail import headertext, mime, unsubscribe, verp
from senddock.mail.addresses import stored_mailbox_problem
from senddock.mail.signing import signer_from_config
from senddock.mail.render_limits import render_limits
from senddock.mail.templates import CampaignTemplates, TemplateError, context_for
from senddock.outcome import CampaignContent, Message, MessageSigner, Recipient

ONE_CLICK = "List-Unsubscribe=One-Click"  # RFC 8058's List-Unsubscribe-Post value


class BadRecipient(InvalidInput):
    """The recipient's address or name cannot go into a header (a line break, a control
    character): that one job fails as ``bad_address``, and nothing is sent to the relay."""


def check_recipient(recipient: Recipient) -> None:
    """Raise BadRecipient when the address or name would not fit on its header line.

    Imports make names one line; this catches what reached the database another way.
    """
    if problem := headertext.problem(recipient.email):
        raise BadRecipient(f"address {recipient.email!r} contains {problem}")
    if problem := headertext.problem(recipient.name):
        raise BadRecipient(f"subscriber {recipient.email}: name {recipient.name!r} contains {problem}")


@dataclass(frozen=True)
class PreparedCampaign:
    """What is computed once per campaign: compiled templates, the sender's domain, List-Id."""

    content: CampaignContent
    templates: CampaignTemplates
    domain: str
    list_id: str


class Composer:
    def __init__(self, config: Config, *, signer: MessageSigner | None = None) -> None:
        self.unsubscribe = config.unsubscribe
        self.signer = signer or signer_from_config(config.dkim, config.folder)
        # The first key signs; older ones listed after it only verify (senddock.bounces).
        self._bounce_secret = next(iter(config.bounces.secrets), None)
        self._prepared: dict[int, PreparedCampaign] = {}
        self._lock = threading.Lock()
        self.render_limits = render_limits(config.templates)

    def prepare(self, content: CampaignContent) -> PreparedCampaign:
        """Compile a campaign's templates (raises TemplateError); cached per campaign."""
        prepared = self._prepared.get(content.campaign_id)
        if prepared is None or prepared.content != content:
            # A From or Reply-To stored before they were checked strictly (a list) would fail every
            # send of the campaign: its first send pauses it with the reason instead.
            for field, header, value in (("from", "From", content.from_addr),
                                         ("reply_to", "Reply-To", content.reply_to)):
                if value and (problem := stored_mailbox_problem(value)):
                    raise TemplateError(field, f"the campaign's {header} {value!r} is not usable: {problem}")
            prepared = PreparedCampaign(
                content=content,
                templates=CampaignTemplates.compile(content.subject, content.text_body, content.html_body,
                                                    limits=self.render_limits),
                # Parsed once per campaign: address parsing costs more than the rest of a Message.
                domain=(domain := mime.sender_domain(content.from_addr)),
                # RFC 2919: one id per list, stable across campaigns, so receivers can group and filter.
                list_id=mime.list_id(content.list_name, content.list_id, domain),
            )
            with self._lock:
                self._prepared[content.campaign_id] = prepared
        return prepared

    def warm_up(self) -> None:
        """Build and serialise two made-up messages (never sent), a text one and an HTML-only one,
        so what a node's first sends would load (email_validator's grammar, inscriptis for the text
        part of HTML, the email package's header classes, the DKIM signer) is loaded at start: not
        by every sender at once, each waiting on the import lock with its send begun (a paced burst
        then reaches the relay as late as the slowest of them)."""
        body = "Hello {{ subscriber.name }}"
        for text, html in ((body, None), (None, f"<p>{body}</p>")):  # an HTML-only one: its text part too
            content = CampaignContent(0, "warm-up", body, "warm-up@example.com", text_body=text, html_body=html,
                                      list_name="warm-up")
            prepared = self.prepare(content)
            with self._lock:
                self._prepared.pop(content.campaign_id, None)  # campaign ids start at 1: 0 is no campaign
            message = self.message(prepared, Recipient("warm-up@example.com", "Warm Up", {}, None), job_id=0,
                                   broadcast_id=0, attempt=1)
            mime.message_bytes(message)

    def message(
        self,
        prepared: PreparedCampaign,
        recipient: Recipient,
        *,
        job_id: int,
        broadcast_id: int,
        attempt: int,
        message_id: str | None = None,
    ) -> Message:
        """The job's Message; raises BadRecipient when the recipient's address or name cannot go
        into a header, TemplateError when the recipient's data does not render."""
        check_recipient(recipient)
        campaign = prepared.content
        links = self._unsubscribe_links(recipient, campaign.campaign_id)
        context = context_for(recipient, campaign, links.get("url") or links.get("mailto"))
        content = prepared.templates.render(context)
        # A preview or a test send (job 0) is no job: its bounces must name none.
        token = verp.make_token(self._bounce_secret, broadcast_id, job_id) if self._bounce_secret and job_id else None
        return Message(
            job_id=job_id,
            broadcast_id=broadcast_id,
            attempt=attempt,
            recipient=recipient,
            campaign=campaign,
            message_id=message_id or mime.message_id_for(broadcast_id, job_id, prepared.domain, token),
            content=content,
            headers=self._headers(prepared, links, broadcast_id, job_id),
            signer=self.signer,
            bounce_token=token,
        )

    def _unsubscribe_links(self, recipient: Recipient, campaign_id: int) -> dict[str, str]:
        settings, links = self.unsubscribe, {}
        if recipient.subscriber_id is None or not settings.secret:
            return links
        token = unsubscribe.make_token(settings.secret, recipient.subscriber_id, campaign_id)
        if settings.url:
            links["url"] = unsubscribe.unsubscribe_url(settings.url, token)
        if settings.mailto:
            links["mailto"] = f"mailto:{settings.mailto}?subject={quote('unsubscribe ' + token)}"
        return links

    @staticmethod
    def _headers(prepared: PreparedCampaign, links: Mapping[str, str], broadcast_id: int, job_id: int) -> dict[str, Any]:
        campaign = prepared.content
        headers = {
            "List-Id": prepared.list_id,
            # Gmail's feedback loop groups complaints by these fields.
            "Feedback-ID": f"{campaign.campaign_id}:{broadcast_id}:senddock:{mime.ascii_domain(prepared.domain)}",
            # Lets bounces and complaints that quote the message be matched back to the job.
            "X-Senddock-Job": f"{broadcast_id}.{job_id}",
        }
        targets = [links[k] for k in ("url", "mailto") if k in links]
        if targets:
            headers["List-Unsubscribe"] = ", ".join(f"<{t}>" for t in targets)
            if "url" in links and links["url"].startswith("https://"):
                # RFC 8058: one-click only for an HTTPS URI (and the header must be DKIM-signed).
                headers["List-Unsubscribe-Post"] = ONE_CLICK
        return headers

