"""A worker thread: claim a small batch, send each job, commit each result with the next job's start.

Per job the database sees one statement (result + attempt row + next start mark, one commit); per
batch one claim. No transaction is open while a message is being sent.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import psycopg
import structlog

from senddock.core import results
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
from senddock.templates import TemplateError

if TYPE_CHECKING:
    from senddock.core.runner import Runner

log = structlog.get_logger(__name__)


class Worker(threading.Thread):
    def __init__(self, runner: Runner, index: int) -> None:
        super().__init__(name=f"senddock-worker-{index}", daemon=True)
        self.runner = runner
        self.index = index
        self.busy = False
        self._state: dict[str, Any] = {}
        self._campaigns: dict[int, CampaignContent] = {}
        # True from the moment a send begins until its result is committed.
        self._sending = False
        # Ids of the current batch's jobs whose send began (their results may not be durable).
        self._begun: set[int] = set()
        # Batches whose connection broke between sends: token -> the jobs never started (None: the
        # claim's reply was lost, so none of it started). Their tokens stay held, so orphan
        # recovery leaves them alone, until they are put back on the next connection.
        self._unstarted: dict[uuid.UUID, list[ClaimedJob] | None] = {}

    def run(self) -> None:
        runner = self.runner
        backoff = 0.1
        try:
            while not runner.stopping.is_set():
                try:
                    with runner.db.connection() as conn:
                        backoff = 0.1
                        queue = runner.queue(conn)
                        self._put_back_unstarted(queue)
                        self._loop(queue)
                except psycopg.OperationalError as exc:
                    log.warning("worker_db_lost", worker=self.index, error=error_line(exc), retry_in=backoff)
                except Exception:
                    # Never a dead worker: a read-only server after a failover, bad bytes in a reply...
                    # The batch it held comes back through orphan recovery.
                    log.exception("worker_error", worker=self.index, retry_in=backoff)
                self.busy = False
                runner.stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        finally:
            self.busy = False
            self._give_up_unstarted()
            try:
                runner.pm.hook.worker_stopped(worker_state=self._state, config=runner.config)
            except Exception as exc:
                log.error("plugin_failed", hook="worker_stopped", error=repr(exc))

    def _put_back_unstarted(self, queue: Queue) -> None:
        for token, jobs in list(self._unstarted.items()):
            released = queue.release_claim(token) if jobs is None else queue.release(jobs)
            del self._unstarted[token]
            self.runner.held_tokens.discard(token)
            if released:
                log.info("batch_put_back", worker=self.index, jobs=released)

    def _give_up_unstarted(self) -> None:
        """On the way out: one more try on a fresh connection, else leave them to recovery."""
        if not self._unstarted:
            return
        try:
            with self.runner.db.connection() as conn:
                self._put_back_unstarted(self.runner.queue(conn))
        except psycopg.Error:
            for token in self._unstarted:
                self.runner.held_tokens.discard(token)
            self._unstarted.clear()

    # -- the loop --------------------------------------------------------------------------------

    def _loop(self, queue: Queue) -> None:
        runner = self.runner
        while not runner.stopping.is_set():
            if not runner.lifeline.may_send():
                runner.wait_for_work()  # self-fenced: no claims until the heartbeat is back
                continue
            self.busy = True
            # The batch's token is held before the claim commits, so orphan recovery never takes
            # a batch a worker is about to send.
            token = uuid.uuid4()
            runner.held_tokens.add(token)
            self._sending = False
            self._begun = set()
            keep_held = False
            batch = None
            try:
                batch = queue.claim(runner.config.claim_batch, token)
                for job in batch:
                    if job.suppressed:
                        log.info("job_suppressed", job_id=job.id, broadcast_id=job.broadcast_id)
                live = [j for j in batch if not j.suppressed]
                if live:
                    self._send_batch(queue, live)
                if len(batch) < runner.config.claim_batch:
                    # The queue is running dry: the last results may have finished a campaign.
                    runner.finish_campaigns(queue, {j.broadcast_id for j in batch})
            except psycopg.OperationalError:
                # The connection broke with no send in flight (in the claim, or between sends).
                # The jobs whose send never began go back as they were on the next connection;
                # those that began stay 'sending' for orphan recovery, in doubt: with results
                # committed asynchronously, a Postgres crash may have lost one that went out.
                keep_held = not self._sending
                if keep_held:
                    self._unstarted[token] = None if batch is None else [
                        j for j in batch if j.id not in self._begun and not j.suppressed]
                raise
            finally:
                if not keep_held:
                    runner.held_tokens.discard(token)
                self.busy = False
            if not batch:
                runner.wait_for_work()

    def _send_batch(self, queue: Queue, jobs: list[ClaimedJob]) -> None:
        """Send in id order, one at a time: the order is what makes the start of each send durable."""
        runner = self.runner
        pending = list(jobs)
        while pending:
            job = pending.pop(0)
            if runner.stopping.is_set() or not runner.lifeline.may_send():
                queue.release([job, *pending])
                return
            next_job = pending[0] if pending else None
            recorded, outcome = self._send_one(queue, job, next_job, pending)
            if recorded.batch_released:
                return
            if next_job is not None and (outcome.outcome == "pause" or recorded.next_campaign_status != "sending"):
                # Paused or cancelled meanwhile, or the claim was lost: what is not started goes back.
                queue.release(pending)
                return

    def _send_one(self, queue: Queue, job: ClaimedJob, next_job: ClaimedJob | None, pending: list[ClaimedJob]):
        runner = self.runner
        started_at = datetime.now(timezone.utc)
        try:
            message = self._message(queue, job)
        except TemplateError as exc:
            # This recipient's data does not fit the template: fail the job, the broadcast goes on.
            result, verdict = results.template_failure(exc)
        else:
            self._sending = True
            self._begun.add(job.id)
            result = results.send(runner.pm, runner.config, message, self._state)
            verdict = results.classify(runner.pm, runner.config, result, message)
        age = (started_at - (job.first_attempt_at or started_at)).total_seconds()
        outcome = results.job_result(
            runner.pm, runner.config, result, verdict, attempt=job.attempts + 1, age=age, attempts_before=job.attempts
        )
        recorded = self._record(queue, job, started_at, outcome, next_job, pending)
        self._sending = False
        self._after(queue, job, verdict, outcome, recorded)
        return recorded, outcome

    def _record(self, queue: Queue, job: ClaimedJob, started_at: datetime, outcome: JobResult,
                next_job: ClaimedJob | None, pending: list[ClaimedJob]) -> Recorded:
        """Commit the result; if the connection breaks, keep it and try again on a new one.

        After a reconnect the rest of the batch is put back on that new connection and the batch
        ends: the worker's own connection is gone.
        """
        attempt = job.attempts + (1 if outcome.counts else 0)
        try:
            return queue.record(job, attempt, started_at, outcome, next_job)
        except psycopg.OperationalError as exc:
            log.warning("result_commit_failed", job_id=job.id, error=error_line(exc))
        deadline = time.monotonic() + self.runner.config.recovery.lease
        delay = 0.2
        while True:
            try:
                with self.runner.db.connection() as conn:
                    fresh = self.runner.queue(conn)
                    if fresh.result_recorded(job, started_at):
                        # The first commit went through; only its reply was lost. Writing again
                        # would log a second attempt and treat our own result as a lost claim.
                        recorded = Recorded(recorded=True, late_sent=False, next_ours=False, next_campaign_status=None)
                    else:
                        recorded = fresh.record(job, attempt, started_at, outcome, None)
                    fresh.release(pending)
                    return replace(recorded, batch_released=True)
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("result_commit_failed", job_id=job.id, error=error_line(exc), retry_in=delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _after(self, queue: Queue, job: ClaimedJob, verdict, outcome: JobResult, recorded: Recorded) -> None:
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
        if not recorded.recorded:
            return
        if recorded.batch_released:
            queue = None  # the worker's connection is gone; the runner uses a pooled one
        if outcome.bounce:
            runner.run_bounce_hooks(self._bounce(job, outcome), queue)
        if outcome.outcome == "pause":
            runner.pause_campaign(job.campaign_id, verdict.reason, queue)
        else:
            runner.track_failures(job.campaign_id, verdict, queue)

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
        content = self._campaigns.get(job.campaign_id)
        if content is None:
            content = self._campaigns[job.campaign_id] = CampaignContent(**queue.campaign_content(job.campaign_id))
        composer = self.runner.composer
        return composer.message(
            composer.prepare(content),
            Recipient(job.email, job.name, job.attributes, job.subscriber_id),
            job_id=job.id,
            broadcast_id=job.broadcast_id,
            attempt=job.attempts + 1,
        )
