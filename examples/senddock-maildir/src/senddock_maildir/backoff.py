"""A senddock compute_backoff plugin: the same delay before every retry, from its config section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from senddock import hookimpl
from senddock.durations import parse_duration
from senddock.outcome import Classification, PluginConfig, RetryDecision


@hookimpl
def config_schema() -> Mapping[str, Mapping[str, Any]]:
    return {"steady_backoff": {
        "type": "object",
        "additionalProperties": False,
        "description": "A steady retry delay instead of senddock's growing schedule.",
        "properties": {
            "delay": {"type": "string", "duration": True, "default": "1m"},
            "max_retries": {"type": "integer", "minimum": 0, "default": 5},
        },
    }}


@hookimpl
def compute_backoff(attempt: int, classification: Classification, config: PluginConfig) -> RetryDecision | None:
    settings = config.section("steady_backoff")
    if not settings:
        return None  # installed but not configured: senddock's own schedule decides
    if attempt - 1 >= settings["max_retries"]:  # attempt counts the first send too
        return RetryDecision.give_up()
    # Never sooner than the server asked ("try again in 10 minutes").
    return RetryDecision.retry_in(max(parse_duration(settings["delay"]), classification.retry_after or 0))
