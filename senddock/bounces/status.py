"""From an RFC 3463 status and the server's text to hard or soft.

Hard means the recipient's address is dead: only then is it suppressed at once. Everything else
a failed delivery can mean (a full mailbox, a policy refusal of our message or our IP, a network or
protocol failure, a server that gave up after days of retrying) is soft: it suppresses only when it
repeats (``bounces.soft``).
"""

from __future__ import annotations

import re

from senddock.outcome import MailReportKind

# X.1.x is addressing: the mailbox (1.1), the domain (1.2, 1.10 null MX), a bad syntax (1.3), a
# moved mailbox (1.6). X.2.1 is a disabled mailbox. 5.1.2 is also what a relay says when its own DNS
# fails, but a permanent failure after the relay gave up on a domain is as dead as an address gets.
_HARD_DETAIL = re.compile(r"5\.1\.(?:0|1|2|3|6|10)|5\.2\.1")
STATUS = re.compile(r"\b([245])\.(\d{1,3})\.(\d{1,3})\b")
# What permanent failures without a useful status (5.0.0, or none) say when the address is dead.
_DEAD_ADDRESS = re.compile(
    r"user unknown|unknown user|no such (?:user|mailbox|recipient|address)|(?:mailbox|account|address|user)"
    r"(?: name)? (?:does not exist|doesn't exist|not found|is unavailable|unavailable|disabled|inactive)|"
    r"recipient (?:address )?rejected|not a valid (?:mailbox|recipient)|invalid (?:recipient|mailbox)|"
    r"does not have an? \S+ account|doesn't have an? \S+ account|account (?:has been )?(?:disabled|closed)|"
    r"recipient not found|address rejected|unrouteable address|no mailbox here",
    re.IGNORECASE)
# ...what makes a permanent-looking failure the mailbox's state rather than its death...
_FULL = re.compile(r"mailbox (?:is )?full|quota|over ?quota|insufficient (?:system )?storage", re.IGNORECASE)
# ...and what says the receiver refused our message or our IP, not the address.
_OURS = re.compile(
    r"spam|blocked|blacklist|blocklist|spamhaus|policy|reputation|rate limit|too many|"
    r"message (?:size|too (?:big|large))|content|virus|dmarc|spf|dkim|authentication",
    re.IGNORECASE)
# ...and what says a server gave up on the receiving host, not on the address (a host down for
# days is RFC 3463's 4.4.7, whatever an old server that writes no status meant by it).
_GAVE_UP = re.compile(
    r"not reachable|not responding|no answer from|timed out|time-?out|queue period|delivery time expired|"
    r"retry time(?:out)? (?:not reached|exceeded)|too long in (?:the )?queue|could not be delivered within",
    re.IGNORECASE)
_GENERIC = ("5.0.0", "5.5.0")
# Status subjects about our message or our sending: X.3.4 too big, X.5 protocol, X.6 content, X.7 policy.
_OURS_STATUS = re.compile(r"[45]\.(?:3\.4|5\.\d+|6\.\d+|7\.\d+)")


def status_in(text: str | None) -> str | None:
    """The first RFC 3463 status in ``text`` (``550 5.1.1 ...`` -> ``5.1.1``)."""
    found = STATUS.search(text or "")
    return ".".join(found.groups()) if found else None


def not_the_address(text: str) -> bool:
    """Whether a failure's text blames our message, our IP, the mailbox's fullness or a host
    that did not answer for days."""
    return bool(_FULL.search(text) or _OURS.search(text) or gave_up(text))


def gave_up(text: str) -> bool:
    """Whether a failure's text says the receiving host did not answer (for days, typically)."""
    return bool(_GAVE_UP.search(text))


def blames_us(status: str | None, text: str | None) -> bool:
    """Whether a soft failure is about our message or our sending (policy, content, size): it
    says nothing about the address, so it never counts towards suppressing it."""
    if status and _OURS_STATUS.fullmatch(status):
        return True
    return bool(text and _OURS.search(text) and not _FULL.search(text))


def failure_kind(status: str | None, diagnostic: str | None) -> MailReportKind:
    """Hard or soft, for a delivery that failed (a DSN's ``Action: failed``, a legacy bounce)."""
    if status is None or status in _GENERIC:
        # No status, or one that says nothing (5.0.0 "other"; 5.5.0, Outlook.com's answer for a
        # mailbox that does not exist): the text decides, and only a plain "no such user" is hard.
        text = diagnostic or ""
        dead = _DEAD_ADDRESS.search(text) and not not_the_address(text)
        return MailReportKind.HARD if dead else MailReportKind.SOFT
    # 4.x.x (given up after retrying), 5.2.2 full, 5.3 system, 5.4 network, 5.5 protocol, 5.6
    # content, 5.7 policy on our message or IP: none of them says the address is dead.
    return MailReportKind.HARD if _HARD_DETAIL.fullmatch(status) else MailReportKind.SOFT
