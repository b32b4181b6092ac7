"""Value types that cross hook boundaries.

Plugins import these and :data:`senddock.hookimpl` (a transport also :mod:`senddock.mail.mime`, for
the bytes of a message), never ``senddock.core``. They are small, frozen and free of I/O, so a
plugin can build them in tests without a database.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Recipient:
    """The subscriber a job sends to."""

    email: str
    name: str = ""
    attributes: Mapping[str, Any] = field(default_factory=dict)
    subscriber_id: int | None = None


@dataclass(frozen=True)
class CampaignContent:
    """What the campaign says; templates are rendered per recipient at send time."""

    campaign_id: int
    name: str
    subject: str
    from_addr: str
    reply_to: str | None = None
    text_body: str | None = None
    html_body: str | None = None
    list_id: int | None = None  # the campaign's first list: what List-Id names
    list_name: str | None = None


@dataclass(frozen=True)
class RenderedContent:
    """The campaign's templates rendered for one recipient (text generated when only HTML is given)."""

    subject: str
    text_body: str | None
    html_body: str | None


class MessageSigner(Protocol):
    """Signs a finished message (DKIM); ``senddock.mail.mime.message_bytes`` applies it."""

    def sign(self, message: bytes, *, exclude: Collection[str] = ()) -> bytes:
        """The message with its signature header(s) prepended; ``exclude``: header names a
        transport's provider rewrites, left out of the signature so it stays valid."""


@dataclass(frozen=True)
class Message:
    """One job's message, handed to ``send_message``: everything a transport needs, ready to go.

    ``message_id`` is derived from the job, so a resend after a crash carries the same Message-ID.
    ``content`` is rendered for this recipient; ``headers`` are the list headers the engine adds
    (List-Id, List-Unsubscribe, List-Unsubscribe-Post, Feedback-ID...). ``senddock.mail.mime`` turns it
    into a standards-correct, signed MIME message, so every transport sends the same bytes.
    """

    job_id: int
    broadcast_id: int
    attempt: int
    recipient: Recipient
    campaign: CampaignContent
    message_id: str
    content: RenderedContent
    headers: Mapping[str, str] = field(default_factory=dict)
    signer: MessageSigner | None = field(default=None, compare=False, repr=False)
    # The job's signed VERP token (senddock.mail.verp), for a transport's return path; None
    # without bounces.secret.
    bounce_token: str | None = None


@dataclass(frozen=True)
class SendResult:
    """What a transport reports for one send; also built by the engine from an exception.

    :ivar transport: name of the transport that produced it (classifiers answer only for their own).
    :ivar ok: the transport believes the message was accepted.
    :ivar code: the protocol's status code (SMTP reply code, HTTP status), when there is one.
    :ivar enhanced_code: RFC 3463 enhanced status code such as ``5.1.1``, when there is one.
    :ivar text: the server's text or the exception's message.
    :ivar phase: where it happened (``connect``, ``ehlo``, ``starttls``, ``auth``, ``mail``, ``rcpt``,
        ``data``, ``api``...), so classifiers can tell a dead mailbox from a broken relay.
    :ivar error: the exception raised by the transport, when it raised one (captured, never re-raised).
    :ivar provider_message_id: the id the provider gave the message (SES MessageId, queue id).
    :ivar may_have_sent: the transport cannot tell whether the message went out (e.g. a disconnect
        after the final "." of DATA, a timeout after an API request was sent).
    """

    transport: str
    ok: bool
    code: int | None = None
    enhanced_code: str | None = None
    text: str = ""
    phase: str | None = None
    error: BaseException | None = field(default=None, compare=False)
    provider_message_id: str | None = None
    may_have_sent: bool = False

    @classmethod
    def from_exception(cls, transport: str, error: BaseException, *, phase: str | None = None) -> SendResult:
        """Capture an exception raised by a transport as a value."""
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        return cls(transport=transport, ok=False, text=text, phase=phase, error=error)


class Outcome(str, enum.Enum):
    """What the engine does with a job after a send."""

    SENT = "sent"  # delivered: the job is done and never touched again
    RETRY = "retry"  # transient: try again after compute_backoff's delay
    BOUNCE = "bounce"  # the recipient's address is dead: fail the job and call on_bounced
    FAIL = "fail"  # permanent, but not about the address: fail the job, suppress nobody
    PAUSE = "pause"  # a sending problem no recipient caused: put the job back, pause the campaign


@dataclass(frozen=True)
class Classification:
    """The answer of ``classify_result``.

    :ivar outcome: what to do with the job.
    :ivar reason: a short machine-readable cause (``bounced``, ``rejected``, ``auth_failed``...);
        for FAIL it becomes the job's failure reason, for PAUSE the campaign's paused reason.
    :ivar in_doubt: the message may have been delivered although the send did not report success.
    :ivar retry_after: seconds the server asked us to wait, passed to ``compute_backoff``.
    :ivar about_recipient: the failure is about this recipient (counts towards nothing else);
        failures that are not (connection errors, relay policy) count towards pausing the campaign.
    :ivar throttled: the receiver or provider asked us to slow down (SMTP 421, 4.7.x rate limits,
        an API's Throttling): retried later without using up the recipient's ``retry.max_retries``,
        and never counted towards pausing the campaign.
    :ivar relay_trouble: the relay, its network or its mail system failed, not the recipient
        (no connection, timeouts, X.3.x and X.4.x replies): retried without using up the recipient's
        retries; counts towards pausing the campaign, and such a pause resumes by itself once the
        relay answers a probe.
    """

    outcome: Outcome
    reason: str
    in_doubt: bool = False
    retry_after: float | None = None
    about_recipient: bool = False
    throttled: bool = False
    relay_trouble: bool = False

    @property
    def deferral(self) -> bool:
        """A retry that does not use up the recipient's retries (throttling, relay trouble)."""
        return self.outcome is Outcome.RETRY and (self.throttled or self.relay_trouble)


@dataclass(frozen=True)
class RetryDecision:
    """The answer of ``compute_backoff``: retry after a delay, or stop retrying.

    Build it with :meth:`retry_in` or :meth:`give_up`; ``delay`` is ``None`` exactly when giving up.
    """

    delay: float | None
    reason: str = "retries_exhausted"

    @classmethod
    def retry_in(cls, seconds: float) -> RetryDecision:
        return cls(delay=max(0.0, float(seconds)))

    @classmethod
    def give_up(cls, reason: str = "retries_exhausted") -> RetryDecision:
        return cls(delay=None, reason=reason)

    @property
    def stop(self) -> bool:
        return self.delay is None


class BounceKind(str, enum.Enum):
    BOUNCE = "bounce"  # the address does not accept mail
    COMPLAINT = "complaint"  # the recipient marked a message as spam


class BounceSource(str, enum.Enum):
    TRANSPORT = "transport"  # the transport's reply during the send (e.g. SMTP 550 5.1.1 at RCPT)
    NOTIFICATION = "notification"  # a provider's later notification (SES/SNS, a DSN)
    OPERATOR = "operator"  # a person said so (CLI, API)


@dataclass(frozen=True)
class JobRef:
    """The job a bounce belongs to, when there is one."""

    job_id: int
    broadcast_id: int
    campaign_id: int | None = None


@dataclass(frozen=True)
class Bounce:
    """A dead address or a complaint, handed to ``on_bounced``.

    :ivar email: the address.
    :ivar kind: bounce or complaint.
    :ivar source: where we learnt it.
    :ivar code: the status code that told us (``550``), if any.
    :ivar enhanced_code: RFC 3463 code (``5.1.1``) or the provider's bounce sub-type.
    :ivar diagnostic: the server's or provider's text.
    :ivar job: the job it belongs to, when there is one.
    :ivar soft: a soft bounce (mailbox full, a server that gave up after retrying) that repeated
        ``bounces.soft.limit`` times within ``bounces.soft.window``; False for a hard bounce.
    """

    email: str
    kind: BounceKind
    source: BounceSource
    code: int | None = None
    enhanced_code: str | None = None
    diagnostic: str = ""
    job: JobRef | None = None
    soft: bool = False

    @property
    def suppression_reason(self) -> str:
        return "complained" if self.kind is BounceKind.COMPLAINT else "bounced"


@dataclass(frozen=True)
class ProviderEvent:
    """One recipient's fate as a provider reports it after the send (a bounce or complaint
    notification, a delivery), returned by ``parse_provider_event``.

    :ivar kind: ``bounce``, ``complaint`` or ``delivery``.
    :ivar email: the recipient it is about.
    :ivar provider_message_id: the id the provider gave the message at send time.
    :ivar event_key: unique per event and recipient, so the same notification applied twice is
        recorded once (e.g. the provider's feedback id and the address).
    :ivar suppresses: the address must not be mailed again (a permanent bounce, a complaint).
    :ivar bounce_type: the provider's bounce type (``Permanent``, ``Transient``, ``Undetermined``).
    :ivar sub_type: the provider's sub-type (``General``, ``OnAccountSuppressionList``...).
    :ivar diagnostic: the remote server's text or the provider's.
    :ivar job_id: the job, when the provider echoes it back (message tags).
    :ivar occurred_at: when it happened, ISO 8601, as the provider says.
    :ivar about_recipient: False for a transient bounce that refused our message rather than the
        address (content, size, policy): it never counts towards ``bounces.soft.limit``.
    """

    kind: str
    email: str
    provider_message_id: str | None
    event_key: str
    suppresses: bool = False
    bounce_type: str | None = None
    sub_type: str | None = None
    diagnostic: str = ""
    job_id: int | None = None
    occurred_at: str | None = None
    about_recipient: bool = True


class MailReportKind(str, enum.Enum):
    """What a message that came back by mail is (``senddock bounces parse`` prints the value)."""

    HARD = "hard"  # a permanent failure about the recipient: suppress
    SOFT = "soft"  # temporary, or not the recipient's fault (mailbox full, policy on our message)
    COMPLAINT = "complaint"  # an ARF abuse report: suppress, always
    AUTO_REPLY = "auto_reply"  # vacation, out-of-office, challenge-response: never a bounce
    NOT_BOUNCE = "not_bounce"  # anything else: a person's reply, a delay warning, a delivery report


@dataclass(frozen=True)
class RecipientStatus:
    """One recipient's fate in a report that gives each its own (a DSN's per-recipient block)."""

    address: str
    kind: MailReportKind
    status: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class BounceReport:
    """What a bounce parser read in one message, returned by ``parse_bounce_message``.

    Which job it is about is not the parser's to say: senddock finds the job from its own signed
    token, so no parser (and no sender) can point a report at someone else.

    :ivar kind: see :class:`MailReportKind`.
    :ivar recipients: the failed recipients (lower-case addresses) the report names, for a
        complaint the complaining recipient when the report says; empty for replies.
    :ivar status: the RFC 3463 status (``5.1.1``) that decided the kind, when there is one.
    :ivar reason: the receiving server's text (a DSN's Diagnostic-Code), or what the parser saw.
    :ivar parser: which parser recognised the message (``dsn``, ``arf``, ``auto_reply``, ``legacy``...).
    :ivar per_recipient: each recipient's own kind, status and reason when the format gives them
        (a DSN naming several): the job's own address is judged by its own line, not the worst.
    """

    kind: MailReportKind
    recipients: tuple[str, ...] = ()
    status: str | None = None
    reason: str | None = None
    parser: str = ""
    per_recipient: tuple[RecipientStatus, ...] = ()


class EventError(ValueError):
    """A notification a parser recognises as its provider's but cannot read; the message says why."""


# Why an address is suppressed: the ``reason`` of :meth:`SuppressionList.add`. Here, not in the
# engine's suppression module, so the CLI can offer them as choices without importing the engine.
SUPPRESSION_REASONS = ("bounced", "complained", "unsubscribed", "manual")


class SuppressionList(Protocol):
    """What ``on_bounced`` implementations get to record a suppression (the engine provides it)."""

    def add(
        self,
        email: str,
        *,
        reason: str,
        code: str | None = None,
        diagnostic: str | None = None,
        broadcast_id: int | None = None,
    ) -> bool:
        """Suppress ``email``; idempotent. Returns True when the address was not suppressed before."""
        ...  # pragma: no cover


class PluginConfig(Protocol):
    """Read-only view of the validated configuration given to hooks."""

    def section(self, name: str) -> Mapping[str, Any]:
        """A plugin's own section with its schema's defaults filled in (empty mapping if absent)."""
        ...  # pragma: no cover

    @property
    def transport(self) -> str:
        """Name of the active transport."""
        ...  # pragma: no cover
