"""senddock's built-in SES-style HTTP API transport, packaged exactly as a third-party plugin would be.

Registered through the ``senddock`` entry-point group; uses only the public modules of senddock
(``Transport``, ``hookimpl``, ``outcome``, ``mime``, ``durations``), never the engine. Select it with
``transport: ses_like``; point ``ses_like.endpoint_url`` at an SES-compatible service or a local peer.
The plugin is :data:`plugin`, a :class:`senddock.Transport`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from senddock import Transport, hookimpl
from senddock.outcome import Classification, Message, ProviderEvent, SendResult
from senddock_ses_like import events as _events

# The transport and its classifier import boto3 (~0.1 s): loaded by the methods that open a client,
# probe or read a send's result, never by registering the plugin (every senddock command does that).
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


class SesLikeTransport(Transport[Any]):  # the state: a botocore sesv2 client per sender thread
    name = TRANSPORT
    schema = CONFIG_SCHEMA

    def open(self, settings: Mapping[str, Any]) -> Any:
        from senddock_ses_like import transport as _transport

        return _transport.client(settings)

    def send(self, message: Message, settings: Mapping[str, Any], state: Any) -> SendResult:
        from senddock_ses_like import transport as _transport

        return _transport.send(message, settings, state)

    def probe(self, settings: Mapping[str, Any]) -> SendResult:
        from senddock_ses_like import transport as _transport

        return _transport.probe(settings)

    def classify(self, result: SendResult, message: Message) -> Classification | None:
        from senddock_ses_like import classify as _classify

        return _classify.classify(result)

    def close(self, state: Any) -> None:
        state.close()

    @hookimpl
    def parse_provider_event(self, document: Mapping[str, Any]) -> list[ProviderEvent] | None:
        if not _events.is_ses_document(document):
            return None
        return _events.parse(document)


plugin = SesLikeTransport()  # the module holds it: registering the module registers it
