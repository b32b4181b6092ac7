"""Errors the CLI turns into one clear line and an exit status."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

EXIT_OK = 0
EXIT_PROBLEMS = 1  # the command ran, but found problems in its input (rejected rows, unknown id)
EXIT_USAGE = 2  # usage or configuration error


def error_line(exc: BaseException, *, dsns: Iterable[str | None] = ()) -> str:
    """The first line of an exception's message (psycopg's carry hints on further lines), with any
    DSN password masked: what a log line or an error message shows of it.

    ``dsns``: the connection strings the failed call used. psycopg and libpq quote parts of a bad
    one back (a password's tail after an unencoded ``@`` as the host), so their secrets are masked
    wherever they appear.
    """
    from senddock.redact import redact_text

    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return redact_text(lines[0], dsns) if lines else type(exc).__name__


# A value the caller gave, named in a message as {=name} (its name in the Python API): each interface
# words it its own way, the CLI as its flag (--at), the Python API as its parameter (send_at).
_VALUE = re.compile(r"\{=(\w+)\}")
# Where the Python API's word for a value is not the bare name.
_API_WORDS = {"no_unsubscribe": "require_unsubscribe=False", "force": "force=True", "since_pause": "since_pause=True",
              "all": "since_pause=False", "node": "node.name"}


class SenddockError(Exception):
    """An error meant for the person running senddock: the message is shown as it is, with each
    value it names worded for the interface that shows it (:meth:`worded`)."""

    exit_code = EXIT_PROBLEMS

    def __init__(self, message: str = "", *args: object) -> None:
        self.template = message
        super().__init__(self.worded(_API_WORDS), *args)

    def worded(self, words: Mapping[str, str]) -> str:
        """The message with each ``{=name}`` replaced by ``words[name]`` (``--at`` for the CLI), or by
        the Python API's word for it when ``words`` has none."""
        return _VALUE.sub(lambda m: words.get(m[1]) or _API_WORDS.get(m[1], m[1]), self.template)


class ConfigError(SenddockError):
    """The configuration is invalid; ``errors`` holds one ``FILE::$.path: message`` line each."""

    exit_code = EXIT_USAGE

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


class UsageError(SenddockError):
    exit_code = EXIT_USAGE


class DatabaseError(SenddockError):
    """The database cannot be reached or is not in a state this senddock can use."""

    exit_code = EXIT_USAGE


class NotFound(SenddockError):
    """An id or name given by the user does not exist."""


class InvalidState(SenddockError):
    """The object exists but is not in a state that allows the operation."""


class InvalidInput(SenddockError):
    """A value given by the user is malformed (an address, a file)."""
