"""What an SMTP reply means for the job: the whole table in one place, one test per row.

RFC 5321 section 4.2.1: 2yz accepted, 4yz transient (try again), 5yz permanent; 421 means the
service is closing the channel. RFC 3463 enhanced codes say what a reply is about: X.1.x
addressing, X.2.x mailbox, X.5.x protocol, X.7.x security or policy. RFC 4954 gives the AUTH
replies. Only a refusal of the recipient's own address or mailbox is a bounce that suppresses
it; a relay refusing *us* (MAIL FROM, policy, reputation, authentication) must never suppress a
whole list.

| phase           | reply                                              | outcome                         |
|-----------------|----------------------------------------------------|---------------------------------|
| data            | 2xx                                                | sent                            |
| any             | no reply: refused, reset, DNS, timeout, disconnect | retry (in doubt after DATA's ".")|
| any             | 421                                                | retry                           |
| auth            | 454                                                | retry                           |
| mail/rcpt/data  | other 4xx                                          | retry                           |
| rcpt/data       | X.2.2 mailbox full (452 or 552), X.5.3 too many rcpts | retry; exhausted: failed     |
| rcpt/data       | 5xx X.1.1 .2 .3 .6 .10, X.2.1; or "user unknown"   | bounce (suppress)               |
| rcpt            | 5xx X.1.0 .7 .8 (sender address, Postfix)          | fail: sender_rejected           |
| any             | 5xx X.7.x (policy, spam, reputation, DMARC)        | fail: policy_rejected           |
| mail            | any other 5xx                                      | fail: rejected_mail             |
| data            | any other 5xx                                      | fail: rejected_data             |
| rcpt            | any other 5xx                                      | fail: rejected                  |
| auth            | 530 534 535 538, or other 5xx                      | pause: auth_failed / unavailable|
| connect/ehlo    | 5xx greeting or EHLO refused                       | pause: relay_refused_session    |
| starttls/tls    | STARTTLS refused or missing, certificate invalid   | pause: tls_failed (454: retry)  |
"""

from __future__ import annotations

import re
import smtplib

from senddock.outcome import Classification, Outcome, SendResult

# RFC 3463: X.1.1 bad destination mailbox, X.1.2 bad destination system, X.1.3 bad destination
# mailbox address syntax, X.1.6 mailbox has moved, X.1.10 recipient address has null MX (RFC 7505),
# X.2.1 mailbox disabled.
RECIPIENT_DEAD = {"1.1", "1.2", "1.3", "1.6", "1.10", "2.1"}
# Sender-address codes that Postfix returns at RCPT time (X.1.0 other address status, X.1.7 bad
# sender mailbox syntax, X.1.8 bad sender system address): about us, not the recipient.
SENDER_PROBLEM = {"1.0", "1.7", "1.8"}
# RFC 3463: X.2.2 mailbox full is a "persistent transient" failure whatever its class; X.5.3 too
# many recipients is about this transaction. Both may succeed later: retry, never suppress.
TRY_LATER = {"2.2", "5.3"}
_UNKNOWN_USER = re.compile(
    r"user unknown|unknown user|no such (user|mailbox|recipient)|(user|mailbox|recipient|address) does not exist|"
    r"mailbox (not found|unavailable)|recipient (address )?rejected: user|invalid recipient",
    re.IGNORECASE,
)
# Without an enhanced code, a text about the sender is never read as a dead recipient.
_ABOUT_SENDER = re.compile(r"sender", re.IGNORECASE)
# RFC 4954: 530 authentication required, 534 mechanism too weak, 535 credentials invalid,
# 538 encryption required for the mechanism.
AUTH_REFUSED = {530, 534, 535, 538}
# "try again in 10 minutes", "retry after 30 seconds", "please wait 2 hours"...
_WAIT = re.compile(
    r"(?:try again|retry|wait)\s+(?:in|after|for)?\s*(?P<n>\d+(?:\.\d+)?)\s*"
    r"(?P<unit>s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?)\b",
    re.IGNORECASE,
)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def retry_after(text: str) -> float | None:
    """Seconds the server asked us to wait, when its text names a wait."""
    found = _WAIT.search(text)
    if not found:
        return None
    return float(found["n"]) * _UNIT_SECONDS[found["unit"][0].lower()]


def _detail(enhanced: str | None) -> str | None:
    """``5.1.1`` -> ``1.1`` (subject.detail, the part that says what it is about)."""
    if not enhanced:
        return None
    return enhanced.split(".", 1)[1]


def classify(result: SendResult) -> Classification:
    if result.ok:
        return Classification(Outcome.SENT, "sent")
    code, phase, detail = result.code, result.phase, _detail(result.enhanced_code)
    if result.error is not None and not isinstance(result.error, (OSError, smtplib.SMTPException)):
        return Classification(Outcome.FAIL, "plugin_error")  # a bug, not the network: don't retry it
    if phase in ("starttls", "tls"):
        if code is not None and 400 <= code < 500:  # 454 TLS not available for a temporary reason
            return Classification(Outcome.RETRY, "tls_unavailable", retry_after=retry_after(result.text))
        return Classification(Outcome.PAUSE, "tls_failed")
    if code is None:
        # No reply at all: the connection failed (refused, reset, DNS, timeout, disconnect).
        return Classification(Outcome.RETRY, "connection_error", in_doubt=result.may_have_sent)
    wait = retry_after(result.text)
    if phase == "auth":
        if code in AUTH_REFUSED:
            return Classification(Outcome.PAUSE, "auth_failed")
        if code >= 500:  # 502 no AUTH offered, 504 mechanism unknown...: our setup
            return Classification(Outcome.PAUSE, "auth_unavailable")
        return Classification(Outcome.RETRY, "auth_deferred", retry_after=wait)  # 454
    if phase in ("connect", "ehlo") and code >= 500:
        return Classification(Outcome.PAUSE, "relay_refused_session")
    if code == 421:
        return Classification(Outcome.RETRY, "service_unavailable", retry_after=wait)
    about_recipient = phase in ("rcpt", "data")
    if detail in TRY_LATER and about_recipient:
        reason = "mailbox_full" if detail == "2.2" else "too_many_recipients"
        return Classification(Outcome.RETRY, reason, retry_after=wait, about_recipient=True)
    if 400 <= code < 500:
        return Classification(Outcome.RETRY, f"deferred_{phase}", about_recipient=phase == "rcpt", retry_after=wait)
    if about_recipient and detail in RECIPIENT_DEAD:
        # At DATA too: with one recipient per transaction, a 5.1.x there is about that recipient.
        return Classification(Outcome.BOUNCE, "bounced", about_recipient=True)
    if phase == "rcpt":
        if detail in SENDER_PROBLEM:
            return Classification(Outcome.FAIL, "sender_rejected")
        if detail is None and _UNKNOWN_USER.search(result.text) and not _ABOUT_SENDER.search(result.text):
            return Classification(Outcome.BOUNCE, "bounced", about_recipient=True)
    if detail is not None and detail.startswith("7."):
        return Classification(Outcome.FAIL, "policy_rejected")
    return Classification(Outcome.FAIL, f"rejected_{phase}" if phase in ("mail", "data") else "rejected",
                          about_recipient=phase == "rcpt" and not _ABOUT_SENDER.search(result.text))
