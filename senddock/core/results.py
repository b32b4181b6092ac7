"""From a send to what is committed: capture the send as a value, classify it, compute the backoff.

No exception from a plugin crosses this module: a raising transport is a failed SendResult, a
raising classifier or backoff plugin falls back to the built-in default, logged.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

import pluggy
import structlog

from senddock import defaults
from senddock.config import Config
from senddock.store.jobs import JobResult
from senddock.outcome import Classification, Message, Outcome, RetryDecision, SendResult

if TYPE_CHECKING:  # annotations only: rendering (Jinja2, DKIM) is no import of a status query
    from senddock.mail.compose import BadRecipient
    from senddock.mail.templates import TemplateError

log = structlog.get_logger(__name__)


def send(pm: pluggy.PluginManager, config: Config, message: Message, worker_state: MutableMapping[str, Any]) -> SendResult:
    try:
        result = pm.hook.send_message(
            message=message, transport=config.transport, config=config, worker_state=worker_state
        )
    except BaseException as exc:  # noqa: BLE001 - captured as a value, classified like any result
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return SendResult.from_exception(config.transport, exc)
    if result is None:
        return SendResult(config.transport, ok=False, text=f"no plugin answered send_message for transport {config.transport!r}",
                          phase="no_transport")
    return result


# The paused_reason of a campaign whose templates did not render for a recipient; details follow.
TEMPLATE_ERROR = "template_error"


def template_failure(error: TemplateError, email: str, campaign_id: int) -> tuple[SendResult, Classification]:
    """A recipient whose data does not render: our fault (the template's or the data's), not the
    recipient's. Nothing is sent, the job goes back in line as it was and the campaign pauses with
    the error, so fixing the data and `campaign resume` sends it; a campaign never finishes with
    failures that a fix could have avoided.

    The pause reason names the recipient it failed for and where the others are listed: `campaign
    status` shows the reason alone, and the data to fix is that recipient's. One line, whatever the
    error's text holds (status shows the reason on one line)."""
    result = SendResult("engine", ok=False, text=str(error), phase="render", error=error)
    detail = " ".join(str(error).split())
    reason = (f"{TEMPLATE_ERROR}: {detail}; first at {email} "
              f"(senddock campaign log {campaign_id} --outcome pause)")
    return result, Classification(Outcome.PAUSE, reason)


# The phase of a job refused before any transport saw it: it says nothing about the relay.
ADDRESS_PHASE = "address"


def bad_recipient_failure(error: BadRecipient) -> tuple[SendResult, Classification]:
    """A recipient whose address or name cannot go into a header: failed, never sent, never
    suppressed (the address may be fine once the data is fixed)."""
    result = SendResult("engine", ok=False, text=str(error), phase=ADDRESS_PHASE, error=error)
    return result, Classification(Outcome.FAIL, "bad_address", about_recipient=True)


def classify(pm: pluggy.PluginManager, config: Config, result: SendResult, message: Message) -> Classification:
    if result.phase == "no_transport" and not result.ok:
        return Classification(Outcome.PAUSE, "no_transport")
    try:
        verdict = pm.hook.classify_result(result=result, message=message, config=config)
    except Exception as exc:
        log.error("plugin_failed", hook="classify_result", error=repr(exc), job_id=message.job_id)
        verdict = None
    return verdict or defaults.classify_result(result=result)


def backoff(pm: pluggy.PluginManager, config: Config, attempt: int, verdict: Classification, age: float,
            deferrals: int = 0) -> RetryDecision:
    kwargs = {"attempt": attempt, "classification": verdict, "age": age, "config": config, "deferrals": deferrals}
    try:
        decision = pm.hook.compute_backoff(**kwargs)
    except Exception as exc:
        log.error("plugin_failed", hook="compute_backoff", error=repr(exc))
        decision = None
    return decision or defaults.compute_backoff(**kwargs)


def job_result(
    pm: pluggy.PluginManager,
    config: Config,
    result: SendResult,
    verdict: Classification,
    *,
    attempt: int,
    age: float,
    attempts_before: int,
    deferrals_before: int = 0,
) -> JobResult:
    """The job's next state for this classification."""
    common: dict[str, Any] = {
        "last_result": describe(result),
        "in_doubt": verdict.in_doubt or result.may_have_sent,
        "phase": result.phase,
        "code": result.code,
        "enhanced_code": result.enhanced_code,
        "provider_message_id": result.provider_message_id,
        "ok": result.ok,
    }
    outcome = verdict.outcome
    if outcome is Outcome.SENT:
        return JobResult(status="sent", outcome="sent", counts=True, **common)
    if outcome is Outcome.BOUNCE:
        return JobResult(status="failed", outcome="bounce", counts=True, failure_reason="bounced", bounce=True, **common)
    if outcome is Outcome.FAIL:
        return JobResult(status="failed", outcome="fail", counts=True, failure_reason=verdict.reason, **common)
    if outcome is Outcome.PAUSE:
        # Not the recipient's fault: the attempt does not count, the job goes back as it was.
        return JobResult(status="pending" if attempts_before == 0 else "retry", outcome="pause", counts=False, **common)
    # Throttling or relay trouble is not the recipient's attempt: it does not use up their retries,
    # and the deferrals make its backoff grow instead (bounded by retry.max_age).
    deferral = verdict.deferral
    decision = backoff(pm, config, attempt, verdict, age, deferrals_before + deferral)
    if decision.stop:
        # The attempt that ended it is its failure: campaign log, the charts and the bounce-rate
        # window see a final 'fail' (it was a 'retry' row, and a job failed as retries_exhausted
        # showed no failure anywhere in its log).
        return JobResult(status="failed", outcome="fail", counts=True, failure_reason=decision.reason, **common)
    return JobResult(status="retry", outcome="retry", counts=not deferral, delay=decision.delay, deferred=deferral,
                     **common)


def describe(result: SendResult) -> str:
    """A result in one line: its codes and text (what last_result and probe answers show)."""
    parts = [str(p) for p in (result.code, result.enhanced_code) if p]
    text = result.text.strip()
    return " ".join(parts + ([text] if text else [])) or ("accepted" if result.ok else "failed")
