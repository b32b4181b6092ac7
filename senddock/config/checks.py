"""Checks across keys and sections that JSON Schema cannot say (a lease of three heartbeats, an
installed transport), and the register through which a section's owner adds its own.

A check takes the validated data (defaults filled in) and the installed transports (name ->
provider) and yields ``(json path, message)`` for each problem. The owner of a section registers
its check where it lives (``@checks.register``), so this package imports no feature: the feature
imports config, never the other way round.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from senddock.config.sections import transport_name
from senddock.config.webhooks import webhook_problems
from senddock.durations import parse_duration
from senddock.pacing.limits import pacing_problems
from senddock.sizes import parse_size

Check = Callable[[Mapping[str, Any], Mapping[str, str]], Iterable[tuple[str, str]]]
_REGISTERED: list[Check] = []


def register(check: Check) -> Check:
    """Add ``check`` to every later validation (a decorator; registering twice is harmless)."""
    if check not in _REGISTERED:
        _REGISTERED.append(check)
    return check


def problems(data: Mapping[str, Any], transports: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """Every problem the built-in and the registered checks find."""
    for check in (_core_problems, _webhook_problems, *_REGISTERED):
        yield from check(data, transports)


def _webhook_problems(data: Mapping[str, Any], transports: Mapping[str, str]) -> Iterable[tuple[str, str]]:
    return webhook_problems(data)


def _core_problems(data: Mapping[str, Any], transports: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    name = transport_name(data["transport"])
    if name not in transports:
        installed = ", ".join(sorted(transports)) or "none"
        where = "$.transport" if isinstance(data["transport"], str) else "$.transport.name"
        yield where, f"{name!r} is not an installed transport (installed: {installed})"
    heartbeat = parse_duration(data["recovery"]["heartbeat"])
    lease = parse_duration(data["recovery"]["lease"])
    if lease < 3 * heartbeat:
        yield "$.recovery.lease", (
            f"must be at least three heartbeats ({data['recovery']['lease']} < 3 x {data['recovery']['heartbeat']})"
        )
    if heartbeat <= 0:
        yield "$.recovery.heartbeat", "must be longer than 0s"
    breaker = data["breaker"]
    if breaker["early_bounces"] >= breaker["early_window"]:
        yield "$.breaker.early_bounces", (
            f"must be less than breaker.early_window ({breaker['early_bounces']} >= {breaker['early_window']}): "
            "more bounces than results can never happen")
    if parse_duration(breaker["probe_interval"]) > parse_duration(breaker["probe_max_interval"]):
        yield "$.breaker.probe_interval", "must not be longer than breaker.probe_max_interval"
    yield from pacing_problems(data["pacing"], transports)
    if "concurrency" in data and "workers" in data:
        yield "$.workers", "the former name of concurrency: set concurrency alone"
    unsubscribe = data["unsubscribe"]
    if (unsubscribe["url"] or unsubscribe["mailto"]) and not unsubscribe["secret"]:
        yield "$.unsubscribe.secret", "required with unsubscribe.url or unsubscribe.mailto: the links are signed with it"
    serve = data["serve"]
    if bool(serve["tls_cert_file"]) != bool(serve["tls_key_file"]):
        yield "$.serve", "tls_cert_file and tls_key_file go together"
    for where, networks in (("metrics.allow", serve["metrics"]["allow"]), ("trusted_proxies", serve["trusted_proxies"])):
        for i, network in enumerate(networks):
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                yield f"$.serve.{where}[{i}]", f"{network!r} is not an IP address or network (e.g. 10.0.0.0/8)"
    if parse_size(data["bounces"]["max_message_size"]) < 1024:
        yield "$.bounces.max_message_size", (f"must be at least 1KiB ({data['bounces']['max_message_size']!r}): "
                                             "a delivery status notification alone is larger")
    if parse_size(serve["max_body"]) < 1024:
        yield "$.serve.max_body", f"must be at least 1KiB ({serve['max_body']!r}): an SNS notification alone is larger"
    if parse_duration(data["database"]["stuck_after"]) <= 0:
        yield "$.database.stuck_after", "must be longer than 0s"
    for key in ("body_timeout", "header_timeout", "keep_alive_timeout", "sns_certificate_timeout"):
        if parse_duration(serve[key]) <= 0:
            yield f"$.serve.{key}", "must be longer than 0s"

