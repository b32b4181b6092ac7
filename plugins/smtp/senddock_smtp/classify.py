"""What an SMTP reply means for the job: the whole table in one place.

RFC 5321 section 4.2: 2yz accepted, 4yz transient (try again), 5yz permanent. RFC 3463 enhanced
codes say what a 5yz is about: X.1.x addressing, X.2.x mailbox, X.7.x security or policy. Only a
refusal of the recipient's own address or mailbox at RCPT TO is a bounce that suppresses it; a relay
refusing us (MAIL FROM, policy, reputation, DATA) must never suppress a whole list.
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
    if code is None:
        # No reply at all: the connection failed (refused, reset, DNS, timeout, disconnect).
        return Classification(Outcome.RETRY, "connection_error", in_doubt=result.may_have_sent)
    if phase == "auth" and code in AUTH_REFUSED:
        return Classification(Outcome.PAUSE, "auth_failed")
    if phase == "auth" and code >= 500:  # 502 no AUTH offered, 504 mechanism unknown...: our setup
        return Classification(Outcome.PAUSE, "auth_unavailable")
    if phase in ("connect", "ehlo") and code >= 500:
        return Classification(Outcome.PAUSE, "relay_refused_session")
    if code == 421:
        return Classification(Outcome.RETRY, "service_unavailable")
    if 400 <= code < 500:
        return Classification(Outcome.RETRY, f"deferred_{phase}", about_recipient=phase == "rcpt")
    if phase == "rcpt":
        if detail in SENDER_PROBLEM:
            return Classification(Outcome.FAIL, "sender_rejected")
        if detail in RECIPIENT_DEAD or (
            detail is None and _UNKNOWN_USER.search(result.text) and not _ABOUT_SENDER.search(result.text)
        ):
            return Classification(Outcome.BOUNCE, "bounced", about_recipient=True)
    if detail is not None and detail.startswith("7."):
        return Classification(Outcome.FAIL, "policy_rejected")
    return Classification(Outcome.FAIL, f"rejected_{phase}" if phase in ("mail", "data") else "rejected",
                          about_recipient=phase == "rcpt" and not _ABOUT_SENDER.search(result.text))
