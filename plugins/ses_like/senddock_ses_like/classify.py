"""What an SES-style API answer means for the job: the whole table in one place, one test per row.

With an API, a dead address is not refused at send time: it shows up later as a bounce
notification (``senddock events ingest``). So nothing here ever suppresses anyone. Throttling
retries without using up the recipient's retries and never pauses; trouble reaching the API
counts towards pausing the campaign, and that pause resumes once the API answers a probe.

| answer                                                         | outcome                        |
|----------------------------------------------------------------|--------------------------------|
| 200 with a MessageId                                           | sent                           |
| TooManyRequestsException (429)                                 | retry, throttled               |
| Throttling "Maximum sending rate exceeded"                     | retry, throttled               |
| HTTP 5xx, network errors, timeouts                             | retry, relay trouble (in doubt after sending) |
| Throttling "Daily message quota exceeded"                      | pause: daily_quota_exceeded    |
| AccountSuspendedException                                      | pause: account_suspended       |
| SendingPausedException                                         | pause: sending_paused          |
| MailFromDomainNotVerifiedException                             | pause: mail_from_not_verified  |
| AccessDenied, UnrecognizedClient, ExpiredToken, bad signature  | pause: credentials_refused     |
| MessageRejected                                                | fail: message_rejected         |
| LimitExceededException, NotFoundException, BadRequestException | fail: configuration problem    |
| any other 4xx error                                            | fail: rejected                 |
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

from senddock.outcome import Classification, Outcome, SendResult

PAUSE = {
    "AccountSuspendedException": "account_suspended",
    "SendingPausedException": "sending_paused",
    "MailFromDomainNotVerifiedException": "mail_from_not_verified",
}
# Our credentials, not any recipient: pause at the first one instead of failing a list.
CREDENTIALS = {
    "AccessDenied", "AccessDeniedException", "UnrecognizedClientException", "InvalidClientTokenId",
    "ExpiredToken", "ExpiredTokenException", "SignatureDoesNotMatch", "IncompleteSignature",
    "MissingAuthenticationToken",
}
# Our request or our setup is wrong: retrying cannot help, and no recipient is at fault.
CONFIGURATION = {
    "LimitExceededException": "limit_exceeded",
    "NotFoundException": "not_found",
    "BadRequestException": "bad_request",
}
THROTTLED = {"TooManyRequestsException", "Throttling", "ThrottlingException"}
# SES asks to wait for the rate to recover; the default backoff never goes sooner.
THROTTLE_WAIT = 10.0


def error_code(result: SendResult) -> str | None:
    if isinstance(result.error, ClientError):
        return result.error.response.get("Error", {}).get("Code")
    return None


def classify(result: SendResult) -> Classification:
    if result.ok:
        return Classification(Outcome.SENT, "sent")
    code = error_code(result)
    if code is None:
        if result.error is not None and not isinstance(result.error, BotoCoreError):
            return Classification(Outcome.FAIL, "plugin_error")  # a bug, not the network
        return Classification(Outcome.RETRY, "connection_error", in_doubt=result.may_have_sent, relay_trouble=True)
    text = result.text.lower()
    if code in THROTTLED:
        if "daily message quota" in text:
            return Classification(Outcome.PAUSE, "daily_quota_exceeded")
        return Classification(Outcome.RETRY, "throttled", retry_after=THROTTLE_WAIT, throttled=True)
    if code in PAUSE:
        return Classification(Outcome.PAUSE, PAUSE[code])
    if code in CREDENTIALS:
        return Classification(Outcome.PAUSE, "credentials_refused")
    if code == "MessageRejected":
        return Classification(Outcome.FAIL, "message_rejected")
    if code in CONFIGURATION:
        return Classification(Outcome.FAIL, CONFIGURATION[code])
    if result.code is not None and result.code >= 500:
        return Classification(Outcome.RETRY, "provider_error", relay_trouble=True)
    return Classification(Outcome.FAIL, "rejected")
