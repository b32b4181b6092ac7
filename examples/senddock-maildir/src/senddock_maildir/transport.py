"""A senddock transport that delivers each message into a Maildir.

The message is the very one the SMTP transport would send (``senddock.mail.mime.message_bytes``:
the same headers, Message-ID and DKIM signature). Writing a Maildir is atomic (a file in
``tmp/`` renamed into ``new/``), so a crash never leaves half a message.
"""

from __future__ import annotations

import mailbox
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from senddock import Transport
from senddock.mail import mime
from senddock.outcome import Classification, Message, Outcome, SendResult

# Validated with the rest of the config: a typo in this section is reported at its key path.
SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "Where the maildir transport delivers.",
    "properties": {"path": {"type": "string", "minLength": 1, "default": "maildir"}},
}


class MaildirTransport(Transport[mailbox.Maildir]):
    name = "maildir"  # `transport: maildir` selects it; its settings are the `maildir:` section
    schema = SCHEMA

    def open(self, settings: Mapping[str, Any]) -> mailbox.Maildir:
        # One handle per sender thread, kept for its life. An OSError (disk full, permissions) is
        # that first send's failure, classified below; the next send opens again.
        return open_maildir(Path(settings["path"]))

    def send(self, message: Message, settings: Mapping[str, Any], state: mailbox.Maildir) -> SendResult:
        key = state.add(mime.message_bytes(message))
        return SendResult(self.name, ok=True, text=f"delivered as {key}", phase="write", provider_message_id=key)

    def classify(self, result: SendResult, message: Message) -> Classification | None:
        if result.ok:
            return Classification(Outcome.SENT, "sent")
        if isinstance(result.error, OSError):
            # Not the recipient's fault: retried, and counted towards pausing the campaign.
            return Classification(Outcome.RETRY, "maildir_unwritable")
        return Classification(Outcome.FAIL, "plugin_error")

    def close(self, state: mailbox.Maildir) -> None:
        state.close()


plugin = MaildirTransport()  # the entry point names this module: registering it registers this


def open_maildir(path: Path) -> mailbox.Maildir:
    """The Maildir at ``path``, made if missing. Every worker opens its own at once: the standard
    library's ``create=True`` checks then creates, so all but one worker would fail with
    FileExistsError; ``exist_ok`` makes the race harmless."""
    for folder in ("tmp", "new", "cur"):
        (path / folder).mkdir(parents=True, exist_ok=True)
    return mailbox.Maildir(path, create=False)
