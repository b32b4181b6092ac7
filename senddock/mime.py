"""Build the MIME message of a job: shared by every transport, so switching transports changes
nothing the recipient sees. Plugins may import this module (it is not part of the engine)."""

from __future__ import annotations

from email.headerregistry import Address
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime, getaddresses, localtime

from senddock.outcome import Message


def message_id_for(broadcast_id: int, job_id: int, domain: str) -> str:
    """Derived from the job, so a resend after a crash carries the same Message-ID."""
    return f"<senddock.{broadcast_id}.{job_id}@{domain}>"


def sender_domain(from_addr: str) -> str:
    [(_, address)] = getaddresses([from_addr]) or [("", "")]
    return address.rpartition("@")[2] or "localhost"


def envelope_sender(message: Message) -> str:
    return getaddresses([message.campaign.from_addr])[0][1]


def build_email(message: Message, *, message_id_domain: str | None = None) -> EmailMessage:
    campaign = message.campaign
    email = EmailMessage(policy=SMTP)
    email["From"] = campaign.from_addr
    recipient = message.recipient
    email["To"] = Address(display_name=recipient.name, addr_spec=recipient.email) if recipient.name else recipient.email
    if campaign.reply_to:
        email["Reply-To"] = campaign.reply_to
    email["Subject"] = campaign.subject
    email["Date"] = format_datetime(localtime())
    email["Message-ID"] = message_id_for(
        message.broadcast_id, message.job_id, message_id_domain or sender_domain(campaign.from_addr)
    )
    email["X-Senddock-Broadcast"] = f"{message.broadcast_id}.{message.job_id}"
    if campaign.text_body is not None:
        email.set_content(campaign.text_body)
        if campaign.html_body is not None:
            email.add_alternative(campaign.html_body, subtype="html")
    else:
        email.set_content(campaign.html_body or "", subtype="html")
    return email
