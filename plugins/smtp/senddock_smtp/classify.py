"""What an SMTP reply means for the job: the whole table in one place, one test per row.

RFC 5321 section 4.2.1: 2yz accepted, 4yz transient (try again), 5yz permanent; 421 means the
service is closing the channel. RFC 3463 enhanced codes say what a reply is about: X.1.x
addressing, X.2.x mailbox, X.3.x mail system, X.4.x network and routing, X.5.x protocol, X.6.x
content, X.7.x security or policy. RFC 4954 gives the AUTH replies.

Only a refusal that proves the recipient's own address or mailbox dead is a bounce that
suppresses it. RFC 5321's generic texts ("Requested action not taken: mailbox unavailable") are
what a relay says for anything, relaying denied included, so they prove nothing; a submission
relay answers X.1.2 when its own DNS lookup fails; X.3, X.4, X.5 and X.7 are never about the
recipient. A relay refusing *us* (MAIL FROM, policy, reputation, authentication) must never
suppress a whole list: those failures count towards pausing the campaign instead.

| phase          | reply                                                   | outcome                                   |
|----------------|---------------------------------------------------------|-------------------------------------------|
| data           | 2xx                                                     | sent                                      |
| any            | no reply: refused, reset, DNS, timeout, disconnect      | retry, relay trouble (in doubt after ".") |
| any            | 421; 451 X.7.x; 4xx X.7.28 (Gmail); 4xx naming a rate   | retry, throttled                          |
|                | limit ([TSS04] of Yahoo, SES's maximum sending rate)    |                                           |
| any            | 4xx naming greylisting                                  | retry, throttled: greylisted              |
| any            | X.3.x (the relay's mail system), 4xx X.4.x (network)    | retry, relay trouble                      |
| any            | 5xx X.3.4 message too big for the system                | fail: message_too_big                     |
| any            | 5xx X.4.x (routing)                                     | fail: routing_error                       |
| rcpt/data      | X.2.2 mailbox full (452 or 552)                         | retry (about the recipient)               |
| rcpt           | X.5.3 too many recipients                               | retry, throttled                          |
| rcpt           | other 4xx X.1.x or X.2.x, but X.1.0 .2 .7 .8            | retry (about the recipient)               |
| mail/rcpt/data | other 4xx (X.7.x policy included)                       | retry                                     |
| rcpt/data      | 5xx X.1.1 .3 .6 .10, X.2.1; or a "user unknown" text,   | bounce (suppress)                         |
|                | unless the text is about the sender                     |                                           |
| rcpt/data      | 5xx X.1.2 (the relay's own DNS, for a submission relay) | fail: bad_domain                          |
| rcpt           | 5xx X.1.0 .7 .8 (sender address, Postfix)               | fail: sender_rejected                     |
| rcpt           | 553 X.6.7 (the address needs SMTPUTF8)                  | fail: needs_smtputf8 (about the recipient)|
| any            | 5xx X.7.x (policy, spam, reputation, DMARC)             | fail: policy_rejected                     |
| any            | 5xx X.5.x (protocol)                                    | fail: protocol_error                      |
| mail           | any other 5xx                                           | fail: rejected_mail                       |
| data           | any other 5xx                                           | fail: rejected_data                       |
| rcpt           | any other 5xx, generic texts included                   | fail: rejected                            |
| auth           | 454                                                     | retry, relay trouble                      |
| auth           | 530 534 535 538, or other 5xx                           | pause: auth_failed / auth_unavailable     |
| connect/ehlo   | 5xx greeting or EHLO refused                            | pause: relay_refused_session              |
| starttls/tls   | STARTTLS refused or missing, certificate invalid        | pause: tls_failed (454: retry)            |

Every failure that is not about the recipient and not throttling counts towards
``transport.max_consecutive_failures``; when only relay trouble filled that run, the pause
resumes by itself once the relay answers a probe. The relay's own mail-system trouble (X.3.x,
"554 5.3.0" included) is retried whatever its class, without using up the recipient's retries.
Permanent routing replies (5xx X.4.x; Exchange Online's "550 5.4.1 Recipient address rejected:
Access denied" among them) fail the job without blaming the recipient: retrying them for days
would help no one, and a run of them is for a person to judge. 4xx X.7.x is a policy deferral ("454 4.7.1 Relay access denied"), counted like any other
4xx, unless it is 451 (Microsoft's "451 4.7.650 ... temporarily rate limited", greylisting), Gmail's
X.7.28 ("unusual rate of unsolicited mail", 421 or 450), or its text names a rate limit or greylisting.
Greylisting is throttling for retries but keeps its own reason, ``greylisted``: it asks for one
retry later, not for a slower pace, so adaptive pacing leaves the rate alone for it.
"""

from __future__ import annotations

import re
import smtplib

from senddock.outcome import Classification, Outcome, SendResult

# RFC 3463: X.1.1 bad destination mailbox, X.1.3 bad destination mailbox address syntax, X.1.6
# mailbox has moved, X.1.10 recipient address has null MX (RFC 7505), X.2.1 mailbox disabled.
RECIPIENT_DEAD = {"1.1", "1.3", "1.6", "1.10", "2.1"}
# X.1.2 bad destination system: from a submission relay it is the relay's own DNS lookup.
BAD_DOMAIN = "1.2"
# Sender-address codes that Postfix returns at RCPT time (X.1.0 other address status, X.1.7 bad
# sender mailbox syntax, X.1.8 bad sender system address): about us, not the recipient.
SENDER_PROBLEM = {"1.0", "1.7", "1.8"}
# RFC 3463: X.2.2 mailbox full is a "persistent transient" failure whatever its class.
MAILBOX_FULL = "2.2"
# X.5.3 too many recipients: a limit on this transaction or this hour, not the recipient.
TOO_MANY_RECIPIENTS = "5.3"
# X.3.4 message too big for the system: permanent, about our message.
TOO_BIG = "3.4"
# Without an enhanced code, only a text that names the recipient as unknown proves it dead. RFC
# 5321's generic "mailbox unavailable" is said for relaying denied and policy blocks too.
_UNKNOWN_USER = re.compile(
    r"user unknown|unknown user|no such (user|mailbox|recipient)|(user|mailbox|recipient|address) does not exist|"
    r"mailbox not found|recipient (address )?rejected: user|invalid recipient",
    re.IGNORECASE,
)
# Without an enhanced code, a text about the sender is never read as a dead recipient.
_ABOUT_SENDER = re.compile(r"sender", re.IGNORECASE)
# 4xx texts of receivers and relays slowing us down (Gmail 450 4.2.1 "receiving mail too quickly",
# Yahoo "[TSS04] ... deferred due to ... volume", Microsoft "temporarily rate limited", SES
# "454 Throttling failure: Maximum sending rate exceeded"). \W, not ".": a multi-line reply's
# lines are joined with a newline, which may fall between "rate" and "limited".
_RATE_LIMITED = re.compile(r"rate\W?limit|too\W(many|fast|quickly)|throttl|volume|slow\Wdown|\[TSS?0\d\]|"
                           r"max(imum)?\W?send(ing)?\W?rate", re.IGNORECASE)
# Greylisting (450/451 4.7.1 "Greylisted, try again"): a retry later, not a slower pace.
_GREYLISTED = re.compile(r"gr[ea]y\W?list", re.IGNORECASE)
# Gmail's X.7.28: "unusual rate of unsolicited mail ... temporarily rate limited" (421 or 450).
GMAIL_RATE_LIMITED = "7.28"
# X.6.7: the address needs SMTPUTF8 (RFC 6531), which the relay or this transport lacks.
NEEDS_SMTPUTF8 = "6.7"
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


def _subject(detail: str | None) -> str | None:
    """``1.1`` -> ``1`` (the class of thing the reply is about)."""
    return detail.split(".", 1)[0] if detail else None


def classify(result: SendResult) -> Classification:
    if result.ok:
        return Classification(Outcome.SENT, "sent")
    code, phase, detail = result.code, result.phase, _detail(result.enhanced_code)
    subject = _subject(detail)
    if result.error is not None and not isinstance(result.error, (OSError, smtplib.SMTPException)):
        return Classification(Outcome.FAIL, "plugin_error")  # a bug, not the network: don't retry it
    if phase in ("starttls", "tls"):
        if code is not None and 400 <= code < 500:  # 454 TLS not available for a temporary reason
            return Classification(Outcome.RETRY, "tls_unavailable", retry_after=retry_after(result.text),
                                  relay_trouble=True)
        return Classification(Outcome.PAUSE, "tls_failed")
    if code is None:
        # No reply at all: the connection failed (refused, reset, DNS, timeout, disconnect).
        return Classification(Outcome.RETRY, "connection_error", in_doubt=result.may_have_sent, relay_trouble=True)
    wait = retry_after(result.text)
    if phase == "auth":
        if code in AUTH_REFUSED:
            return Classification(Outcome.PAUSE, "auth_failed")
        if code >= 500:  # 502 no AUTH offered, 504 mechanism unknown...: our setup
            return Classification(Outcome.PAUSE, "auth_unavailable")
        return Classification(Outcome.RETRY, "auth_deferred", retry_after=wait, relay_trouble=True)  # 454
    if phase in ("connect", "ehlo") and code >= 500:
        return Classification(Outcome.PAUSE, "relay_refused_session")
    transient = 400 <= code < 500
    if code == 421:
        return Classification(Outcome.RETRY, "throttled", retry_after=wait, throttled=True)
    if detail == TOO_BIG and code >= 500:
        return Classification(Outcome.FAIL, "message_too_big")
    if subject in ("3", "4"):
        # The relay's mail system, network or routing, never the recipient.
        if transient or subject == "3":
            return Classification(Outcome.RETRY, "relay_error", retry_after=wait, relay_trouble=True)
        return Classification(Outcome.FAIL, "routing_error")
    about_recipient = phase in ("rcpt", "data")
    if detail == MAILBOX_FULL and about_recipient:
        return Classification(Outcome.RETRY, "mailbox_full", retry_after=wait, about_recipient=True)
    if detail == TOO_MANY_RECIPIENTS and phase == "rcpt":
        return Classification(Outcome.RETRY, "too_many_recipients", retry_after=wait, throttled=True)
    if transient and _GREYLISTED.search(result.text):
        return Classification(Outcome.RETRY, "greylisted", retry_after=wait, throttled=True)
    if transient and (_RATE_LIMITED.search(result.text) or detail == GMAIL_RATE_LIMITED
                      or (code == 451 and subject == "7")):
        return Classification(Outcome.RETRY, "throttled", retry_after=wait, throttled=True)
    if transient:
        return Classification(Outcome.RETRY, f"deferred_{phase}", retry_after=wait,
                              about_recipient=phase == "rcpt" and subject in ("1", "2")
                              and detail not in SENDER_PROBLEM and detail != BAD_DOMAIN)
    if about_recipient and detail in RECIPIENT_DEAD and not _ABOUT_SENDER.search(result.text):
        # At DATA too: with one recipient per transaction, a 5.1.x there is about that recipient.
        return Classification(Outcome.BOUNCE, "bounced", about_recipient=True)
    if about_recipient and detail == BAD_DOMAIN:
        return Classification(Outcome.FAIL, "bad_domain")
    if phase == "rcpt":
        if detail in SENDER_PROBLEM:
            return Classification(Outcome.FAIL, "sender_rejected")
        if detail == NEEDS_SMTPUTF8:
            return Classification(Outcome.FAIL, "needs_smtputf8", about_recipient=True)
        if detail is None and _UNKNOWN_USER.search(result.text) and not _ABOUT_SENDER.search(result.text):
            return Classification(Outcome.BOUNCE, "bounced", about_recipient=True)
    if subject == "7":
        return Classification(Outcome.FAIL, "policy_rejected")
    if subject == "5":
        return Classification(Outcome.FAIL, "protocol_error")
    # A refusal that names no reason about the recipient: not proof enough to blame them, so it
    # counts towards pausing the campaign (a relay refusing everything stops there).
    return Classification(Outcome.FAIL, f"rejected_{phase}" if phase in ("mail", "data") else "rejected")
