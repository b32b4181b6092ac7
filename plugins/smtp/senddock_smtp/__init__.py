"""senddock's built-in SMTP transport, packaged exactly as a third-party plugin would be.

It is registered through the ``senddock`` entry-point group and uses only ``senddock.hookimpl`` and
``senddock.outcome``. This foundation release declares the transport and its settings; sending
arrives with the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from senddock import hookimpl

TRANSPORT = "smtp"

CONFIG_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "The SMTP relay senddock hands messages to.",
    "properties": {
        "host": {"type": "string", "minLength": 1, "default": "127.0.0.1"},
        "port": {"type": "integer", "minimum": 1, "maximum": 65535, "default": 1025},
        "timeout": {"type": "string", "duration": True, "default": "30s"},
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
    },
}


@hookimpl
def transport_names() -> list[str]:
    return [TRANSPORT]


@hookimpl
def config_schema() -> Mapping[str, Mapping[str, Any]]:
    return {"smtp": CONFIG_SCHEMA}
