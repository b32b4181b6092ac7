"""A worker thread: claim a small batch, send each job, commit each result with the next job's start.

Per job the database sees one statement (result + attempt row + next start mark, one commit); per
batch one claim. No transaction is open while a message is being sent.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import psycopg
import structlog

from senddock.mail.compose import BadRecipient
from senddock.core import results
from senddock.core.epoch import ensure_epoch
from senddock.core.queue import ClaimedJob, JobResult, Queue, Recorded
from senddock.errors import error_line
from senddock.outcome import (
    Bounce,
    BounceKind,
    BounceSource,
    CampaignContent,
    JobRef,
    Message,
    Recipient,
)
from senddock.mail.templates import TemplateError

if TYPE_CHECKING:
    from senddock.core.runner import Runner

log = structlog.get_logger(__name__)


@dataclass
class _Result:
    """A result committed (or tried) whose durability is not known yet."""

    job: ClaimedJob
    attempt: int
    started_at: datetime
    result: JobResult
    hooks_ran: bool = False  # its on_bounced hooks ran (a re-recorded bounce must not queue them again)


@dataclass
class _Batch:
    """A claimed batch. Its token stays in ``runner.held_tokens`` (so this node's orphan recovery
    leaves it alone) until the worker has settled it: every result durable, every job that never
    started put back."""

    token: uuid.UUID
    jobs: list[ClaimedJob] | None = None  # None until the claim's reply arrives
    claimed_monotonic: float = 0.0  # this node's monotonic clock when the claim's reply arrived
    begun: set[int] = field(default_factory=set)
    # Results committed asynchronously that no synchronous commit has covered yet, and a result
    # whose commit failed: a Postgres crash may have lost them.
    unsure: list[_Result] = field(default_factory=list)
    broken: bool = False  # its connection broke: settle it on the next one

    def unstarted(self) -> list[ClaimedJob]:
        return [j for j in self.jobs or () if j.id not in self.begun and not j.suppressed]


class Worker(threading.Thread):
    def __init__(self, runner: Runner, index: int) -> None:
        super().__init__(name=f"senddock-worker-{index}", daemon=True)
        self.runner = runner
        self.index = index
        self.busy = False
        self._state: dict[str, Any] = {}
        self._campaigns: dict[int, CampaignContent] = {}
        self._async_results = runner.config.database.result_commit == "async"
        # Batches whose tokens are held: the current one, and earlier ones not settled yet.
        self._held: list[_Batch] = []
        # Broadcasts this worker recorded results for since it last tried to finish campaigns.
        self._touched: set[int] = set()
        # The server epoch this worker's held results were last known under (see the lifeline).
        self._epoch = None

    def run(self) -> None:
        runner = self.runner
        backoff = 0.1
        try:
            while not runner.stopping.is_set():
                try:
                    with runner.db.connection() as conn:
                        backoff = 0.1
                        queue = runner.queue(conn)
                        self._epoch = ensure_epoch(conn).id
                        self._settle(queue)
                        self._loop(queue)
                except psycopg.OperationalError as exc:
                    log.warning("worker_db_lost", worker=self.index, error=error_line(exc), retry_in=backoff)
                except Exception:
                    # Never a dead worker: a read-only server after a failover, bad bytes in a reply...
                    # Its unsettled batches are settled on the next connection.
                    log.exception("worker_error", worker=self.index, retry_in=backoff)
                    for batch in self._held:
                        batch.broken = True
                self.busy = False
                runner.stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        finally:
            self.busy = False
            self._last_settle()
            try:
                runner.pm.hook.worker_stopped(worker_state=self._state, config=runner.config)
            except Exception as exc:
                log.error("plugin_failed", hook="worker_stopped", error=repr(exc))

    # -- holding and settling batches ----------------------------------------------------------

    def _hold(self, batch: _Batch) -> None:
        self._held.append(batch)
        self.runner.held_tokens.add(batch.token)

    def _unhold(self, batch: _Batch) -> None:
        if batch in self._held:
            self._held.remove(batch)
            self.runner.held_tokens.discard(batch.token)

    def _settle(self, queue: Queue) -> dict[int, Recorded]:
        """On a new connection: make every held batch's record exact, then let go of it.

        A result the server lost (a crash-restart or failover dropped the end of the WAL) or whose
        commit failed is committed again, unless the attempt row shows it went through; jobs whose
        send never began go back as they were. This worker knows exactly which jobs it began, so
        nothing here is in doubt. Returns what each newly committed result did.
        """
        recorded: dict[int, Recorded] = {}
        for batch in list(self._held):
            for item in batch.unsure:
                recorded[item.job.id] = self._settle_result(queue, item)
            released = queue.release_claim(batch.token) if batch.jobs is None else queue.release(batch.unstarted())
            if released:
                log.info("batch_put_back", worker=self.index, jobs=released)
            self._unhold(batch)
        return recorded

    def _settle_result(self, queue: Queue, item: _Result) -> Recorded:
        """One result of unknown durability: already there, or committed again (synchronously: a
        second crash must not lose it again once its batch is let go)."""
        claim_lost = queue.result_recorded(item.job, item.started_at)
        if claim_lost is None:
            again = queue.record(item.job, item.attempt, item.started_at, item.result, None, synchronous=True)
            log.warning("result_committed_again", worker=self.index, job_id=item.job.id,
                        outcome=item.result.outcome, claim_lost=not again.recorded)
            if item.result.bounce and item.hooks_ran:
                queue.bounce_done(item.job.id)
            return again
        # It went through; only its reply was lost (or the crash spared it). Under a lost claim,
        # a delivery must still be marked sent unless someone sent it since.
        late_sent = claim_lost and item.result.ok and queue.late_success(item.job, item.result)
        return Recorded(recorded=not claim_lost, late_sent=late_sent, next_ours=False, next_campaign_status=None)

    def _settle_if_the_server_lost_wal(self, queue: Queue) -> None:
        """The lifeline saw a new server epoch: results this worker committed asynchronously may be
        gone even though its own connection never broke (a pooler in transaction mode keeps the
        client side of it open across a Postgres crash). Check them now."""
        epoch = self.runner.lifeline.epoch
        if epoch is None or epoch == self._epoch:
            return
        if self._epoch is not None and self._held:
            log.warning("server_epoch_changed", worker=self.index, batches=len(self._held))
            self._settle(queue)
        self._epoch = epoch

    def _last_settle(self) -> None:
        """On the way out: settle on a fresh connection if there is anything to settle, else leave
        it to recovery (a job whose send began is then in doubt)."""
        if not any(b.broken or b.unsure for b in self._held):
            for batch in list(self._held):
                self._unhold(batch)
            return
        try:
            with self.runner.db.connection() as conn:
                self._settle(self.runner.queue(conn))
        except psycopg.Error:
            for batch in list(self._held):
                self._unhold(batch)

    def _durable_up_to_now(self, current: _Batch) -> None:
        """A claim committed synchronously, so the WAL is flushed past every earlier commit: the
        results of earlier batches can no longer be lost."""
        for batch in list(self._held):
            if batch is not current and not batch.broken:
                self._unhold(batch)

    # -- the loop --------------------------------------------------------------------------------

    def _loop(self, queue: Queue) -> None:
        runner = self.runner
        while not runner.stopping.is_set():
            if not runner.lifeline.may_send():
                runner.wait_for_work()  # self-fenced: no claims until the heartbeat is back
                continue
            self._settle_if_the_server_lost_wal(queue)
            self.busy = True
            # The batch's token is held before the claim commits, so orphan recovery never takes
            # a batch a worker is about to send.
            batch = _Batch(uuid.uuid4())
            self._hold(batch)
            try:
                batch.jobs = queue.claim(runner.config.claim_batch, batch.token)
                batch.claimed_monotonic = time.monotonic()
                if batch.jobs:
                    self._durable_up_to_now(batch)
                for job in batch.jobs:
                    if job.suppressed:
                        log.info("job_suppressed", job_id=job.id, broadcast_id=job.broadcast_id)
                live = [j for j in batch.jobs if not j.suppressed]
                if live:
                    self._send_batch(queue, batch, live)
                self._touched.update(j.broadcast_id for j in batch.jobs)
                if len(batch.jobs) < runner.config.claim_batch and self._touched:
                    # The queue is running dry: this worker's last results (in this batch or the
                    # full one before an empty claim) may have finished a campaign.
                    runner.finish_campaigns(queue, self._touched)
                    self._touched = set()
            except psycopg.OperationalError:
                # The connection broke between sends (in the claim, or between two results). The
                # batch stays held and is settled on the next connection.
                batch.broken = True
                raise
            finally:
                if not batch.broken and not batch.unsure:
                    self._unhold(batch)
                self.busy = False
            if not batch.jobs:
                runner.wait_for_work()

    def _send_batch(self, queue: Queue, batch: _Batch, jobs: list[ClaimedJob]) -> None:
        """Send in id order, one at a time: the order is what makes the start of each send durable."""
        runner = self.runner
        pending = list(jobs)
        while pending:
            job = pending.pop(0)
            if runner.stopping.is_set() or not runner.lifeline.may_send():
                queue.release([job, *pending])
                return
            next_job = pending[0] if pending else None
            recorded, outcome = self._send_one(queue, batch, job, next_job)
            if recorded.batch_released:
                return
            if next_job is not None and (outcome.outcome == "pause" or recorded.next_campaign_status != "sending"):
                # Paused or cancelled meanwhile, or the claim was lost: what is not started goes back.
                queue.release(pending)
                return

    def _send_one(self, queue: Queue, batch: _Batch, job: ClaimedJob, next_job: ClaimedJob | None):
        runner = self.runner
        started_at = datetime.now(timezone.utc)
        try:
            message = self._message(queue, job)
        except TemplateError as exc:
            # This recipient's data does not fit the template: the job goes back, the campaign pauses.
            result, verdict = results.template_failure(exc, job.email, job.campaign_id)
        except BadRecipient as exc:
            # A line break in the name or address: this job fails, nothing reaches the relay.
            result, verdict = results.bad_recipient_failure(exc)
        else:
            batch.begun.add(job.id)
            result = results.send(runner.pm, runner.config, message, self._state)
            verdict = results.classify(runner.pm, runner.config, result, message)
        # The job's age on the database's clock (read at the claim) plus this node's monotonic time
        # since: retry.max_age never mixes two clocks.
        age = job.age + (time.monotonic() - batch.claimed_monotonic)
        outcome = results.job_result(
            runner.pm, runner.config, result, verdict, attempt=job.attempts + 1, age=age, attempts_before=job.attempts,
            deferrals_before=job.deferrals,
        )
        item = _Result(job, job.attempts + (1 if outcome.counts else 0), started_at, outcome)
        recorded = self._record(queue, batch, item, next_job)
        item.hooks_ran = self._after(queue, job, verdict, outcome, recorded)
        return recorded, outcome

    def _record(self, queue: Queue, batch: _Batch, item: _Result, next_job: ClaimedJob | None) -> Recorded:
        """Commit the result; if the connection breaks, settle the batch on a new one.

        After a reconnect the rest of the batch is put back on that new connection and the batch
        ends: the worker's own connection is gone.
        """
        try:
            recorded = queue.record(item.job, item.attempt, item.started_at, item.result, next_job)
        except psycopg.OperationalError as exc:
            log.warning("result_commit_failed", job_id=item.job.id, error=error_line(exc))
        else:
            if self._async_results and recorded.recorded:
                batch.unsure.append(item)
            return recorded
        batch.unsure.append(item)
        batch.broken = True
        deadline = time.monotonic() + self.runner.config.recovery.lease
        delay = 0.2
        while True:
            try:
                with self.runner.db.connection() as conn:
                    fresh = self.runner.queue(conn)
                    ensure_epoch(conn)
                    return replace(self._settle(fresh)[item.job.id], batch_released=True)
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("result_commit_failed", job_id=item.job.id, error=error_line(exc), retry_in=delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _after(self, queue: Queue, job: ClaimedJob, verdict, outcome: JobResult, recorded: Recorded) -> bool:
        """Log, count, and act on a recorded result; returns whether on_bounced hooks ran (a bounce
        whose hooks are held for the bounce-rate breaker must keep its pending row)."""
        runner = self.runner
        log.info(
            "send_attempt",
            job_id=job.id,
            broadcast_id=job.broadcast_id,
            attempt=job.attempts + 1,
            outcome=outcome.outcome if recorded.recorded else ("sent" if recorded.late_sent else "claim_lost"),
            code=outcome.code,
            enhanced_code=outcome.enhanced_code,
            reason=verdict.reason,
            retry_in=round(outcome.delay, 1) if outcome.delay is not None else None,
            in_doubt=outcome.in_doubt or None,
        )
        runner.stats.count(outcome.outcome if recorded.recorded else "claim_lost")
        if recorded.batch_released:
            queue = None  # the worker's connection is gone; the runner uses a pooled one
        hooks_ran = False
        if outcome.bounce:
            # Even under a lost claim: the address is dead whoever owns the job now.
            hooks_ran = runner.bounced(self._bounce(job, outcome), queue)
        if not recorded.recorded:
            return hooks_ran
        if outcome.outcome == "pause":
            runner.pause_campaign(job.campaign_id, verdict.reason, queue)
        else:
            # A bad address (about the recipient, refused before the transport) neither adds to a
            # run of relay failures nor ends one: only deliveries end runs.
            runner.track_failures(job.campaign_id, verdict, queue)
        return hooks_ran

    @staticmethod
    def _bounce(job: ClaimedJob, outcome: JobResult) -> Bounce:
        return Bounce(
            email=job.email,
            kind=BounceKind.BOUNCE,
            source=BounceSource.TRANSPORT,
            code=outcome.code,
            enhanced_code=outcome.enhanced_code,
            diagnostic=outcome.last_result,
            job=JobRef(job.id, job.broadcast_id, job.campaign_id),
        )

    def _message(self, queue: Queue, job: ClaimedJob) -> Message:
        """The job's Message, rendered for its recipient; campaign content is read once per worker."""
        cached = self._campaigns.get(job.campaign_id)
        try:
            return self._compose(job, cached or self._content(queue, job.campaign_id))
        except TemplateError:
            # A template error pauses the campaign: first make sure it is not this worker's old copy
            # of a template fixed since (the campaign was paused, fixed and resumed).
            if cached is None or (fresh := self._content(queue, job.campaign_id)) == cached:
                raise
            return self._compose(job, fresh)

    def _content(self, queue: Queue, campaign_id: int) -> CampaignContent:
        content = self._campaigns[campaign_id] = CampaignContent(**queue.campaign_content(campaign_id))
        return content

    def _compose(self, job: ClaimedJob, content: CampaignContent) -> Message:
        composer = self.runner.composer
        return composer.message(
            composer.prepare(content),
            Recipient(job.email, job.name, job.attributes, job.subscriber_id),
            job_id=job.id,
            broadcast_id=job.broadcast_id,
            attempt=job.attempts + 1,
        )
