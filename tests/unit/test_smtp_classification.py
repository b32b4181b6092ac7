"""The SMTP classification table (RFC 5321 4.2, RFC 3463, RFC 4954): one case per row."""

from __future__ import annotations

import smtplib

import pytest
from senddock_smtp.classify import classify
from senddock_smtp.transport import result_for

from senddock.outcome import Outcome, SendResult


# (phase, code, text, outcome, reason, about_recipient, flags): flags is "" or names what the
# failure is instead: "throttled" (retry without using up retries, never pauses) or "relay" (retry
# without using up retries, pauses the campaign until the relay answers a probe).
@pytest.mark.parametrize(
    ("phase", "code", "text", "outcome", "reason", "about_recipient", "flags"),
    [
        ("data", 250, "2.0.0 queued as 12345", Outcome.SENT, "sent", False, ""),
        ("rcpt", 550, "5.1.1 <x@example.com>: Recipient address rejected: User unknown", Outcome.BOUNCE, "bounced",
         True, ""),
        ("rcpt", 553, "5.1.3 bad address syntax", Outcome.BOUNCE, "bounced", True, ""),
        ("rcpt", 550, "5.1.6 mailbox has moved", Outcome.BOUNCE, "bounced", True, ""),
        ("rcpt", 556, "5.1.10 recipient address has null MX", Outcome.BOUNCE, "bounced", True, ""),
        ("rcpt", 550, "5.2.1 mailbox disabled", Outcome.BOUNCE, "bounced", True, ""),
        ("rcpt", 550, "No such user here", Outcome.BOUNCE, "bounced", True, ""),
        ("rcpt", 550, "Recipient address does not exist", Outcome.BOUNCE, "bounced", True, ""),
        # RFC 5321's generic texts prove nothing: relays say them for "relaying denied" too.
        ("rcpt", 550, "Requested action not taken: mailbox unavailable (relaying denied)", Outcome.FAIL, "rejected",
         False, ""),
        ("rcpt", 550, "mailbox unavailable", Outcome.FAIL, "rejected", False, ""),
        ("rcpt", 550, "Requested action not taken", Outcome.FAIL, "rejected", False, ""),
        # X.1.2 from a submission relay: its own DNS lookup of the recipient's domain failed.
        ("rcpt", 550, "5.1.2 bad destination system", Outcome.FAIL, "bad_domain", False, ""),
        ("data", 550, "5.1.2 host unknown", Outcome.FAIL, "bad_domain", False, ""),
        ("rcpt", 553, "5.1.8 <news@example.com>: Sender address rejected: Domain not found", Outcome.FAIL,
         "sender_rejected", False, ""),
        ("rcpt", 550, "5.1.0 Sender address rejected", Outcome.FAIL, "sender_rejected", False, ""),
        ("rcpt", 550, "5.1.7 bad sender mailbox syntax", Outcome.FAIL, "sender_rejected", False, ""),
        ("rcpt", 550, "5.7.1 Service unavailable; client host blocked", Outcome.FAIL, "policy_rejected", False, ""),
        ("rcpt", 554, "5.7.1 Relay access denied", Outcome.FAIL, "policy_rejected", False, ""),
        ("mail", 550, "5.7.26 unauthenticated email is not accepted", Outcome.FAIL, "policy_rejected", False, ""),
        ("rcpt", 550, "5.7.26 DMARC policy: unauthenticated email", Outcome.FAIL, "policy_rejected", False, ""),
        ("data", 550, "5.7.1 message rejected as spam", Outcome.FAIL, "policy_rejected", False, ""),
        ("rcpt", 501, "5.5.2 syntax error in parameters", Outcome.FAIL, "protocol_error", False, ""),
        ("mail", 553, "sender refused", Outcome.FAIL, "rejected_mail", False, ""),
        ("data", 554, "5.6.0 message content rejected", Outcome.FAIL, "rejected_data", False, ""),
        ("data", 552, "5.3.4 message too big for system", Outcome.FAIL, "message_too_big", False, ""),
        ("rcpt", 550, "Sender address rejected: does not exist", Outcome.FAIL, "rejected", False, ""),
        # The relay's own trouble at RCPT is never the recipient's: relay trouble.
        ("rcpt", 451, "4.3.0 temporary local problem", Outcome.RETRY, "relay_error", False, "relay"),
        ("rcpt", 452, "4.3.1 insufficient system storage", Outcome.RETRY, "relay_error", False, "relay"),
        ("rcpt", 554, "5.3.0 other mail system problem", Outcome.RETRY, "relay_error", False, "relay"),
        # Permanent routing (5xx X.4.x): retrying for days helps nobody; not the recipient's fault either.
        ("rcpt", 550, "5.4.4 unable to route", Outcome.FAIL, "routing_error", False, ""),
        ("rcpt", 550, "5.4.1 Recipient address rejected: Access denied", Outcome.FAIL, "routing_error", False, ""),
        ("mail", 452, "4.3.1 insufficient system storage", Outcome.RETRY, "relay_error", False, "relay"),
        ("data", 451, "4.3.0 local error", Outcome.RETRY, "relay_error", False, "relay"),
        ("data", 421, "4.4.2 timeout exceeded", Outcome.RETRY, "throttled", False, "throttled"),
        # Throttling: retried without using up the recipient's retries, and never a pause.
        ("mail", 421, "4.7.0 too many connections", Outcome.RETRY, "throttled", False, "throttled"),
        ("rcpt", 421, "4.7.0 closing connection", Outcome.RETRY, "throttled", False, "throttled"),
        ("rcpt", 421, "4.7.28 unusual rate of unsolicited mail", Outcome.RETRY, "throttled", False, "throttled"),
        # Greylisting: no retry used up, but its own reason (adaptive pacing does not slow down for it).
        ("rcpt", 451, "4.7.1 greylisted, try again", Outcome.RETRY, "greylisted", False, "throttled"),
        ("rcpt", 450, "4.2.0 Greylisted, see https://postgrey.schweikert.ch/", Outcome.RETRY, "greylisted", False,
         "throttled"),
        # The providers' throttling replies (issue 14), whatever their text says: each slows its group down.
        ("rcpt", 450, "4.7.28 [203.0.113.5] Our system has detected an unusual rate of\nunsolicited mail "
         "originating from your IP address.", Outcome.RETRY, "throttled", False, "throttled"),
        ("data", 550, "5.7.28 unusual rate of unsolicited mail: blocked", Outcome.FAIL, "policy_rejected", False, ""),
        ("mail", 451, "4.7.500 Server busy. Please try again later from [203.0.113.5]. (S77719)", Outcome.RETRY,
         "throttled", False, "throttled"),
        ("mail", 421, "4.7.0 [TSS04] Messages from 203.0.113.5 temporarily deferred due to unexpected volume or "
         "user complaints", Outcome.RETRY, "throttled", False, "throttled"),
        ("rcpt", 450, "[TSS04] Messages temporarily deferred", Outcome.RETRY, "throttled", False, "throttled"),
        ("data", 454, "Throttling failure: Maximum sending rate exceeded.", Outcome.RETRY, "throttled", False,
         "throttled"),
        ("data", 451, "MaxSendRate exceeded", Outcome.RETRY, "throttled", False, "throttled"),
        ("rcpt", 450, "4.7.1 mail sent from your IP address has been temporarily rate\nlimited", Outcome.RETRY,
         "throttled", False, "throttled"),
        # A 4xx policy refusal is no rate limit: counted, and a run of them pauses for a person.
        ("rcpt", 454, "4.7.1 <x@example.com>: Relay access denied", Outcome.RETRY, "deferred_rcpt", False, ""),
        ("mail", 450, "4.7.1 Client host rejected: cannot find your hostname", Outcome.RETRY, "deferred_mail",
         False, ""),
        # 4xx about the sender or the relay's own DNS, not the recipient.
        ("rcpt", 450, "4.1.8 <news@example.com>: Sender address rejected: Domain not found", Outcome.RETRY,
         "deferred_rcpt", False, ""),
        ("rcpt", 450, "4.1.2 <x@nowhere.example>: Recipient address rejected: Domain not found", Outcome.RETRY,
         "deferred_rcpt", False, ""),
        # A dead-mailbox code whose text is about the sender suppresses nobody.
        ("rcpt", 550, "5.1.1 <news@example.com>: Sender address rejected: User unknown", Outcome.FAIL, "rejected",
         False, ""),
        # senddock's own answer for a non-ASCII local part: about that address, not the relay.
        ("rcpt", 553, "5.6.7 the recipient's non-ASCII local part needs SMTPUTF8", Outcome.FAIL, "needs_smtputf8",
         True, ""),
        ("data", 451, "4.7.650 The mail server has been temporarily rate limited due to IP reputation",
         Outcome.RETRY, "throttled", False, "throttled"),
        ("rcpt", 450, "4.2.1 The user you are trying to contact is receiving mail too quickly", Outcome.RETRY,
         "throttled", False, "throttled"),
        ("rcpt", 451, "rate limit exceeded, slow down", Outcome.RETRY, "throttled", False, "throttled"),
        ("rcpt", 452, "4.5.3 too many recipients", Outcome.RETRY, "too_many_recipients", False, "throttled"),
        ("rcpt", 451, "temporary failure", Outcome.RETRY, "deferred_rcpt", False, ""),
        ("rcpt", 450, "4.1.1 mailbox temporarily unknown", Outcome.RETRY, "deferred_rcpt", True, ""),
        ("mail", 451, "temporary failure", Outcome.RETRY, "deferred_mail", False, ""),
        # RFC 3463: X.2.2 mailbox full is a persistent transient failure, 452 or 552 alike.
        ("rcpt", 452, "4.2.2 mailbox full", Outcome.RETRY, "mailbox_full", True, ""),
        ("rcpt", 552, "5.2.2 mailbox full", Outcome.RETRY, "mailbox_full", True, ""),
        ("data", 552, "5.2.2 over quota", Outcome.RETRY, "mailbox_full", True, ""),
        ("rcpt", 452, "4.2.2 too many messages in this mailbox", Outcome.RETRY, "mailbox_full", True, ""),
        # One recipient per transaction: a 5.1.x at DATA is about that recipient.
        ("data", 550, "5.1.1 user unknown", Outcome.BOUNCE, "bounced", True, ""),
        ("auth", 535, "5.7.8 authentication credentials invalid", Outcome.PAUSE, "auth_failed", False, ""),
        ("auth", 530, "5.7.0 authentication required", Outcome.PAUSE, "auth_failed", False, ""),
        ("auth", 534, "5.7.9 authentication mechanism is too weak", Outcome.PAUSE, "auth_failed", False, ""),
        ("auth", 538, "5.7.11 encryption required for requested authentication mechanism", Outcome.PAUSE,
         "auth_failed", False, ""),
        ("auth", 504, "5.5.4 unrecognized authentication type", Outcome.PAUSE, "auth_unavailable", False, ""),
        ("auth", 454, "4.7.0 temporary authentication failure", Outcome.RETRY, "auth_deferred", False, "relay"),
        ("connect", 554, "no SMTP service here", Outcome.PAUSE, "relay_refused_session", False, ""),
        ("ehlo", 550, "not welcome", Outcome.PAUSE, "relay_refused_session", False, ""),
        ("starttls", 454, "4.7.0 TLS not available due to temporary reason", Outcome.RETRY, "tls_unavailable",
         False, "relay"),
        ("starttls", 502, "5.5.1 command not implemented", Outcome.PAUSE, "tls_failed", False, ""),
    ],
)
def test_reply_classification(phase, code, text, outcome, reason, about_recipient, flags):
    verdict = classify(result_for(phase, code, text, ok=200 <= code < 300))
    assert (verdict.outcome, verdict.reason, verdict.about_recipient) == (outcome, reason, about_recipient)
    assert (verdict.throttled, verdict.relay_trouble) == (flags == "throttled", flags == "relay")


@pytest.mark.parametrize(
    ("error", "may_have_sent", "outcome", "reason", "in_doubt"),
    [
        (ConnectionRefusedError(111, "Connection refused"), False, Outcome.RETRY, "connection_error", False),
        (ConnectionResetError(104, "reset"), False, Outcome.RETRY, "connection_error", False),
        (TimeoutError("timed out"), False, Outcome.RETRY, "connection_error", False),
        (smtplib.SMTPServerDisconnected("gone after the final dot"), True, Outcome.RETRY, "connection_error", True),
        (KeyError("a bug"), False, Outcome.FAIL, "plugin_error", False),
    ],
)
def test_exceptions(error, may_have_sent, outcome, reason, in_doubt):
    result = SendResult("smtp", ok=False, text=str(error), error=error, phase="data", may_have_sent=may_have_sent)
    verdict = classify(result)
    assert (verdict.outcome, verdict.reason, verdict.in_doubt) == (outcome, reason, in_doubt)
    assert verdict.relay_trouble == (outcome is Outcome.RETRY)  # no answer at all: the relay's trouble


def test_enhanced_code_is_split_from_the_text():
    result = result_for("rcpt", 550, "5.1.1 no such user")
    assert (result.code, result.enhanced_code, result.text) == (550, "5.1.1", "no such user")
    assert result_for("rcpt", 550, "no such user").enhanced_code is None


@pytest.mark.parametrize(
    ("phase", "text"),
    [
        ("starttls", "the server does not offer STARTTLS (smtp.security: starttls)"),
        ("starttls", "SSLCertVerificationError: certificate verify failed: self-signed certificate"),
        ("tls", "SSLError: wrong version number"),
    ],
)
def test_tls_that_cannot_be_set_up_pauses(phase, text):
    verdict = classify(result_for(phase, None, text))
    assert (verdict.outcome, verdict.reason) == (Outcome.PAUSE, "tls_failed")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("4.7.1 greylisted, try again in 10 minutes", 600),
        ("4.2.2 mailbox full, retry after 30 seconds", 30),
        ("421 4.7.0 too many connections, please wait 2 hours", 7200),
        ("4.7.1 try again later", None),
    ],
)
def test_a_wait_named_by_the_server_reaches_compute_backoff(text, seconds):
    verdict = classify(result_for("rcpt", 451, text))
    assert verdict.retry_after == seconds
