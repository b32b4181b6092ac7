"""A senddock transport that delivers each message into a Maildir.

The message is the very one the SMTP transport would send (``senddock.mail.mime.message_bytes``:
the same headers, Message-ID and DKIM signature). Writing a Maildir is atomic (a file in
``tmp/`` renamed into ``new/``), so a crash never leaves half a message.
"""

from __future__ import annotations

import mailbox
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from senddock import hookimpl
from senddock.mail import mime
from senddock.outcome import Classification, Message, Outcome, PluginConfig, SendResult

TRANSPORT = "maildir"


@hookimpl
def transport_names() -> list[str]:
    return [TRANSPORT]


@hookimpl
def config_schema() -> Mapping[str, Mapping[str, Any]]:
    # Validated with the rest of the config: a typo in this section is reported at its key path.
    return {"maildir": {
        "type": "object",
        "additionalProperties": False,
        "description": "Where the maildir transport delivers.",
        "properties": {"path": {"type": "string", "minLength": 1, "default": "maildir"}},
    }}


@hookimpl
def send_message(message: Message, transport: str, config: PluginConfig,
                 worker_state: MutableMapping[str, Any]) -> SendResult | None:
    if transport != TRANSPORT:
        return None  # another transport's message
    folder = worker_state.get("maildir")
    if folder is None:  # one handle per worker, kept for the worker's life
        folder = worker_state["maildir"] = open_maildir(Path(config.section("maildir")["path"]))
    # An OSError (disk full, permissions) is captured by the engine and classified below.
    key = folder.add(mime.message_bytes(message))
    return SendResult(TRANSPORT, ok=True, text=f"delivered as {key}", phase="write", provider_message_id=key)


def open_maildir(path: Path) -> mailbox.Maildir:
    """The Maildir at ``path``, made if missing. Every worker opens its own at once: the standard
    library's ``create=True`` checks then creates, so all but one worker would fail with
    FileExistsError; ``exist_ok`` makes the race harmless."""
    for folder in ("tmp", "new", "cur"):
        (path / folder).mkdir(parents=True, exist_ok=True)
    return mailbox.Maildir(path, create=False)


@hookimpl
def classify_result(result: SendResult) -> Classification | None:
    if result.transport != TRANSPORT:
        return None  # let the transport that produced the result decide
    if result.ok:
        return Classification(Outcome.SENT, "sent")
    if isinstance(result.error, OSError):
        # Not the recipient's fault: retried, and counted towards pausing the campaign.
        return Classification(Outcome.RETRY, "maildir_unwritable")
    return Classification(Outcome.FAIL, "plugin_error")


@hookimpl
def worker_stopped(worker_state: MutableMapping[str, Any]) -> None:
    folder = worker_state.pop("maildir", None)
    if folder is not None:
        folder.close()
