"""A transport that accepts every message at once, so a benchmark measures the queue, not a server.

Loaded by the benchmarks with ``plugins.load: [senddock_bench_plugins]`` and ``transport: instant``.
"""

from __future__ import annotations

from senddock import hookimpl
from senddock.outcome import SendResult


@hookimpl
def transport_names() -> list[str]:
    return ["instant"]


@hookimpl
def send_message(message, transport):
    if transport != "instant":
        return None
    return SendResult("instant", ok=True, code=250, text="accepted")
