"""senddock's built-in SMTP transport, packaged exactly as a third-party plugin would be.

It is registered through the ``senddock`` entry-point group and uses only the public modules of
senddock (``Transport``, ``hookimpl``, ``outcome``, ``mime``, ``verp``, ``durations``), never the
engine. The plugin is :data:`plugin`, a :class:`senddock.Transport`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from senddock import Transport, hookimpl
from senddock.mail import verp
from senddock.outcome import Classification, Message, SendResult
from senddock_smtp import classify as _classify
from senddock_smtp import transport as _transport

TRANSPORT = _transport.TRANSPORT
# The session dict senddock_smtp.transport keeps a sender thread's connection in: it replaces the
# connection as it must (after max_messages_per_connection, a 421, an idle minute).
Session = dict[str, Any]

CONFIG_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "The SMTP relay senddock hands messages to.",
    "properties": {
        "host": {"type": "string", "minLength": 1, "default": "127.0.0.1"},
        "port": {"type": "integer", "minimum": 1, "maximum": 65535, "default": 1025},
        "timeout": {"description": "Bounds the connect and every command.", "type": "string", "duration": True,
                    "default": "30s"},
        "security": {
            "description": "starttls (port 587; refuses to go on in clear text), tls (implicit TLS, port 465) or none.",
            "enum": ["starttls", "tls", "none"],
            "default": "starttls",
        },
        "verify": {"description": "Verify the relay's certificate and host name.", "type": "boolean", "default": True},
        "ca_file": {"description": "PEM bundle of the CA(s) to trust instead of the system's (a private relay).",
                    "type": ["string", "null"], "default": None},
        "max_messages_per_connection": {
            "description": "Open a fresh connection after this many messages (relays cap messages per session).",
            "type": "integer", "minimum": 1, "default": 100,
        },
        "connect_at_start": {
            "description": "Each sender opens its connection as the node starts, before its first claim (a paced "
                           "burst then goes out on open connections, not all opening at once); default: at its first send.",
            "type": "boolean", "default": False,
        },
        "return_path": {
            "description": "Envelope sender (MAIL FROM); {token} becomes the message's VERP token, "
                           "e.g. bounces+{token}@example.com. Default: the From address.",
            "type": ["string", "null"], "pattern": "^[^@\\s]+@[^@\\s]+$", "default": None,
            "patternMessage": "an email address (e.g. bounces+{token}@example.com)",
        },
        "helo_name": {
            "description": "Name given in EHLO; default: this host's fully qualified name.",
            "type": ["string", "null"],
            "default": None,
        },
        "message_id_domain": {
            "description": "Domain of generated Message-IDs; default: the From address's domain.",
            "type": ["string", "null"],
            "default": None,
        },
        "username": {"description": "AUTH user name; no AUTH without it.", "type": ["string", "null"], "default": None},
        "password": {"description": "AUTH password: write ${SENDDOCK_SMTP_PASSWORD}.", "type": ["string", "null"], "default": None},
    },
}


class SmtpTransport(Transport[Session]):
    name = TRANSPORT
    schema = CONFIG_SCHEMA

    def open(self, settings: Mapping[str, Any]) -> Session:
        return {}  # the first send connects

    def open_ahead(self, settings: Mapping[str, Any]) -> Session | None:
        if not settings.get("connect_at_start"):
            return None
        session: Session = {}
        _transport.connect_ahead(settings, session)
        return session

    def send(self, message: Message, settings: Mapping[str, Any], state: Session) -> SendResult:
        return _transport.send(message, settings, state)

    def probe(self, settings: Mapping[str, Any]) -> SendResult:
        return _transport.probe(settings)

    def classify(self, result: SendResult, message: Message) -> Classification | None:
        return _classify.classify(result)

    def close(self, state: Session) -> None:
        _transport.close(state)

    @hookimpl
    def config_problems(self, config: Mapping[str, Any]) -> list[tuple[str, str]]:
        template = (config.get("smtp") or {}).get("return_path")
        if not template or "{token}" not in template:
            return []
        if not (config.get("bounces") or {}).get("secret"):
            return [("$.smtp.return_path", ("{token} needs bounces.secret (${SENDDOCK_BOUNCES_SECRET}): "
                                            "the tokens are signed with it"))]
        problem = verp.return_path_problem(template)
        return [("$.smtp.return_path", problem)] if problem else []


plugin = SmtpTransport()  # the module holds it: registering the module registers it
