"""Senders: the threads that render and send, `concurrency` of them per node, holding no connection.

Each takes a claimed job whose begin mark has committed, renders it, sends it through the
``send_message`` hook (which may block: a relay's answer), classifies the result and hands it to
the completer. Each thread keeps its own ``worker_state``, so a transport reuses its connection to
the relay from one send to the next; it starts with the ``worker_started`` hook (a transport may
open that connection then), and the node claims nothing until every thread has (see ``wait_ready``).
"""

from __future__ import annotations

import queue as queues
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import structlog

from senddock.config import Config
from senddock.core import results
from senddock.core.content import ContentCache
from senddock.core.inbox import Done, Inbox
from senddock.core.inflight import Halts
from senddock.core.nodes import Lifeline
from senddock.store.jobs import ClaimedJob, ResultRow
from senddock.mail.compose import BadRecipient, Composer
from senddock.observe.node_metrics import NodeMetrics
from senddock.mail.templates import TemplateError
from senddock.outcome import CampaignContent, Message, Recipient
from senddock.plugins import call_each

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Dispatch:
    job: ClaimedJob
    claimed_monotonic: float  # this node's monotonic clock when the claim's reply arrived


class Senders:
    def __init__(self, config: Config, composer: Composer, contents: ContentCache, lifeline: Lifeline,
                 stopping: threading.Event, completer: Inbox, size: int, metrics: NodeMetrics | None = None,
                 halts: Halts | None = None) -> None:
        self.config = config
        self.pm = config.plugin_manager
        self._composer = composer
        self._contents = contents
        self._lifeline = lifeline
        self._stopping = stopping
        self._completer = completer
        self._halts = halts or Halts()
        # Per campaign, the commits still awaited of its results that are not deliveries (see
        # _settled): any sender's next job of that campaign waits for them.
        self._unsettled: dict[int, set[threading.Event]] = {}
        self._send_duration = (metrics or NodeMetrics()).send_duration.labels(transport=config.transport)
        self._jobs: queues.SimpleQueue[Dispatch | None] = queues.SimpleQueue()
        self._closed = False  # stop() was called: a job handed over now goes back unstarted
        self._lock = threading.Lock()
        self._started = threading.Condition()
        self._threads = [threading.Thread(target=self._run, name=f"senddock-sender-{i}", daemon=True)
                         for i in range(size)]
        self._starting = {t.name for t in self._threads}  # threads whose worker_started has not returned

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def wait_ready(self, timeout: float) -> bool:
        """Whether every thread's ``worker_started`` returned within ``timeout`` seconds (False at
        once if the node is stopping meanwhile: nothing will be claimed)."""
        deadline = time.monotonic() + timeout
        with self._started:
            while self._starting and not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._started.wait(min(left, 0.1))  # the stop is an event of its own: look at it often
            return not self._starting

    def submit(self, dispatch: Dispatch) -> None:
        with self._lock:
            if not self._closed:
                self._jobs.put(dispatch)
                return
        # The senders have stopped (the completer may begin the deck's jobs until it is told to
        # stop): never started, the job goes back with its slot.
        self._completer.put(Done(dispatch.job))

    def waiting(self) -> int:
        """Jobs marked begun and waiting for a sender (while there are, no sender is idle)."""
        return self._jobs.qsize()

    def submit_claimed(self, jobs: list[tuple[ClaimedJob, float]]) -> None:
        """Jobs marked begun with the monotonic time their claim's reply arrived."""
        for job, claimed_at in jobs:
            self.submit(Dispatch(job, claimed_at))

    def still_starting(self) -> list[str]:
        """Threads whose worker_started hook has not returned (a transport still opening its connection)."""
        with self._started:
            return sorted(self._starting)

    def stop(self, deadline: float) -> tuple[list[str], list[str]]:
        """Let the sends in flight finish (jobs not started go back); returns the threads still
        busy at the deadline: those sending (or in worker_stopped), and those still in
        worker_started, which never began a send. One snapshot, so no thread is in both."""
        with self._lock:
            # Every job handed over before this is taken before any thread's None (one queue, in order).
            self._closed = True
            for _ in self._threads:
                self._jobs.put(None)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._put_back_waiting()
        with self._started:  # a thread leaves worker_started under this lock: the two lists agree
            starting = set(self._starting)
            stuck = [t.name for t in self._threads if t.is_alive()]
        return [name for name in stuck if name not in starting], sorted(starting & set(stuck))

    def _put_back_waiting(self) -> None:
        """After the deadline: jobs still waiting for a sender (every thread was busy) go back
        unsent, not left marked begun for recovery to call in doubt; the threads still busy get
        their None again."""
        waiting = []
        while True:
            try:
                item = self._jobs.get_nowait()
            except queues.Empty:
                break
            if item is not None:
                waiting.append(item)
        for dispatch in waiting:
            self._completer.put(Done(dispatch.job))
        for thread in self._threads:
            if thread.is_alive():
                self._jobs.put(None)

    def _run(self) -> None:
        state: dict[str, Any] = {}
        try:
            self._prepare(state)
            while (dispatch := self._jobs.get()) is not None:
                if self._jobs.empty():
                    self._completer.runway_empty()
                try:
                    done = self._send(dispatch, state)
                except Exception:
                    # Nothing here may kill a sender; the job goes back as it was (its send, if it
                    # began, raised inside results.send and is a result, not this).
                    log.exception("sender_error", job_id=dispatch.job.id)
                    done = Done(dispatch.job)
                if done.committed is not None:
                    with self._lock:  # before the completer has it: no sender may miss it
                        self._unsettled.setdefault(dispatch.job.campaign_id, set()).add(done.committed)
                self._completer.put(done)
        finally:
            call_each(self.pm.hook.worker_stopped, worker_state=state, config=self.config)

    def _settled(self, campaign_id: int) -> None:
        """Anything but a delivery may trip a breaker or pause its campaign, and the jobs waiting
        for a sender are marked begun already (see inflight.RUNWAY): a job of a campaign with such
        a result not yet committed waits until the completer has acted on it (or the node stops:
        nothing more is sent then), so the Halts check after this sees the pause."""
        if campaign_id not in self._unsettled:  # the common case, read without the lock every send takes
            return
        while True:
            with self._lock:
                events = self._unsettled.get(campaign_id)
                if events:
                    events.difference_update([e for e in events if e.is_set()])
                    if not events:
                        del self._unsettled[campaign_id]
                pending = list(events or ())
            if not pending:
                return
            for event in pending:
                while not event.wait(0.1):
                    if self._stopping.is_set():
                        return

    def _prepare(self, state: dict[str, Any]) -> None:
        """The worker_started hook (a transport opens its connection ahead), then ready."""
        try:
            # Each plugin's, even after one raised: one plugin's bug must not skip another's warm-up.
            call_each(self.pm.hook.worker_started, worker_state=state, config=self.config)
        finally:
            with self._started:
                self._starting.discard(threading.current_thread().name)
                self._started.notify_all()

    def _send(self, dispatch: Dispatch, state: dict[str, Any]) -> Done:
        job = dispatch.job
        self._settled(job.campaign_id)
        if (self._stopping.is_set() or not self._lifeline.may_send()
                or self._halts.stops(job.campaign_id, dispatch.claimed_monotonic)):
            # Shutting down, self-fenced (the heartbeat is too old), or its campaign paused by this
            # node since the job was marked (it waited for a sender): not started, back it goes.
            return Done(job)
        started_at = datetime.now(timezone.utc)
        try:
            message = self._message(job)
        except TemplateError as exc:
            # This recipient's data does not fit the template: the job goes back, the campaign pauses.
            result, verdict = results.template_failure(exc, job.email, job.campaign_id)
        except BadRecipient as exc:
            # A line break in the name or address: this job fails, nothing reaches the relay.
            result, verdict = results.bad_recipient_failure(exc)
        else:
            with self._send_duration.time():
                result = results.send(self.pm, self.config, message, state)
            verdict = results.classify(self.pm, self.config, result, message)
        # The job's age on the database's clock (read at the claim) plus this node's monotonic time
        # since: retry.max_age never mixes two clocks.
        age = job.age + (time.monotonic() - dispatch.claimed_monotonic)
        outcome = results.job_result(
            self.pm, self.config, result, verdict, attempt=job.attempts + 1, age=age, attempts_before=job.attempts,
            deferrals_before=job.deferrals,
        )
        attempt = job.attempts + (1 if outcome.counts else 0)
        pause_reason = verdict.reason if outcome.outcome == "pause" else None
        committed = None if outcome.outcome == "sent" else threading.Event()
        return Done(job, ResultRow(job, attempt, started_at, outcome, pause_reason), verdict, committed)

    def _message(self, job: ClaimedJob) -> Message:
        """The job's Message, rendered for its recipient."""
        content = self._contents.get(job.campaign_id)
        try:
            return self._compose(job, content)
        except TemplateError:
            # A template error pauses the campaign: first make sure it is not this node's old copy
            # of a template fixed since (the campaign was paused, fixed and resumed).
            fresh = self._contents.reload(job.campaign_id)
            if fresh == content:
                raise
            return self._compose(job, fresh)

    def _compose(self, job: ClaimedJob, content: CampaignContent) -> Message:
        composer = self._composer
        return composer.message(
            composer.prepare(content),
            Recipient(job.email, job.name, job.attributes, job.subscriber_id),
            job_id=job.id,
            broadcast_id=job.broadcast_id,
            attempt=job.attempts + 1,
        )
