"""senddock's built-in SES-style HTTP API transport, packaged exactly as a third-party plugin would be.

Registered through the ``senddock`` entry-point group; uses only the public modules of senddock
(``hookimpl``, ``outcome``, ``mime``, ``durations``), never the engine. Select it with
``transport: ses_like``; point ``ses_like.endpoint_url`` at an SES-compatible service or a local peer.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

from senddock import hookimpl
from senddock.outcome import (
    Classification,
    Message,
    PluginConfig,
    ProviderEvent,
    SendResult,
)
from senddock_ses_like import events as _events

# The transport and its classifier import boto3 (~0.1 s): loaded by the hooks that send or read a
# send's result, never by registering the plugin (every senddock command does that).
TRANSPORT = "ses_like"

CONFIG_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "An SES-compatible HTTP API (sesv2). Credentials come from the environment or boto3's usual "
                   "chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, an instance role), never this file.",
    "properties": {
        "region": {"type": "string", "minLength": 1, "default": "us-east-1"},
        "endpoint_url": {
            "description": "API endpoint for SES-compatible services and local peers; default: AWS's for the region.",
            "type": ["string", "null"],
            "pattern": "^https?://",
            "patternMessage": "an http:// or https:// URL",
            "default": None,
        },
        "configuration_set": {"description": "ConfigurationSetName for every send (event publishing).",
                              "type": ["string", "null"], "default": None},
        "timeout": {"description": "Connect and read timeout of each API call.", "type": "string",
                    "duration": True, "default": "30s"},
    },
}


@hookimpl
def transport_names() -> list[str]:
    return [TRANSPORT]


@hookimpl
def config_schema() -> Mapping[str, Mapping[str, Any]]:
    return {"ses_like": CONFIG_SCHEMA}


@hookimpl
def send_message(
    message: Message, transport: str, config: PluginConfig, worker_state: MutableMapping[str, Any]
) -> SendResult | None:
    if transport != TRANSPORT:
        return None
    from senddock_ses_like import transport as _transport

    return _transport.send(message, config.section("ses_like"), worker_state)


@hookimpl
def probe_transport(transport: str, config: PluginConfig) -> SendResult | None:
    if transport != TRANSPORT:
        return None
    from senddock_ses_like import transport as _transport

    return _transport.probe(config.section("ses_like"))


@hookimpl
def classify_result(result: SendResult) -> Classification | None:
    if result.transport != TRANSPORT:
        return None
    from senddock_ses_like import classify as _classify

    return _classify.classify(result)


@hookimpl
def parse_provider_event(document: Mapping[str, Any]) -> list[ProviderEvent] | None:
    if not _events.is_ses_document(document):
        return None
    return _events.parse(document)


@hookimpl
def worker_stopped(worker_state: MutableMapping[str, Any]) -> None:
    # A client exists only if this sender thread sent through the transport, which loaded the module.
    _transport = sys.modules.get("senddock_ses_like.transport")
    if _transport is not None:
        _transport.close(worker_state)
