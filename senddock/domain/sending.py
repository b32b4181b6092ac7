"""Before a campaign is sent: every check that refuses it or warns, in the order a sender would
meet the problem. The CLI, the Python API and (later) the HTTP API send through these, so each
refuses the same campaign with the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import psycopg

from senddock.config import UnsubscribeSettings
from senddock.domain.campaigns import (EmptyValue, MissingAttribute, SampleRecipient, campaign_content, check_content,
                                       check_not_sent, empty_values, missing_attributes, sample_recipients)
from senddock.errors import InvalidInput, InvalidState, UsageError
from senddock.mail import mime, unsubscribe
from senddock.mail.render_limits import RenderLimits
from senddock.outcome import CampaignContent, Message, Recipient

if TYPE_CHECKING:  # Jinja2 and cryptography: loaded by the commands that render
    from senddock.mail.compose import Composer


@dataclass(frozen=True)
class Checked:
    """A campaign that passed the checks made on the database: what the sample render needs."""

    campaign_id: int
    content: CampaignContent
    sample: list[SampleRecipient]
    warnings: tuple[str, ...]


def check_send_at(send_at: datetime | None) -> None:
    if send_at is None:
        return
    if send_at.tzinfo is None:
        raise InvalidInput("{=send_at}: give the time with its zone, e.g. 2026-12-24T09:00:00+01:00")
    refuse_past(send_at)


def check_unsubscribe_links(campaign_id: int, settings: UnsubscribeSettings) -> None:
    """Bulk mail without List-Unsubscribe is what Gmail and Yahoo refuse: refused unless asked."""
    if missing := unsubscribe.missing_links(settings):
        raise InvalidState(f"campaign {campaign_id} not sent: {missing}; or pass {{=no_unsubscribe}} to send "
                           "without (a test list, a relay of your own)")


def check_campaign(conn: psycopg.Connection, campaign_id: int, *, unsubscribe_configured: bool,
                   limits: RenderLimits) -> Checked:
    """Not sent yet, addresses usable, templates valid, every attribute they need present (checked
    for every recipient, set-based); empty values that would be written out are warned about."""
    check_not_sent(conn, campaign_id)
    content = CampaignContent(**campaign_content(conn, campaign_id))
    check_stored_addresses(content, prefix=f"campaign {campaign_id} not sent")
    try:
        analysis = check_content(content.subject, content.text_body, content.html_body,
                                 unsubscribe_configured=unsubscribe_configured, limits=limits)
    except InvalidInput as exc:
        raise InvalidInput(f"campaign {campaign_id} not sent: {exc.template}") from None
    missing = missing_attributes(conn, campaign_id, list(analysis.required))
    if missing:
        raise InvalidInput(missing_attributes_message(campaign_id, missing, analysis.required))
    # Not refused (an empty name may be fine), but said: "for " ending 400 subjects was not.
    warnings = tuple(empty_value_warning(e, analysis.printed[e.key])
                     for e in empty_values(conn, campaign_id, list(analysis.printed)))
    return Checked(campaign_id, content, sample_recipients(conn, campaign_id), warnings)


def check_sample_renders(composer: Composer, checked: Checked) -> None:
    """A sample render, for what reading the templates cannot tell (a value of the wrong type...)."""
    from senddock.mail.compose import BadRecipient
    from senddock.mail.templates import TemplateError

    prepared = composer.prepare(checked.content)
    for row in checked.sample:
        try:
            composer.message(prepared, recipient(row), job_id=0, broadcast_id=0, attempt=1)
        except BadRecipient:
            continue  # that one job will fail as bad_address; the templates are what is checked here
        except TemplateError as exc:
            raise InvalidInput(
                f"campaign {checked.campaign_id} not sent: its template does not render for subscriber "
                f"{row.subscriber_id} ({row.email}): {exc}"
            ) from None


def render_one(composer: Composer, content: CampaignContent, row: SampleRecipient, *, kind: str) -> Message:
    """The campaign's message for one subscriber, exactly as a node's sender would build it, under a
    one-off Message-ID of ``kind`` (preview, test); a template that does not render is one line."""
    from senddock.mail.templates import TemplateError

    try:
        return composer.message(composer.prepare(content), recipient(row), job_id=0, broadcast_id=0, attempt=1,
                                message_id=mime.one_off_message_id(kind, mime.sender_domain(content.from_addr)))
    except TemplateError as exc:  # what preview is for: say where, in one line
        raise InvalidInput(f"campaign {content.campaign_id}: its template does not render for subscriber "
                           f"{row.subscriber_id} ({row.email}): {exc}") from None


# A time this close behind the clock is taken as "now" (clock skew, a command typed a few seconds
# late); further back it is a mistake: the campaign would go out at once under a "scheduled" line.
PAST_SEND_AT_GRACE = timedelta(minutes=1)


def refuse_past(send_at: datetime) -> None:
    """A ``send_at`` more than :data:`PAST_SEND_AT_GRACE` ago is a mistake, refused."""
    from senddock.durations import rough_duration

    behind = datetime.now(timezone.utc) - send_at
    if behind > PAST_SEND_AT_GRACE:
        raise UsageError(f"{{=send_at}} {send_at.isoformat()} is in the past ({rough_duration(behind.total_seconds())} "
                         "ago): leave {=send_at} out to send now")


def check_stored_addresses(content: CampaignContent, *, prefix: str) -> None:
    """A From or Reply-To stored before `campaign create` checked them strictly that the message
    builder cannot use (a list) is one clear line here, not a traceback."""
    from senddock.mail.addresses import stored_mailbox_problem

    for header, option, value in (("From", "{=from_addr}", content.from_addr), ("Reply-To", "{=reply_to}", content.reply_to)):
        if value and (problem := stored_mailbox_problem(value)):
            raise InvalidInput(f"{prefix}: its {header} {value!r} is not usable: {problem}; edit the campaign "
                               f"with another {option}")


def missing_attributes_message(campaign_id: int, missing: list[MissingAttribute],
                                where: Mapping[str, str]) -> str:
    """One line (what `--json` carries as its error): who lacks what, and how to fix it."""
    parts = []
    for m in missing:
        who = "1 recipient lacks" if m.missing == 1 else f"{m.missing} recipients lack"
        more = ", ..." if m.missing > len(m.examples) else ""
        parts.append(f"{who} the attribute {m.key!r} read at {where[m.key]} (e.g. {', '.join(m.examples)}{more})")
    key = missing[0].key
    variable = f"subscriber.attributes.{key}" if key.isidentifier() else f"subscriber.attributes[{key!r}]"
    return (f"campaign {campaign_id} not sent, nothing enqueued: {'; '.join(parts)}; give it a default in the "
            f"template ({{{{ {variable} | default(\"...\") }}}}) or import a CSV with a {key!r} column for "
            "them, then send again")


def empty_value_warning(empty: EmptyValue, where: str) -> str:
    """One line: how many get a gap in their text, where, and what fills it."""
    who = "1 recipient has" if empty.empty == 1 else f"{empty.empty} recipients have"
    more = ", ..." if empty.empty > len(empty.examples) else ""
    key = empty.key.removeprefix("attributes.")
    variable = "subscriber.name" if empty.key == "name" else (
        f"subscriber.attributes.{key}" if key.isidentifier() else f"subscriber.attributes[{key!r}]")
    return (f"{who} an empty {variable}, written out at {where} with nothing in its place (e.g. "
            f"{', '.join(empty.examples)}{more}): give it a default that covers empty values, "
            f"{{{{ {variable} | default(\"...\", true) }}}}")


def recipient(row: SampleRecipient) -> Recipient:
    """A sampled subscriber as a message's recipient."""
    return Recipient(row.email, row.name, row.attributes, row.subscriber_id)
