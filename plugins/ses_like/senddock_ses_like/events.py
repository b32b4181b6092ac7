"""SES event notifications (bounce, complaint, delivery), as SNS delivers them or bare.

Accepted shapes: the SNS envelope (``Type: Notification`` with ``Message`` a JSON string), the
bare SES message (``notificationType`` for identity notifications, ``eventType`` for
configuration-set event publishing), and ``SubscriptionConfirmation`` / ``UnsubscribeConfirmation``
envelopes (no events: ``senddock serve`` confirms subscriptions itself). Unknown fields are
ignored; a notification may list several recipients.

What suppresses (the provider's word, SES developer guide "notification contents"):
* ``Bounce`` with ``bounceType: Permanent``: every sub-type. ``Suppressed`` and
  ``OnAccountSuppressionList`` mean SES itself already suppresses the address; mirroring it
  locally keeps it suppressed if the sender ever switches transport.
* ``Complaint``: always.
* ``Transient`` and ``Undetermined`` bounces and ``Delivery``: recorded on the job, nobody suppressed
  at once; ``Transient`` ones about the mailbox (``General``, ``MailboxFull``) count towards
  senddock's ``bounces.soft.limit``, those that refused our message (``MessageTooLarge``,
  ``ContentRejected``, ``AttachmentRejected``) never do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from senddock.outcome import EventError, ProviderEvent

_SNS_TYPES = {"Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation"}


def is_ses_document(document: Mapping[str, Any]) -> bool:
    return (document.get("Type") in _SNS_TYPES and "TopicArn" in document) or (
        isinstance(document.get("mail"), Mapping)
        and (document.get("notificationType") or document.get("eventType")) is not None
    )


def parse(document: Mapping[str, Any]) -> list[ProviderEvent]:
    """The events of one SES document; :class:`EventError` when it is SES's but unreadable."""
    if document.get("Type") in _SNS_TYPES:
        if document["Type"] != "Notification":
            return []
        try:
            document = json.loads(document["Message"])
        except (KeyError, TypeError, ValueError) as exc:
            raise EventError(f"SNS notification whose Message is not a JSON document ({exc})") from None
        if not isinstance(document, Mapping):
            raise EventError("SNS notification whose Message is not a JSON object")
    kind = document.get("notificationType") or document.get("eventType")
    mail = document.get("mail")
    if not isinstance(mail, Mapping):
        raise EventError("SES notification without a 'mail' object")
    message_id = mail.get("messageId")
    job_id = _job_tag(mail)
    if kind == "Bounce":
        return _bounces(document.get("bounce"), message_id, job_id)
    if kind == "Complaint":
        return _complaints(document.get("complaint"), message_id, job_id)
    if kind == "Delivery":
        return _deliveries(document.get("delivery"), message_id, job_id, mail)
    if kind in ("Send", "Reject", "Open", "Click", "Rendering Failure", "DeliveryDelay", "Subscription"):
        return []  # event-publishing types senddock does not act on
    raise EventError(f"unknown SES notification type {kind!r}")


# Transient sub-types about our message, not the address (SES developer guide, bounce types).
REFUSED_OUR_MESSAGE = ("MessageTooLarge", "ContentRejected", "AttachmentRejected")


def _bounces(bounce: Any, message_id: str | None, job_id: int | None) -> list[ProviderEvent]:
    if not isinstance(bounce, Mapping) or not isinstance(bounce.get("bouncedRecipients"), list):
        raise EventError("Bounce notification without bounce.bouncedRecipients")
    bounce_type, sub_type = bounce.get("bounceType"), bounce.get("bounceSubType")
    feedback = bounce.get("feedbackId") or f"{message_id}:{bounce.get('timestamp')}"
    return [
        ProviderEvent(
            kind="bounce",
            email=_address(r),
            provider_message_id=message_id,
            event_key=f"ses:bounce:{feedback}:{_address(r).lower()}",
            suppresses=bounce_type == "Permanent",
            bounce_type=bounce_type,
            sub_type=sub_type,
            diagnostic=r.get("diagnosticCode") or r.get("status") or "",
            job_id=job_id,
            occurred_at=bounce.get("timestamp"),
            about_recipient=sub_type not in REFUSED_OUR_MESSAGE,
        )
        for r in bounce["bouncedRecipients"]
    ]


def _complaints(complaint: Any, message_id: str | None, job_id: int | None) -> list[ProviderEvent]:
    if not isinstance(complaint, Mapping) or not isinstance(complaint.get("complainedRecipients"), list):
        raise EventError("Complaint notification without complaint.complainedRecipients")
    feedback = complaint.get("feedbackId") or f"{message_id}:{complaint.get('timestamp')}"
    return [
        ProviderEvent(
            kind="complaint",
            email=_address(r),
            provider_message_id=message_id,
            event_key=f"ses:complaint:{feedback}:{_address(r).lower()}",
            suppresses=True,
            sub_type=complaint.get("complaintFeedbackType") or complaint.get("complaintSubType"),
            diagnostic=complaint.get("userAgent") or "",
            job_id=job_id,
            occurred_at=complaint.get("timestamp"),
        )
        for r in complaint["complainedRecipients"]
    ]


def _deliveries(delivery: Any, message_id: str | None, job_id: int | None, mail: Mapping) -> list[ProviderEvent]:
    if not isinstance(delivery, Mapping):
        raise EventError("Delivery notification without a delivery object")
    recipients = delivery.get("recipients") or mail.get("destination") or []
    return [
        ProviderEvent(
            kind="delivery",
            email=str(email),
            provider_message_id=message_id,
            event_key=f"ses:delivery:{message_id}:{str(email).lower()}",
            diagnostic=delivery.get("smtpResponse") or "",
            job_id=job_id,
            occurred_at=delivery.get("timestamp"),
        )
        for email in recipients
    ]


def _address(recipient: Any) -> str:
    if not isinstance(recipient, Mapping) or not isinstance(recipient.get("emailAddress"), str):
        raise EventError("a recipient without an emailAddress")
    return recipient["emailAddress"]


def _job_tag(mail: Mapping[str, Any]) -> int | None:
    """The senddock-job tag the transport set (event publishing echoes tags back as lists)."""
    value = (mail.get("tags") or {}).get("senddock-job")
    if isinstance(value, list):
        value = value[0] if value else None
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
