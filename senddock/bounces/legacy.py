"""The bounces that are no DSN, which real servers still send (old Exchange, qmail, Exim's
default, Yahoo's older format...): read by flufl.bounce's detectors rather than by regexes of ours.

flufl.bounce says which addresses failed, permanently or not, and nothing more: the status and
the text come from the body when it shows them.
"""

from __future__ import annotations

import logging
from email.message import EmailMessage

from senddock.bounces.status import STATUS, failure_kind, not_the_address
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
    failed = [_address(a) for a in permanent] or [_address(a) for a in temporary]
    failed = sorted({a for a in failed if a})
    if not failed:
        return None
    text = _text(message)
    status, reason = _status_and_reason(text, failed)
    if not permanent:
        kind = MailReportKind.SOFT
    elif status:
        kind = failure_kind(status, reason)
    else:  # permanent, says flufl.bounce, and the text shows no status: hard unless it blames us
        kind = MailReportKind.SOFT if reason and not_the_address(reason) else MailReportKind.HARD
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
