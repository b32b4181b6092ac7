"""senddock's built-in SES-style HTTP API transport, packaged exactly as a third-party plugin would be.

Registered through the ``senddock`` entry-point group; uses only ``senddock.hookimpl`` and
``senddock.outcome``. This foundation release declares the transport and its settings; sending
through the ``sesv2`` API arrives in its own issue.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from senddock import hookimpl

TRANSPORT = "ses_like"

CONFIG_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "An SES-compatible HTTP API. Credentials come from the environment or boto3's usual chain.",
    "properties": {
        "region": {"type": "string", "minLength": 1, "default": "us-east-1"},
        "endpoint_url": {
            "description": "API endpoint for SES-compatible services and local peers; default: AWS's.",
            "type": ["string", "null"],
            "default": None,
        },
        "configuration_set": {"type": ["string", "null"], "default": None},
        "timeout": {"type": "string", "duration": True, "default": "30s"},
    },
}


@hookimpl
def transport_names() -> list[str]:
    return [TRANSPORT]


@hookimpl
def config_schema() -> Mapping[str, Mapping[str, Any]]:
    return {"ses_like": CONFIG_SCHEMA}
