"""Sending through an SES-style HTTP API: boto3's ``sesv2`` ``send_email`` with Raw content.

The Raw content is the very MIME message the SMTP transport sends (``senddock.mail.mime``): same
headers, same Message-ID, same DKIM signature, so switching transports changes nothing the
recipient sees. One client per sender thread, the plugin's state for that thread (botocore clients
are cheap to reuse and hold a connection pool). The client's own retries are off: senddock's backoff
is the one that counts, and a retry inside the client would hide an in-doubt send.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import boto3
import structlog
from botocore.config import Config as BotoConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ReadTimeoutError,
)

from senddock.durations import parse_duration
from senddock.mail import mime
from senddock.outcome import Message, SendResult
from senddock_ses_like import TRANSPORT

log = structlog.get_logger(__name__)

# SES rewrites these of every message it sends: a DKIM signature covering them would break
# (AWS: "manual DKIM signing", which says not to sign Message-ID, Date, Return-Path, Bounces-To).
SES_REWRITES = ("Message-ID", "Date", "Return-Path", "Bounces-To")
# Errors that mean our request or account setup is wrong, not the recipient (see classify).
_CONFIGURATION_ERRORS = {"LimitExceededException", "NotFoundException", "BadRequestException"}


def client(settings: Mapping[str, Any]):
    """An ``sesv2`` client; credentials from the environment or boto3's usual chain, never the file."""
    timeout = parse_duration(settings["timeout"])
    return boto3.session.Session().client(
        "sesv2",
        region_name=settings["region"],
        endpoint_url=settings.get("endpoint_url"),
        config=BotoConfig(
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"max_attempts": 1, "mode": "standard"},  # one attempt: senddock retries
            user_agent_extra="senddock",
        ),
    )


def tags(message: Message) -> list[dict[str, str]]:
    """Message tags travel with SES events: a notification finds its job even when the provider's
    message id was never committed (a crash right after the send)."""
    return [
        {"Name": "senddock-campaign", "Value": str(message.campaign.campaign_id)},
        {"Name": "senddock-broadcast", "Value": str(message.broadcast_id)},
        {"Name": "senddock-job", "Value": str(message.job_id)},
    ]


def send(message: Message, settings: Mapping[str, Any], ses: Any) -> SendResult:
    """Send through ``ses``, this sender thread's :func:`client`."""
    request: dict[str, Any] = {
        "FromEmailAddress": mime.envelope_sender(message),
        "Destination": {"ToAddresses": [mime.ascii_address(message.recipient.email)]},
        "Content": {"Raw": {"Data": mime.message_bytes(message, unsigned_headers=SES_REWRITES)}},
        "EmailTags": tags(message),
    }
    if settings.get("configuration_set"):
        request["ConfigurationSetName"] = settings["configuration_set"]
    try:
        response = ses.send_email(**request)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if error.get("Code") in _CONFIGURATION_ERRORS:
            log.error("ses_configuration_problem", code=error.get("Code"), message=error.get("Message"),
                      configuration_set=settings.get("configuration_set"), job_id=message.job_id)
        return SendResult(TRANSPORT, ok=False, code=status, text=f"{error.get('Code', 'Error')}: {error.get('Message', '')}",
                          phase="api", error=exc)
    except (ReadTimeoutError, ConnectionClosedError) as exc:
        # The request went out; SendEmail has no idempotency token: it may have been accepted.
        return SendResult(TRANSPORT, ok=False, text=f"{type(exc).__name__}: {exc}", phase="api", error=exc,
                          may_have_sent=True)
    except BotoCoreError as exc:  # could not connect, DNS, credentials missing...
        return SendResult(TRANSPORT, ok=False, text=f"{type(exc).__name__}: {exc}", phase="connect", error=exc)
    message_id = response.get("MessageId")
    return SendResult(TRANSPORT, ok=True, code=response.get("ResponseMetadata", {}).get("HTTPStatusCode", 200),
                      text=f"accepted as {message_id}", phase="api", provider_message_id=message_id)


def probe(settings: Mapping[str, Any]) -> SendResult:
    """One cheap read call (GetAccount) to see whether the API answers again. Any answer but a
    throttle or a server error means it does: a refusal of our credentials, for one, is something
    the next send reports and pauses on for a person to fix."""
    ses = client(settings)
    try:
        ses.get_account()
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        answered = status < 500 and error.get("Code") not in ("Throttling", "ThrottlingException",
                                                               "TooManyRequestsException")
        return SendResult(TRANSPORT, ok=answered, code=status, phase="api",
                          text=f"{error.get('Code', 'Error')}: {error.get('Message', '')}")
    except BotoCoreError as exc:
        return SendResult(TRANSPORT, ok=False, text=f"{type(exc).__name__}: {exc}", phase="connect", error=exc)
    finally:
        ses.close()
    return SendResult(TRANSPORT, ok=True, code=200, phase="api", text="the API answered")
