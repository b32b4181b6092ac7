"""Auto-replies (RFC 3834 and what servers send without it): never a bounce.

Vacation and out-of-office messages, challenge-response ("confirm you are human") and other
robots' answers name no dead address; counting them as bounces would suppress people on holiday.
"""

from __future__ import annotations

import re
from email.message import EmailMessage

from senddock.outcome import BounceReport, MailReportKind

# Headers whose presence alone says "a robot answered" (the value is not read).
_ROBOT_HEADERS = ("X-Autoreply", "X-Autorespond", "X-Autoresponder", "X-Auto-Response-Suppress", "X-Vacation",
                  "X-Boxtrapper", "X-Spamarrest-Noauth", "X-Spam-Arrest", "X-ASG-Orig-Subj-Autoreply",
                  "X-Challenge", "X-Mail-Autoreply", "X-Ms-Exchange-Inbox-Rules-Loop")
_SUBJECT = re.compile(
    r"^\s*(?:auto(?:matic|matische)? ?(?:reply|response|antwort)|out of (?:the )?office|abwesenheitsnotiz|"
    r"r[ée]ponse automatique|absence|on vacation|vacation reply|please confirm|confirm your (?:message|email)|"
    r"challenge|autoreply)\b", re.IGNORECASE)


def parse(message: EmailMessage) -> BounceReport | None:
    why = _robot(message)
    return BounceReport(MailReportKind.AUTO_REPLY, reason=why, parser="auto_reply") if why else None


def _robot(message: EmailMessage) -> str | None:
    auto_submitted = _value(message, "Auto-Submitted")
    if auto_submitted and auto_submitted != "no":
        return f"Auto-Submitted: {auto_submitted}"  # RFC 3834
    precedence = _value(message, "Precedence")
    if precedence in ("auto_reply", "auto-reply"):
        return f"Precedence: {precedence}"
    for name in _ROBOT_HEADERS:
        if message.get(name) is not None:
            return f"{name} header"
    subject = _value(message, "Subject")
    if subject and _SUBJECT.match(subject):
        return f"subject {subject[:60]!r}"
    return None


def _value(message: EmailMessage, name: str) -> str | None:
    try:
        value = message.get(name)
    except Exception:  # noqa: BLE001 - a header the email package cannot parse says nothing
        return None
    return " ".join(str(value).split()).lower() if value is not None else None
