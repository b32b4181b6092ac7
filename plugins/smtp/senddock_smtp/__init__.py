"""senddock's built-in SMTP transport, packaged exactly as a third-party plugin would be.

It is registered through the ``senddock`` entry-point group and uses only the public modules of
senddock (``hookimpl``, ``outcome``, ``mime``, ``verp``, ``durations``), never the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from senddock import hookimpl
from senddock.mail import verp
from senddock.outcome import Classification, Message, PluginConfig, SendResult
from senddock_smtp import classify as _classify
from senddock_smtp import transport as _transport

TRANSPORT = _transport.TRANSPORT

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


@hookimpl
def transport_names() -> list[str]:
    return [TRANSPORT]


@hookimpl
def config_schema() -> Mapping[str, Mapping[str, Any]]:
    return {"smtp": CONFIG_SCHEMA}


@hookimpl
def config_problems(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    template = (config.get("smtp") or {}).get("return_path")
    if not template or "{token}" not in template:
        return []
    if not (config.get("bounces") or {}).get("secret"):
        return [("$.smtp.return_path", "{token} needs bounces.secret (${SENDDOCK_BOUNCES_SECRET}): "
                                       "the tokens are signed with it")]
    problem = verp.return_path_problem(template)
    return [("$.smtp.return_path", problem)] if problem else []


@hookimpl
def send_message(
    message: Message, transport: str, config: PluginConfig, worker_state: MutableMapping[str, Any]
) -> SendResult | None:
    if transport != TRANSPORT:
        return None
    return _transport.send(message, config.section("smtp"), worker_state)


@hookimpl
def probe_transport(transport: str, config: PluginConfig) -> SendResult | None:
    if transport != TRANSPORT:
        return None
    return _transport.probe(config.section("smtp"))


@hookimpl
def classify_result(result: SendResult) -> Classification | None:
    if result.transport != TRANSPORT:
        return None
    return _classify.classify(result)


@hookimpl
def worker_started(worker_state: MutableMapping[str, Any], config: PluginConfig) -> None:
    settings = config.section("smtp")
    if config.transport == TRANSPORT and settings.get("connect_at_start"):
        _transport.connect_ahead(settings, worker_state)


@hookimpl
def worker_stopped(worker_state: MutableMapping[str, Any]) -> None:
    _transport.close(worker_state)
