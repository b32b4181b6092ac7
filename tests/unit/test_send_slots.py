"""The node's send slots, its deck (jobs claimed ahead), how its completer groups results and what it tells its
parts after a commit, without a database."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

import psycopg
import pytest

from senddock.core import completer as completers
from senddock.core.aftercare import Committed
from senddock.core.completer import Completer, Wiring
from senddock.core.inbox import Done, Inbox
from senddock.core.inflight import Deck, HeldClaims, Slots
from senddock.core.journal import Journal
from senddock.store.jobs import ClaimedJob, JobResult, Recorded, ResultRow
from senddock.core.waits import Waits


def job(job_id: int, send_rate: str | None = None) -> ClaimedJob:
    return ClaimedJob(id=job_id, broadcast_id=1, campaign_id=1, subscriber_id=job_id, email=f"u{job_id}@example.com",
                      name=None, attributes={}, attempts=0, deferrals=0, claim_token=uuid.uuid4(), age=0.0,
                      suppressed=False, domain="example.com", send_rate=send_rate, send_begun=False,
                      claim_epoch=None)


def test_the_deck_wants_a_claim_only_once_down_to_half():
    deck = Deck(6, Slots(6))
    assert deck.wants_more()
    deck.put((job(i), 0.0) for i in range(6))
    assert not deck.wants_more() and deck.room() == 0
    deck.take(2)
    assert not deck.wants_more()  # 4 left: a claim now would take 2, a claim per send or two
    deck.take(1)
    assert deck.wants_more() and deck.room() == 3


def test_no_deck_never_wants_a_claim():
    assert not Deck(0, Slots(5)).wants_more()


def test_the_deck_is_taken_in_claim_order_and_stops_at_a_job_that_is_not_ready():
    deck = Deck(10, Slots(10))
    deck.put((job(i, "10/s" if i == 3 else None), 0.0) for i in range(1, 6))
    taken = deck.take(10, ready=lambda j: j.send_rate is None)
    # Job 3 must pass its campaign's rate first (the claimer's gate): it is not skipped over, and
    # the jobs behind it wait for it.
    assert [j.id for j, _ in taken] == [1, 2]
    assert [j.id for j, _ in deck.take(10)] == [3, 4, 5]


def test_jobs_put_back_in_front_keep_their_order():
    deck = Deck(10, Slots(10))
    deck.put((job(i), 0.0) for i in (3, 4))
    deck.put(((job(1), 0.0), (job(2), 0.0)), front=True)
    assert [j.id for j, _ in deck.take(10)] == [1, 2, 3, 4]


def test_a_claimer_waiting_for_a_slot_wakes_when_the_deck_runs_low():
    slots = Slots(2)
    deck = Deck(4, slots)
    slots.take(2)  # every slot busy
    deck.put((job(i), 0.0) for i in range(4))
    woke = []

    def claimer() -> None:
        started = time.monotonic()
        slots.wait_free(5.0, or_else=deck.wants_more)
        woke.append(time.monotonic() - started)

    thread = threading.Thread(target=claimer)
    thread.start()
    time.sleep(0.05)
    assert not woke  # no free slot, the deck full: nothing to do
    deck.take(2)  # the completer refilled two slots from the deck: now it is down to half
    thread.join(2.0)
    assert woke and woke[0] < 2.0


class WaitingSenders:
    """The senders as a completer's grouping sees them: how many jobs wait for one (a test changes it)."""

    def __init__(self, waiting: int) -> None:
        self.count = waiting

    def waiting(self) -> int:
        return self.count

    def submit_claimed(self, jobs: list[tuple[ClaimedJob, float]]) -> None:
        raise AssertionError("grouping begins no job")


def completer_with(slots: Slots, senders: WaitingSenders | None = None) -> Completer:
    """A completer whose grouping alone is used: nothing here reaches a database, the aftercare or the node."""
    wiring = Wiring(inbox=Inbox(), slots=slots, deck=Deck(0, slots), claims=HeldClaims(), journal=Journal(0),
                    waits=Waits(), lifeline=None, stopping=threading.Event(),  # type: ignore[arg-type]
                    senders=senders or WaitingSenders(0), aftercare=None, node=None)  # type: ignore[arg-type]
    return Completer(None, None, wiring)  # type: ignore[arg-type]


SENT = JobResult(status="sent", outcome="sent", counts=True, ok=True)
RETRY = JobResult(status="retry", outcome="retry", counts=True, delay=1.0)


def result(job_id: int, outcome: JobResult = SENT) -> Done:
    sent = job(job_id)
    return Done(sent, ResultRow(sent, 1, None, outcome))


def put_later(completer: Completer, ids: range, after: float) -> threading.Thread:
    def later() -> None:
        time.sleep(after)
        for i in ids:
            completer._inbox.put(result(i))

    thread = threading.Thread(target=later)
    thread.start()
    return thread


def test_with_many_sends_in_flight_a_group_waits_for_more_results(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(completers, "LINGER", 1.0)  # far longer than the thread below needs
    slots = Slots(200)
    slots.take(200)
    completer = completer_with(slots)
    completer._inbox.put(result(1))
    thread = put_later(completer, range(2, 6), 0.05)
    group, closed = completer._collect()
    thread.join()
    assert [d.job.id for d in group] == [1, 2, 3, 4, 5] and not closed


@pytest.mark.parametrize("first", [result(1, RETRY), Done(job(1))], ids=["a failure", "a job put back"])
def test_a_group_with_anything_but_deliveries_is_committed_at_once(monkeypatch: pytest.MonkeyPatch, first: Done):
    # A failure may trip a breaker, which must pause its campaign before more of it begins.
    monkeypatch.setattr(completers, "LINGER", 1.0)
    slots = Slots(200)
    slots.take(200)
    completer = completer_with(slots)
    completer._inbox.put(first)
    thread = put_later(completer, range(2, 6), 0.2)
    group, _ = completer._collect()
    thread.join()
    assert [d.job.id for d in group] == [1]


def test_a_stopping_completer_commits_at_once(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(completers, "LINGER", 1.0)
    slots = Slots(200)
    slots.take(200)
    completer = completer_with(slots)
    completer._inbox.put(result(1))
    completer.close()
    thread = put_later(completer, range(2, 6), 0.2)
    group, closed = completer._collect()
    thread.join()
    assert [d.job.id for d in group] == [1] and closed


@pytest.mark.parametrize("waiting", [0, 3], ids=["no sender has a job waiting", "jobs wait for the senders"])
def test_with_few_sends_in_flight_a_group_waits_only_while_every_sender_has_its_next_job(
        monkeypatch: pytest.MonkeyPatch, waiting: int):
    # Jobs marked begun and not taken by a sender yet: no sender is idle, nobody needs the slots the
    # commit frees, so more results may join the group. None: a sender may be waiting for them.
    monkeypatch.setattr(completers, "LINGER", 1.0)
    slots = Slots(10)
    slots.take(10)  # concurrency 5 with its runway: too few in flight for the in-flight wait
    completer = completer_with(slots, WaitingSenders(waiting))
    completer._inbox.put(result(1))
    thread = put_later(completer, range(2, 6), 0.2)
    group, _ = completer._collect()
    thread.join()
    assert [d.job.id for d in group] == ([1, 2, 3, 4, 5] if waiting else [1])


@pytest.mark.parametrize("ending", ["the runway empties", "a failure arrives", "the senders stop"])
def test_a_group_waiting_for_the_runway_is_committed_once_the_wait_should_end(
        monkeypatch: pytest.MonkeyPatch, ending: str):
    """Results join a group waiting on the runway without waking the completer one by one; it is
    woken, well before LINGER, when a sender takes the last waiting job (the next sender to finish
    would wait for the commit), when a result is not a delivery, or by the close."""
    monkeypatch.setattr(completers, "LINGER", 5.0)
    slots = Slots(10)
    slots.take(10)
    runway = WaitingSenders(3)
    completer = completer_with(slots, runway)
    completer._inbox.put(result(1))

    def senders() -> None:
        time.sleep(0.05)
        completer._inbox.put(result(2))
        time.sleep(0.2)
        if ending == "the runway empties":
            runway.count = 0
            completer._inbox.runway_empty()
        elif ending == "a failure arrives":
            completer._inbox.put(result(3, RETRY))
        else:
            completer.close()

    thread = threading.Thread(target=senders)
    thread.start()
    started = time.monotonic()
    group, _ = completer._collect()
    took = time.monotonic() - started
    thread.join()
    expected = [1, 2, 3] if ending == "a failure arrives" else [1, 2]
    assert [d.job.id for d in group] == expected and 0.2 <= took < 2.0


def test_a_large_node_does_not_wait_for_its_runway(monkeypatch: pytest.MonkeyPatch):
    """With LINGER_IN_FLIGHT slots or more only the in-flight wait applies: with instant sends,
    waiting for the runway to empty left every sender idle through every commit."""
    monkeypatch.setattr(completers, "LINGER", 1.0)
    slots = Slots(100)
    slots.take(50)  # fewer than LINGER_IN_FLIGHT begun and not collected
    completer = completer_with(slots, WaitingSenders(10))
    completer._inbox.put(result(1))
    thread = put_later(completer, range(2, 6), 0.2)
    group, _ = completer._collect()
    thread.join()
    assert [d.job.id for d in group] == [1]


# -- what the completer tells its parts after a group commit, and in which order ----------------
# The breakers' guarantee rests on the order: the aftercare reacts (a breaker pauses the campaign)
# while the group's slots are still taken and its senders still wait, so no claim and no sender
# goes on with the campaign before the pause; the rest of the aftercare comes after.


class RecordingAftercare:
    """What the completer told the aftercare, with what the rest of the node looked like then."""

    def __init__(self, slots: Slots, claims: HeldClaims, lose_connection_in_react: int = 0) -> None:
        self._slots, self._claims = slots, claims
        self._lose = lose_connection_in_react
        self.told: list[tuple[str, object, int, int]] = []  # (step, results, slots in use, claims held)

    def _note(self, step: str, results: object) -> None:
        self.told.append((step, results, self._slots.in_use, len(self._claims)))

    def halt(self, campaign_ids) -> None:
        self._note("halt", set(campaign_ids))

    def react(self, queue, results: list[Committed]) -> None:
        self._note("react", list(results))
        if self._lose:
            self._lose -= 1
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    def put(self, results: list[Committed]) -> None:
        self._note("put", list(results))


class Lifeline:
    epoch = None  # the server epoch it saw: none, nothing to settle

    def may_send(self) -> bool:
        return True


class Node:
    def __init__(self) -> None:
        self.told: list[set[int]] = []

    def results_in(self, queue, broadcasts: set[int]) -> bool:
        self.told.append(set(broadcasts))
        return True


@dataclass
class AfterCommit:
    """A completer whose last group (two failed sends, their slots taken, their claims held) has
    committed and waits for its aftermath."""

    completer: Completer
    aftercare: RecordingAftercare
    node: Node
    slots: Slots
    claims: HeldClaims
    group: list[Done]
    results: list[Committed]


def after_a_commit(lose_connection_in_react: int = 0) -> AfterCommit:
    slots, claims = Slots(4), HeldClaims()
    aftercare, node = RecordingAftercare(slots, claims, lose_connection_in_react), Node()
    group = []
    for job_id in (1, 2):
        failed = job(job_id)
        claims.hold(failed.claim_token)
        claims.expect(failed.claim_token, 1)
        group.append(Done(failed, ResultRow(failed, 1, None, RETRY), committed=threading.Event()))
    slots.take(len(group))
    results = [Committed(d.row, None, Recorded(recorded=True, late_sent=False)) for d in group]  # type: ignore[arg-type]
    wiring = Wiring(inbox=Inbox(), slots=slots, deck=Deck(0, slots), claims=claims, journal=Journal(0),
                    waits=Waits(), lifeline=Lifeline(), stopping=threading.Event(),  # type: ignore[arg-type]
                    senders=WaitingSenders(0), aftercare=aftercare, node=node)
    completer = Completer(None, None, wiring)  # type: ignore[arg-type]
    completer._unacted = (group, results, False, 0)
    return AfterCommit(completer, aftercare, node, slots, claims, group, results)


def test_the_aftercare_reacts_before_the_slots_and_claims_go_back_and_is_told_the_rest_after():
    scene = after_a_commit()
    scene.completer._finish_unacted(None)  # type: ignore[arg-type]  # the parts told here use no connection
    assert scene.aftercare.told == [("react", scene.results, 2, 2), ("put", scene.results, 0, 0)]
    assert all(done.committed.is_set() for done in scene.group)  # the senders waiting for it go on
    assert scene.completer.flushes == 1 and scene.completer._unacted is None


def test_an_aftermath_cut_short_by_a_lost_connection_is_finished_once_with_the_same_results():
    """The same Committed objects are passed again, so what react did already (a breaker checked,
    a limit slowed: their flags) is not done twice; the slots go back once."""
    scene = after_a_commit(lose_connection_in_react=1)
    with pytest.raises(psycopg.OperationalError):
        scene.completer._finish_unacted(None)  # type: ignore[arg-type]
    # Kept for the next connection; its senders are not parked until then.
    assert scene.completer._unacted is not None and scene.slots.in_use == 2 and len(scene.claims) == 2
    assert all(done.committed.is_set() for done in scene.group)
    scene.completer._finish_unacted(None)  # type: ignore[arg-type]
    told = [(step, results) for step, results, _, _ in scene.aftercare.told]
    assert told == [("react", scene.results), ("react", scene.results), ("put", scene.results)]
    assert all(a is b for a, b in zip(told[1][1], scene.results))
    assert scene.slots.in_use == 0 and len(scene.claims) == 0 and scene.completer.flushes == 1


def test_the_node_is_told_which_broadcasts_got_results_once_they_are_committed():
    scene = after_a_commit()
    scene.completer._finish_unacted(None)  # type: ignore[arg-type]
    scene.completer.close()
    assert scene.completer._loop(None) is True  # type: ignore[arg-type]  # closed and drained: nothing to commit
    assert scene.node.told == [{1}]
    assert scene.completer._touched == set()
