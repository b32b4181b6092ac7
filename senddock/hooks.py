"""Hook specifications: the whole contract between senddock's engine and its plugins.

A plugin is any module or object with functions marked ``@senddock.hookimpl`` whose names are the hooks
below (a transport can subclass :class:`senddock.Transport`, which implements them over a few methods).
Hooks are called with keyword arguments, so an implementation may accept only the arguments it
needs, and later versions can add arguments without breaking it.

The hooks are grouped by the phase that calls them: loading, sending, results, aftercare. Each says
how it is called: a ``firstresult`` hook stops at the first implementation that returns something
other than None ("the first non-None result wins"); every implementation of the others is called.

Exceptions must not escape a hook: the engine captures whatever ``send_message`` raises as a
:class:`~senddock.outcome.SendResult`, and treats a raising classifier or backoff hook as a failure of
that one job. Nothing here imports the engine at run time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from email.message import EmailMessage

    from senddock.outcome import (
        Bounce,
        BounceReport,
        Classification,
        Message,
        PluginConfig,
        ProviderEvent,
        RetryDecision,
        SendResult,
        SuppressionList,
    )

PROJECT_NAME = "senddock"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --------------------------------------------------------------------------------------------------
# Loading: once, while the plugin manager is built and the config read, before anything is sent.
# --------------------------------------------------------------------------------------------------


@hookspec
def transport_names() -> Iterable[str] | None:
    """Name the transports this plugin provides.

    Called when the plugin manager is built. ``transport:`` in the config must name one of the
    transports some plugin provides; the plugin then answers ``send_message`` for that name.
    Every implementation is called (not firstresult), each on its own: one that raises is reported
    as a config error naming its plugin.

    :return: transport names such as ``["smtp"]``, or None if the plugin provides none.
    """


@hookspec
def config_schema() -> Mapping[str, Mapping[str, Any]] | None:
    """Contribute the JSON Schema of the plugin's own top-level config section(s).

    Called once while the configuration is loaded, before it is validated. The returned schemas are
    inserted under ``properties`` of the config schema (Draft 2020-12), so a plugin's settings are
    validated as strictly as senddock's: give ``"additionalProperties": false`` and ``"default"``
    values; defaults are filled in before the plugin sees its section. Every implementation is
    called (not firstresult), each on its own: one that raises is reported as a config error
    naming its plugin; a section claimed by two plugins is an error too.

    :return: a mapping of section name (e.g. ``"smtp"``) to its JSON Schema, or None.
    """


@hookspec
def config_problems(config: Mapping[str, Any]) -> Iterable[tuple[str, str]] | None:
    """Find what the JSON Schema cannot say about the plugin's settings: a value that is wrong
    only given another section's (e.g. a return path with ``{token}`` and no ``bounces.secret``).

    Called once the whole config is valid and its defaults filled in. ``senddock run``,
    ``check-config`` and every other command refuse the config while any plugin reports a problem.
    Every implementation is called (not firstresult) and every problem reported; do not raise (an
    exception ends the load).

    :param config: the entire config mapping, environment references resolved (never log it).

    :return: ``(key path, problem)`` pairs such as ``("$.smtp.return_path", "needs bounces.secret")``,
        or None when all is well.
    """


# --------------------------------------------------------------------------------------------------
# Sending: in each of a node's sender threads (and once for ``send-test``), and its prober thread.
# --------------------------------------------------------------------------------------------------


@hookspec
def worker_started(worker_state: MutableMapping[str, Any], config: PluginConfig) -> None:
    """Prepare a sender thread's state before its first send (open a connection to the relay ahead).

    Called once by each sender thread of ``senddock run`` as it starts (``concurrency`` calls per
    node, at once). The node waits for these calls before its first claim, at most 5 seconds
    (then it claims anyway, and a call still running only delays its thread's first send): a paced
    burst then goes out on open connections instead of opening them all at the moment it may
    begin. Optional: a transport that does nothing here opens its connection at its first send, as
    before. Not called by ``send-test``. Every implementation is called (not firstresult), each on
    its own: one that raises is logged with its plugin's name, and the next is called all the same.

    :param worker_state: the dict that thread will pass to every ``send_message`` call.
    :param config: the validated configuration.
    :return: nothing; return values are ignored. A failure here must not be reported as a send's:
        keep nothing (the first send opens its own connection and reports what goes wrong). Do
        not raise: a raising implementation is logged and the thread sends all the same.
    """


@hookspec(firstresult=True)
def send_message(
    message: Message,
    transport: str,
    config: PluginConfig,
    worker_state: MutableMapping[str, Any],
) -> SendResult | None:
    """Send one message through the active transport.

    Called by one of the node's sender threads (``concurrency`` of them) for each claimed job,
    after the mark that the send may have begun has been committed. No database connection is held
    and no transaction is open during the call, so it may block for as long as the relay takes to
    answer (``send-test`` calls it too, for its one message).

    :param message: the job's message (recipient, campaign content, deterministic Message-ID).
    :param transport: the name of the active transport (``transport:`` in the config). A transport
        plugin answers only when this is one of its own names and returns None otherwise.
    :param config: the validated configuration; ``config.section("smtp")`` is a plugin's section.
    :param worker_state: a dict private to the calling sender thread and kept across its sends
        (one per sender thread, so never shared between two sends at once); store reusable
        resources (an SMTP connection) under a key of the plugin's own.
    :return: a :class:`~senddock.outcome.SendResult`. Return None to let other plugins decide; the
        first non-None result wins. Raising is allowed: the engine captures the exception as a
        failed ``SendResult`` and classifies it, so a failing plugin fails a job, not a sender.
    """


@hookspec
def worker_stopped(worker_state: MutableMapping[str, Any], config: PluginConfig) -> None:
    """Release what a plugin kept in a sender thread's state (an open SMTP connection).

    Called once by each sender thread of ``senddock run`` as it stops (``concurrency`` calls per
    node), whether it stops cleanly or after an error, and by ``send-test`` after its one send.
    Every implementation is called (not firstresult), each on its own: one that raises is logged
    with its plugin's name, and the next still closes what it kept.

    :param worker_state: the dict that thread passed to every ``send_message`` call.
    :param config: the validated configuration.
    :return: nothing; return values are ignored.
    """


@hookspec(firstresult=True)
def probe_transport(transport: str, config: PluginConfig) -> SendResult | None:
    """Check, without sending any message, that the active transport's relay or API answers.

    Called by the engine, with backoff (``breaker.probe_interval`` doubling up to
    ``breaker.probe_max_interval``), while a campaign is paused for relay trouble: a run of
    ``transport.max_consecutive_failures`` failures that were all ``relay_trouble`` (no connection,
    timeouts, the relay's own X.3/X.4 replies). The campaign resumes by itself once a probe
    succeeds. Called from the engine's prober thread, outside any send and any transaction.

    :param transport: the active transport's name; answer only for one of your own.
    :param config: the validated configuration.
    :return: a :class:`~senddock.outcome.SendResult` with ``ok=True`` when the relay answered as it
        would for a send (for SMTP: the greeting, EHLO, STARTTLS and AUTH as configured), or
        ``ok=False`` with its code and text. Return None to let other plugins decide; the first
        non-None result wins. When no plugin answers, the engine resumes the campaign after the
        backoff as a trial (a half-open breaker): if the relay still fails, the breaker trips again.
        Raising is allowed: the exception counts as a failed probe.
    """


# --------------------------------------------------------------------------------------------------
# Results: what a send's result means for its job, and when a failed job is tried again.
# --------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def classify_result(result: SendResult, message: Message, config: PluginConfig) -> Classification | None:
    """Decide what a send's result means: sent, retry, bounce, fail or pause.

    Called after every ``send_message``, with the result captured as a value (exceptions included).
    A transport's classifier should answer only for results whose ``result.transport`` is its own,
    so that with several transports installed the one that produced the result decides. A plugin
    that wants to override the transports' rules can use ``tryfirst=True``.

    :param result: what the transport reported, or the exception it raised, as a value.
    :param message: the message that was sent.
    :param config: the validated configuration.
    :return: a :class:`~senddock.outcome.Classification`. Return None to let other plugins decide;
        the first non-None result wins. The built-in default (tried last) treats success as sent,
        network errors as retry and anything else as a failure of the job.
    """


@hookspec(firstresult=True)
def compute_backoff(
    attempt: int,
    classification: Classification,
    age: float,
    config: PluginConfig,
    deferrals: int,
) -> RetryDecision | None:
    """Decide when a transiently failed job is tried again, or that it must stop retrying.

    Called when ``classify_result`` answered ``retry``.

    :param attempt: how many sends of this job have been recorded, including the one that just
        failed (1 after the first send). Throttling and relay trouble (``classification.deferral``)
        are not the recipient's attempts: for them ``attempt`` is the number the next real attempt
        will have.
    :param classification: the retry classification; ``classification.retry_after`` carries a wait
        the server asked for (the default never retries sooner than that); ``throttled`` and
        ``relay_trouble`` say the failure is not the recipient's (the default then ignores
        ``retry.max_retries`` and stops only at ``retry.max_age``).
    :param age: seconds since the job's first send started, on the database's clock.
    :param config: the validated configuration (``retry.schedule``, ``retry.max_retries``...).
    :param deferrals: how many retries of this job were throttling or relay trouble, the one that
        just happened included when it is one.
    :return: ``RetryDecision.retry_in(seconds)``, or ``RetryDecision.give_up()`` to fail the job now
        with reason ``retries_exhausted``. Return None to let other plugins decide; the first
        non-None result wins. The built-in default follows ``retry.schedule``: with the defaults the
        first send plus five retries after 30s, 2m, 8m, 30m and 1h, each jittered by
        ``retry.jitter``.
    """


# --------------------------------------------------------------------------------------------------
# Aftercare: what is learnt after a send: bounces and complaints, by notification or by mail.
# --------------------------------------------------------------------------------------------------


@hookspec
def on_bounced(bounce: Bounce, suppressions: SuppressionList, config: PluginConfig) -> None:
    """React to a dead address or a complaint.

    Called after the job's bounce has been committed, outside any transaction; also for bounces and
    complaints learnt later from provider notifications, and for operator actions. Every
    implementation is called (not firstresult), in one call: one that raises stops it, and the
    engine calls the whole hook again later. If the process dies before every implementation has
    returned, the engine calls the hook again at recovery, so implementations must be idempotent.
    The built-in default adds the address to the suppression list, so later campaigns skip it.

    :param bounce: the address, kind (bounce or complaint), source (transport reply, provider
        notification, operator), codes and diagnostic text, and the job when there is one.
    :param suppressions: the suppression list; ``suppressions.add(email, reason=...)`` is
        idempotent.
    :param config: the validated configuration.
    :return: nothing; return values are ignored.
    """


@hookspec(firstresult=True)
def parse_provider_event(document: Mapping[str, Any], config: PluginConfig) -> list[ProviderEvent] | None:
    """Read one notification a provider sent after the send: bounces, complaints, deliveries.

    Used by ``senddock events ingest`` and ``senddock serve``'s webhook. The plugin that
    recognises the document answers. Return None to let other plugins decide; the first non-None
    result wins.

    :param document: one parsed JSON document as received (for SES: an SNS envelope whose
        ``Message`` is a JSON string, or that bare message).
    :param config: the validated configuration.
    :return: one :class:`~senddock.outcome.ProviderEvent` per recipient it reports (possibly none,
        e.g. an SNS subscription confirmation), or None when the document is not this plugin's.
    :raises senddock.outcome.EventError: the document is this provider's but cannot be read; the
        engine reports it (with its line) and skips it.
    """


@hookspec(firstresult=True)
def parse_bounce_message(message: EmailMessage, config: PluginConfig) -> BounceReport | None:
    """Read one message that came back by mail: a bounce, a complaint, an auto-reply, a reply.

    Used by ``senddock bounces parse``, ``ingest``, ``fetch`` and ``receive``. Add an
    implementation for a provider's own format; the built-in one (``trylast``) reads RFC 3464
    delivery status notifications, RFC 5965 feedback reports, RFC 3834 auto-replies and, through
    flufl.bounce, the non-standard formats old servers still send. Return None to let other
    plugins decide; the first non-None result wins.

    Which job the message is about is decided by senddock from its own signed token (the return
    path the message came back to, or the returned message's Message-ID), never by a parser.
    Raise nothing: a message you cannot read is None (the next parser tries it).

    :param message: the whole message, parsed with ``email.policy.default`` except that a header
        field is read for its first 8 KiB (the package's header parsing grows with the square of a
        header's size; anyone can mail the bounce address). It may be malformed: look at
        ``message.defects`` before trusting its structure.
    :param config: the validated configuration.
    :return: a :class:`~senddock.outcome.BounceReport`, or None when the message is not in a
        format this plugin reads.
    """
