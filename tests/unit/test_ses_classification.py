"""The ses_like classification table: one case per row. Nothing is ever suppressed at send time."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from senddock.outcome import Outcome, SendResult
from senddock_ses_like.classify import classify


def api_error(code: str, message: str, status: int) -> SendResult:
    error = ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}},
                        "SendEmail")
    return SendResult("ses_like", ok=False, code=status, text=f"{code}: {message}", phase="api", error=error)


@pytest.mark.parametrize(
    ("code", "message", "status", "outcome", "reason"),
    [
        ("TooManyRequestsException", "Too many requests", 429, Outcome.RETRY, "throttled"),
        ("Throttling", "Maximum sending rate exceeded.", 400, Outcome.RETRY, "throttled"),
        ("Throttling", "Daily message quota exceeded.", 400, Outcome.PAUSE, "daily_quota_exceeded"),
        ("AccountSuspendedException", "Your account has been suspended", 400, Outcome.PAUSE, "account_suspended"),
        ("SendingPausedException", "Sending is paused for this account", 400, Outcome.PAUSE, "sending_paused"),
        ("MailFromDomainNotVerifiedException", "MAIL FROM domain not verified", 400, Outcome.PAUSE,
         "mail_from_not_verified"),
        ("MessageRejected", "Email address is not verified.", 400, Outcome.FAIL, "message_rejected"),
        ("LimitExceededException", "Too many tags", 400, Outcome.FAIL, "limit_exceeded"),
        ("NotFoundException", "Configuration set <news> does not exist.", 404, Outcome.FAIL, "not_found"),
        ("BadRequestException", "Invalid request", 400, Outcome.FAIL, "bad_request"),
        ("InternalFailure", "internal error", 500, Outcome.RETRY, "provider_error"),
        ("ServiceUnavailable", "try later", 503, Outcome.RETRY, "provider_error"),
        ("InvalidParameterValue", "Missing final '@domain'", 400, Outcome.FAIL, "rejected"),
        ("AccessDeniedException", "not authorized to perform ses:SendEmail", 403, Outcome.PAUSE,
         "credentials_refused"),
        ("UnrecognizedClientException", "The security token included in the request is invalid", 403,
         Outcome.PAUSE, "credentials_refused"),
        ("ExpiredTokenException", "The security token included in the request is expired", 403, Outcome.PAUSE,
         "credentials_refused"),
        ("SignatureDoesNotMatch", "The request signature we calculated does not match", 403, Outcome.PAUSE,
         "credentials_refused"),
    ],
)
def test_api_error_classification(code, message, status, outcome, reason):
    verdict = classify(api_error(code, message, status))
    assert (verdict.outcome, verdict.reason) == (outcome, reason)
    assert not verdict.about_recipient and verdict.outcome is not Outcome.BOUNCE
    # Throttling uses up no retries and never pauses; the provider's own errors are relay trouble.
    assert verdict.throttled == (reason == "throttled")
    assert verdict.relay_trouble == (reason == "provider_error")


def test_success():
    verdict = classify(SendResult("ses_like", ok=True, code=200, provider_message_id="0100-abc", phase="api"))
    assert verdict.outcome is Outcome.SENT


def test_throttling_asks_compute_backoff_to_wait():
    assert classify(api_error("TooManyRequestsException", "slow down", 429)).retry_after == 10.0


@pytest.mark.parametrize(
    ("error", "may_have_sent", "in_doubt"),
    [
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), False, False),
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:9"), True, True),  # the request went out
    ],
)
def test_network_errors_retry_and_a_read_timeout_is_in_doubt(error, may_have_sent, in_doubt):
    result = SendResult("ses_like", ok=False, text=str(error), phase="api", error=error, may_have_sent=may_have_sent)
    verdict = classify(result)
    assert (verdict.outcome, verdict.reason, verdict.in_doubt) == (Outcome.RETRY, "connection_error", in_doubt)
    assert verdict.relay_trouble


def test_a_bug_in_the_transport_is_a_failure_not_a_retry():
    result = SendResult.from_exception("ses_like", KeyError("oops"))
    assert (classify(result).outcome, classify(result).reason) == (Outcome.FAIL, "plugin_error")


@pytest.mark.parametrize(("sub_type", "about_recipient"), [
    ("MailboxFull", True), ("General", True),
    ("ContentRejected", False), ("MessageTooLarge", False), ("AttachmentRejected", False)])
def test_transient_bounces_that_refused_our_message_never_count_towards_the_soft_limit(sub_type, about_recipient):
    from senddock_ses_like.events import parse

    notification = {"notificationType": "Bounce", "mail": {"messageId": "m-1", "destination": ["a@example.com"]},
                    "bounce": {"bounceType": "Transient", "bounceSubType": sub_type, "feedbackId": "f-1",
                               "bouncedRecipients": [{"emailAddress": "a@example.com"}]}}
    [event] = parse(notification)
    assert (event.suppresses, event.about_recipient) == (False, about_recipient)
