"""Built-in default hook implementations, registered ``trylast`` so that any plugin overrides them."""

from __future__ import annotations

import random
import socket
import ssl
from typing import TYPE_CHECKING

from senddock.hooks import hookimpl
from senddock.outcome import (
    Bounce,
    BounceReport,
    Classification,
    Outcome,
    PluginConfig,
    RetryDecision,
    SendResult,
    SuppressionList,
)
from senddock.retry import retry_settings

if TYPE_CHECKING:
    from email.message import EmailMessage

# Failures of the network or the peer, not of the message: worth another try later.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    socket.gaierror,
    socket.timeout,
    ssl.SSLEOFError,
)


@hookimpl(trylast=True)
def classify_result(result: SendResult) -> Classification:
    """Success is sent; network trouble is retried; anything else (a plugin's bug) fails the job."""
    if result.ok:
        return Classification(Outcome.SENT, "sent")
    if result.error is None or isinstance(result.error, TRANSIENT_ERRORS):
        return Classification(Outcome.RETRY, "transient_error", in_doubt=result.may_have_sent)
    return Classification(Outcome.FAIL, "plugin_error", in_doubt=result.may_have_sent)


@hookimpl(trylast=True)
def compute_backoff(attempt: int, classification: Classification, age: float, config: PluginConfig,
                    deferrals: int = 0) -> RetryDecision:
    """``retry.schedule[n-1]`` before the n-th retry (the last delay repeats), jittered, never sooner
    than the server asked; give up after ``retry.max_retries`` retries (``retries_exhausted``) or
    once ``retry.max_age`` has passed since the first send (``expired``).

    Throttling and relay trouble (``classification.deferral``) never use up ``max_retries``: their
    delay follows the schedule by the deferrals in a row, and only ``retry.max_age`` ends them."""
    retry = retry_settings(config.section("retry"))
    if classification.deferral:
        step = max(0, deferrals - 1)
    else:
        step = attempt - 1
        if step >= retry.max_retries:
            return RetryDecision.give_up()
    delay = retry.schedule[min(step, len(retry.schedule) - 1)]
    delay *= 1 + random.uniform(-retry.jitter, retry.jitter)
    if classification.retry_after is not None:
        delay = max(delay, classification.retry_after)
    if retry.max_age is not None and age + delay > retry.max_age:
        return RetryDecision.give_up("expired")
    return RetryDecision.retry_in(delay)


@hookimpl(trylast=True)
def on_bounced(bounce: Bounce, suppressions: SuppressionList) -> None:
    """Suppress the address so that no later campaign reaches it."""
    suppressions.add(
        bounce.email,
        reason=bounce.suppression_reason,
        code=" ".join(str(c) for c in (bounce.code, bounce.enhanced_code) if c) or None,
        diagnostic=bounce.diagnostic or None,
        broadcast_id=bounce.job.broadcast_id if bounce.job else None,
    )


@hookimpl(trylast=True)
def parse_bounce_message(message: EmailMessage) -> BounceReport:
    """DSN (RFC 3464), ARF (RFC 5965), the old non-standard bounces (flufl.bounce), auto-replies
    (RFC 3834); anything else is no bounce."""
    from senddock.bounces import builtin  # the parsers load flufl.bounce: only where mail is read

    return builtin.parse(message)
