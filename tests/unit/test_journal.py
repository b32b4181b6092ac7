"""The journal a node keeps of what it began and recorded (senddock.core.journal)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timezone

from senddock.core.journal import Journal
from senddock.store.jobs import ClaimedJob, JobResult, ResultRow


def job(job_id: int) -> ClaimedJob:
    return ClaimedJob(id=job_id, broadcast_id=1, campaign_id=1, subscriber_id=job_id, email=f"u{job_id}@example.com",
                      name="Ada", attributes={"plan": "pro"}, attempts=0, deferrals=0, claim_token=uuid.uuid4(),
                      age=0.0, suppressed=False)


def result(claimed: ClaimedJob) -> ResultRow:
    return ResultRow(claimed, 1, datetime.now(timezone.utc), JobResult(status="sent", outcome="sent", counts=True, ok=True))


def test_jobs_are_in_flight_from_their_begin_until_recorded_or_put_back():
    journal = Journal(window=60)
    a, b, c = job(1), job(2), job(3)
    journal.began([a, b, c])
    journal.recorded([result(a)])
    journal.ended([b])
    in_flight, results = journal.snapshot(wait=0)
    assert [j.id for j in in_flight] == [3]
    assert [r.job.id for r in results] == [1]
    # What settling needs is kept, the subscriber's name and attributes are not.
    assert (results[0].job.claim_token, results[0].job.email) == (a.claim_token, a.email)
    assert (results[0].job.name, dict(results[0].job.attributes)) == ("", {})


def test_results_are_forgotten_after_the_window_and_at_once_with_none():
    journal = Journal(window=0.2)
    journal.recorded([result(job(1))])
    assert len(journal) == 1
    time.sleep(0.3)
    journal.recorded([result(job(2))])
    assert [r.job.id for r in journal.snapshot(wait=0)[1]] == [2]
    forgetful = Journal(window=0)
    forgetful.began([job(3)])
    forgetful.recorded([result(job(3))])
    assert forgetful.snapshot(wait=0) == ([], [])


def test_a_snapshot_waits_for_a_begin_whose_jobs_are_not_journaled_yet():
    journal = Journal(window=60)
    began = threading.Event()
    snapshots = []

    def settle():
        began.wait(5)
        snapshots.append(journal.snapshot(wait=5))

    settler = threading.Thread(target=settle)
    settler.start()
    with journal.beginning():
        began.set()  # the claim's reply has come; its jobs are journaled a moment later
        time.sleep(0.2)
        journal.began([job(7)])
    settler.join(5)
    assert [j.id for j in snapshots[0][0]] == [7]
