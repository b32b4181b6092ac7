"""The shared limiter (pacing_take) on a real Postgres, taken from by several "nodes" at once.

Every node is a thread with a connection of its own. Time is read from the statement's own clock
(Admission.at, clock_timestamp() after the locks), never from this noisy machine's sleeps, and the
bounds are GCRA's own: over any span w, at most burst + rate * w sends.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import psycopg
import pytest

from senddock.core.pacer import Admission, Pacer
from senddock.pacing.adaptive import Adaptive
from senddock.pacing.limits import Limit
from senddock.pacing.rates import parse_rate


def hammer(dsn: str, limits: list[Limit], *, nodes: int, seconds: float, most: int = 10,
           adaptive: Adaptive | None = None) -> list[Admission]:
    """``nodes`` threads take 1..``most`` at a time for ``seconds``, each waiting for its next_at when
    held back; returns every admission that admitted something."""
    admissions: list[Admission] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(nodes)

    def node(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                pacer = Pacer(conn, adaptive)
                start.wait()
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    taken = pacer.take(limits, rng.randint(1, most))
                    if taken.admitted:
                        with lock:
                            admissions.append(taken)
                    if taken.admitted < taken.wanted:
                        time.sleep(min(taken.wait, 0.25))
        except BaseException as exc:  # pragma: no cover - reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    assert failures == []
    assert not any(t.is_alive() for t in threads)
    return sorted(admissions, key=lambda a: a.at)


def busiest_window(admissions: list[Admission], width: float) -> int:
    """The most sends admitted within any span [t, t + width) of the database's clock."""
    span = timedelta(seconds=width)
    return max(sum(b.admitted for b in admissions if a.at <= b.at < a.at + span) for a in admissions)


def elapsed(admissions: list[Admission]) -> float:
    return (admissions[-1].at - admissions[0].at).total_seconds()


def limits_row(dsn: str, key: str) -> datetime | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT tat FROM pacing_limits WHERE key = %s", (key,)).fetchone()
    return None if row is None else row[0]


@pytest.fixture
def pacer(database_dsn: str):
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        yield Pacer(conn)


def test_a_limit_without_a_row_starts_with_its_burst_then_keeps_to_its_rate(pacer: Pacer, database_dsn: str):
    limit = Limit("campaign:7", parse_rate("1/min", burst=3))
    first = pacer.take([limit], 10)
    assert (first.wanted, first.admitted) == (10, 3)
    # Three sent at once used up the burst: the fourth may go one interval later.
    assert first.next_at - first.at == timedelta(seconds=60)
    assert limits_row(database_dsn, "campaign:7") == first.at + timedelta(minutes=3)

    again = pacer.take([limit], 1)
    assert (again.admitted, again.next_at) == (0, first.next_at)
    assert limits_row(database_dsn, "campaign:7") == first.at + timedelta(minutes=3)  # nothing admitted, nothing charged


def test_the_latency_margin_keeps_part_of_the_burst_back_and_not_the_rate(database_dsn: str):
    limit = Limit("global", parse_rate("60/s"))
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        pacer = Pacer(conn, latency_margin=0.25)
        first = pacer.take([limit], 100)
        assert first.admitted == 45  # 60 less a quarter second's worth
        # Its burst used up: the next send is one interval on, the rate itself untouched.
        assert abs((first.next_at - first.at).total_seconds() - 1 / 60) < 2e-6
        assert limits_row(database_dsn, "global") == first.at + timedelta(seconds=45 / 60)
        narrow = Pacer(conn, latency_margin=10.0).take([Limit("campaign:3", parse_rate("60/s"))], 100)
        assert narrow.admitted == 30  # at most half the tolerance is kept back


def test_a_send_is_admitted_by_every_limit_or_by_none(pacer: Pacer, database_dsn: str):
    wide, narrow = Limit("global", parse_rate("100/s")), Limit("domain:gmail.com", parse_rate("1/min", burst=2))
    taken = pacer.take([wide, narrow], 10)
    assert taken.admitted == 2  # the narrower limit's burst, though the global one allows 100
    assert limits_row(database_dsn, "global") == taken.at + timedelta(seconds=0.02)  # charged for 2 only
    assert taken.next_at == taken.at + timedelta(minutes=1)  # when the narrower one has room again

    held = pacer.take([narrow, wide], 5)
    assert held.admitted == 0
    assert limits_row(database_dsn, "global") == taken.at + timedelta(seconds=0.02)  # a refused take charges none


def test_all_wanted_sends_admitted_say_no_next_time(pacer: Pacer):
    taken = pacer.take([Limit("global", parse_rate("100/s"))], 5)
    assert (taken.admitted, taken.next_at, taken.wait) == (5, None, 0.0)
    assert pacer.take([], 3).admitted == 3  # nothing configured: nothing held back


def test_three_nodes_share_one_limit(database_dsn: str):
    rate, burst = 60, 5
    admissions = hammer(database_dsn, [Limit("global", parse_rate(f"{rate}/s", burst=burst))], nodes=3, seconds=5)
    total, span = sum(a.admitted for a in admissions), elapsed(admissions)
    assert span > 3  # the nodes really took for seconds, not one burst
    # At most the burst plus the rate over the span (the first take found the limit idle), and not
    # far below it: three nodes waiting for next_at keep the limit busy.
    assert total <= burst + rate * span
    assert total >= 0.95 * rate * span, (total, span)
    assert busiest_window(admissions, 1.0) <= rate + burst


def test_the_tighter_of_two_limits_paces_the_sends(database_dsn: str):
    limits = [Limit("global", parse_rate("100/s")), Limit("domain:gmail.com", parse_rate("10/s"))]
    admissions = hammer(database_dsn, limits, nodes=3, seconds=3)
    total, span = sum(a.admitted for a in admissions), elapsed(admissions)
    assert 0.9 * 10 * span <= total <= 10 + 10 * span, (total, span)
    assert busiest_window(admissions, 1.0) <= 10 + 10


def concurrently(dsn: str, nodes: int, work: Callable[[Pacer, int], None]) -> list[BaseException]:
    failures: list[BaseException] = []
    start = threading.Barrier(nodes)

    def node(i: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                start.wait()
                work(Pacer(conn), i)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a take never returned"
    return failures


def test_nodes_creating_the_same_limits_at_once_never_admit_past_them(database_dsn: str):
    a, b = Limit("campaign:1", parse_rate("1/min", burst=5)), Limit("domain:x.com", parse_rate("1/min", burst=5))
    sets = [[a], [b], [a, b], [b, a]]
    admitted = {a.key: 0, b.key: 0}
    lock = threading.Lock()

    def work(pacer: Pacer, i: int) -> None:
        limits = sets[i % len(sets)]
        for _ in range(3):
            taken = pacer.take(limits, 5)
            with lock:
                for limit in limits:
                    admitted[limit.key] += taken.admitted

    assert concurrently(database_dsn, 8, work) == []
    # Each limit allows its burst of 5 in the first minute, however many nodes raced to create it.
    assert admitted[a.key] <= 5 and admitted[b.key] <= 5
    assert admitted[a.key] + admitted[b.key] >= 5  # and the race did not leave both unused


def test_takes_naming_limits_in_any_order_never_deadlock(database_dsn: str):
    keys = [Limit(f"domain:{n}.example", parse_rate("100000/s")) for n in "abcd"]

    def work(pacer: Pacer, i: int) -> None:
        rng = random.Random(i)
        for _ in range(150):
            limits = rng.sample(keys, rng.randint(2, len(keys)))  # each node its own orders
            if i % 2:
                # Inside a transaction the rows stay locked until it ends: the others must wait
                # for them, in an order that can never close a cycle.
                with pacer.conn.transaction():
                    pacer.take(limits, 1)
                    time.sleep(0.001)
            else:
                pacer.take(limits, 1)

    assert concurrently(database_dsn, 6, work) == []
