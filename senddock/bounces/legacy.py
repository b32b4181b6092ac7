"""The bounces that are no DSN, which real servers still send (old Exchange, qmail, Exim's
default, Yahoo's older format...): read by flufl.bounce's detectors rather than by regexes of ours.

flufl.bounce says which addresses failed, permanently or not, and nothing more: the status and
the text come from the body when it shows them. What it finds only "temporarily" failed is a delay
notice (the server is still trying): no bounce.
"""

from __future__ import annotations

import logging
from email.message import EmailMessage

from senddock.bounces.status import STATUS, failure_kind, gave_up, not_the_address
from senddock.outcome import BounceReport, MailReportKind

MAX_BODY_SCAN = 64 * 1024  # how much of the text is searched for a status and a reason


def parse(message: EmailMessage) -> BounceReport | None:
    from flufl.bounce import all_failures  # imported when a message gets this far: most are DSNs

    # flufl.bounce logs each detector it runs at INFO, and every exception a malformed message
    # raises in one; what matters is the answer, and a failure is "not this format".
    logging.getLogger("flufl.bounce").setLevel(logging.CRITICAL)
    try:
        temporary, permanent = all_failures(message)
    except Exception:  # noqa: BLE001 - a detector choking on garbage: not a format it reads
        return None
    failed = sorted({a for a in map(_address, permanent) if a})
    if not failed:
        delayed = sorted({a for a in map(_address, temporary) if a})
        if delayed:  # a warning that the server is still trying: nothing failed yet
            return BounceReport(MailReportKind.NOT_BOUNCE, parser="legacy",
                                reason=f"delay notice: still trying {', '.join(delayed[:3])}")
        return None
    text = _text(message)
    status, reason = _status_and_reason(text, failed)
    if status:
        kind = failure_kind(status, reason)
    elif (reason and not_the_address(reason)) or gave_up(_before(text, failed[0])):
        # The text shows no status but blames our message, a full mailbox, or a host that did not
        # answer, in the lines about the address or before them (Netscape's "not reachable within
        # the allowed queue period"). Only the host part is looked for there: those lines quote
        # our Subject, whose words are no server's verdict.
        kind = MailReportKind.SOFT
    else:  # permanent, says flufl.bounce: hard
        kind = MailReportKind.HARD
    return BounceReport(kind, tuple(failed), status, reason, parser="legacy")


def _address(raw: bytes | str) -> str | None:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = text.strip().strip("<>").lower()
    return text if "@" in text else None


def _text(message: EmailMessage) -> str:
    """The first text part (the server's explanation), as text."""
    for part in message.walk():
        if part.get_content_maintype() == "text":
            data = part.get_payload(decode=True) or b""
            return data[:MAX_BODY_SCAN].decode(part.get_content_charset() or "utf-8", "replace")
    return ""


def _before(text: str, address: str) -> str:
    at = text.lower().find(address)
    return text[:at] if at > 0 else ""


def _status_and_reason(text: str, failed: list[str]) -> tuple[str | None, str | None]:
    """The status and the line about the first failed address, when the text has them."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    near = [i for i, line in enumerate(lines) if failed[0] in line.lower()]
    for i in near:
        window = " ".join(line for line in lines[i:i + 4] if line)
        found = STATUS.search(window)
        if found or len(window) > len(failed[0]) + 4:
            return (".".join(found.groups()) if found else None), window[:500]
    return None, None
