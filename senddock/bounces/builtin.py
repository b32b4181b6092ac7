"""The built-in ``parse_bounce_message``: the standard formats first, then the old ones.

Order matters: a DSN or a feedback report says exactly what it is; Exim's and Postfix's bounces
also carry ``Auto-Submitted: auto-replied`` (RFC 3834 asks it of every automatic message), so
the auto-reply test comes after the bounce formats, and what none of them recognises is no bounce.
"""

from __future__ import annotations

from email.message import EmailMessage

from senddock.bounces import arf, auto_reply, dsn, legacy
from senddock.outcome import BounceReport, MailReportKind

PARSERS = (dsn.parse, arf.parse, legacy.parse, auto_reply.parse)


def parse(message: EmailMessage) -> BounceReport:
    for parser in PARSERS:
        report = parser(message)
        if report is not None:
            return report
    return BounceReport(MailReportKind.NOT_BOUNCE, parser="none")
