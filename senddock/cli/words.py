"""How the command line names the values that errors of the API and the domain name.

An error names a value by its name in the Python API (``{=send_at}`` in
:class:`senddock.errors.SenddockError`'s message); the CLI shows its own flag for it instead, so
that no code below the CLI knows a flag.
"""

from __future__ import annotations

FLAGS = {
    "send_at": "--at",
    "to": "--to",
    "email": "--email",
    "name": "--name",
    "lists": "--list",
    "subject": "--subject",
    "from_addr": "--from",
    "reply_to": "--reply-to",
    "text_body": "--text",
    "html_body": "--html",
    "rate": "--rate",
    "burst": "--burst",
    "reason": "--reason",
    "force": "--force",
    "since_pause": "--since-pause",
    "all": "--all",
    "no_unsubscribe": "--no-unsubscribe",
    "encoding": "--encoding",
    "node": "--node (or node.name)",
}
