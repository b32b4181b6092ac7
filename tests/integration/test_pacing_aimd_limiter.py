"""Adaptive pacing (AIMD) on a real Postgres: a throttled limit halves once, climbs back additively,
never above its rate, for every node at once.

Rates are measured from the statement's own clock (Admission.at), as in test_pacing_limiter, and
compared as ratios: the machine's speed changes how many takes run, not how many sends are admitted.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import psycopg
import pytest
from test_pacing_limiter import concurrently, hammer

from senddock.core.pacer import Admission, Pacer
from senddock.pacing.adaptive import Adaptive
from senddock.pacing.limits import Limit
from senddock.pacing.rates import parse_rate

# Recovery so slow that the factor barely moves while a test measures: 0.5 stays 0.5 for seconds.
STILL = Adaptive(recovery=100_000.0, hold=5.0, floor=0.02)


def factor_row(dsn: str, key: str) -> tuple[float, datetime | None]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT factor, factor_at FROM pacing_limits WHERE key = %s", (key,)).fetchone()


def halved_ago(dsn: str, key: str, seconds: float) -> None:
    """Pretend the limit was halved ``seconds`` ago (time travel instead of sleeping)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE pacing_limits SET factor_at = clock_timestamp() - make_interval(secs => %s) "
                     "WHERE key = %s", (seconds, key))


def sent_in(admissions: list[Admission], start: datetime, end: datetime) -> int:
    return sum(a.admitted for a in admissions if start <= a.at < end)


@pytest.fixture
def conn(database_dsn: str):
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        yield conn


def test_throttling_halves_a_limit_once_per_hold_and_a_take_spaces_its_sends_twice_as_far(conn, database_dsn: str):
    pacer = Pacer(conn, STILL)
    limit = Limit("domain:gmail.com", parse_rate("2/s", burst=1))
    assert pacer.take([limit], 5).admitted == 1
    assert pacer.throttled(["domain:gmail.com"]) == {"domain:gmail.com": 0.5}
    # The sends in flight all report it: one halving, not one per reply.
    assert pacer.throttled(["domain:gmail.com", "domain:gmail.com"]) == {}
    assert factor_row(database_dsn, "domain:gmail.com")[0] == 0.5

    held = pacer.take([limit], 5)
    assert held.admitted == 0
    time.sleep(held.wait + 0.01)
    taken = pacer.take([limit], 5)
    assert taken.admitted == 1
    # 2/s halved: the next send 1 s after this one, not 0.5 s.
    assert (taken.next_at - taken.at).total_seconds() == pytest.approx(1.0, abs=0.001)


def test_the_factor_in_force_climbs_back_additively_never_above_the_configured_rate(conn, database_dsn: str):
    adaptive = Adaptive(recovery=100.0, hold=5.0, floor=0.02)
    pacer = Pacer(conn, adaptive)
    limit = Limit("transport:smtp", parse_rate("10/s", burst=1))
    pacer.throttled([limit.key])  # a limit without a row yet: created halved
    assert factor_row(database_dsn, limit.key)[0] == 0.5

    halved_ago(database_dsn, limit.key, 30)  # 0.5 + 30/100: 0.8 in force
    taken = pacer.take([limit], 2)
    assert taken.admitted == 1
    assert (taken.next_at - taken.at).total_seconds() == pytest.approx(0.1 / 0.8, rel=0.01)

    # A throttling now halves what is in force (0.8), not what was stored (0.5).
    assert pacer.throttled([limit.key]) == {limit.key: pytest.approx(0.4, abs=0.001)}

    halved_ago(database_dsn, limit.key, 1000)  # long recovered: the configured rate, never more
    time.sleep(0.3)
    taken = pacer.take([limit], 2)
    assert taken.admitted == 1
    assert (taken.next_at - taken.at).total_seconds() == pytest.approx(0.1, abs=0.001)


def test_repeated_throttling_past_the_hold_halves_down_to_the_floor(conn, database_dsn: str):
    pacer = Pacer(conn, Adaptive(recovery=100_000.0, hold=5.0, floor=0.1))
    factors = []
    for _ in range(6):
        factors.extend(pacer.throttled(["global"]).values())
        halved_ago(database_dsn, "global", 6)  # past the hold: the next reply halves again
    assert factors == pytest.approx([0.5, 0.25, 0.125, 0.1, 0.1, 0.1], abs=0.001)


def test_with_adaptive_off_throttling_changes_nothing_and_factors_are_not_read(conn, database_dsn: str):
    assert Pacer(conn).throttled(["global"]) == {}
    Pacer(conn, STILL).throttled(["global"])  # halved while adaptive was on...
    limit = Limit("global", parse_rate("10/s", burst=1))
    taken = Pacer(conn).take([limit], 2)  # ...then turned off: the configured rate
    assert (taken.next_at - taken.at).total_seconds() == pytest.approx(0.1, abs=0.001)


def test_nodes_reporting_the_same_throttling_at_once_halve_it_once(database_dsn: str):
    halvings: list[dict[str, float]] = []
    lock = threading.Lock()

    def work(pacer: Pacer, i: int) -> None:
        pacer.adaptive = STILL
        for _ in range(5):
            halved = pacer.throttled(["domain:gmail.com", "global"] if i % 2 else ["global", "domain:gmail.com"])
            with lock:
                halvings.append(halved)

    assert concurrently(database_dsn, 8, work) == []
    assert [h for h in halvings if h] == [{"domain:gmail.com": 0.5, "global": 0.5}]
    assert factor_row(database_dsn, "global")[0] == factor_row(database_dsn, "domain:gmail.com")[0] == 0.5


def report_throttling_after(dsn: str, delay: float, adaptive: Adaptive, key: str, seen: list[datetime]) -> threading.Thread:
    """A node that, ``delay`` seconds from now, gets throttling replies for a second (twenty of them:
    the sends it had in flight) and reports each one."""

    def run() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            pacer = Pacer(conn, adaptive)
            time.sleep(delay)
            for _ in range(20):
                pacer.throttled([key])
                time.sleep(0.05)
            seen.append(factor_row(dsn, key)[1])

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_three_nodes_taking_while_a_fourth_reports_throttling_send_at_half_the_rate(database_dsn: str):
    # A burst lets a node woken late catch up (with none, this busy machine's wake-ups would set
    # the pace instead of the limit); after the halving its tolerance lets 1 + 3 / 2 go at once.
    rate = 20
    limit = Limit("domain:gmail.com", parse_rate(f"{rate}/s", burst=4))
    halved_at: list[datetime] = []
    reporter = report_throttling_after(database_dsn, 2.5, STILL, limit.key, halved_at)
    admissions = hammer(database_dsn, [limit], nodes=3, seconds=6, adaptive=STILL)
    reporter.join(30)
    at = halved_at[0]
    assert factor_row(database_dsn, limit.key)[0] == 0.5  # twenty replies, one halving
    start, end = admissions[0].at, admissions[-1].at
    assert (end - at).total_seconds() > 2.5  # the nodes kept taking well after it
    # Windows clear of the first burst and of the change (sends admitted just before it).
    skip = timedelta(seconds=0.5)
    before = sent_in(admissions, start + skip, at) / (at - start - skip).total_seconds()
    after = sent_in(admissions, at + skip, end) / (end - at - skip).total_seconds()
    assert before == pytest.approx(rate, rel=0.1), (before, after)
    assert after / before == pytest.approx(0.5, abs=0.08), (before, after)


def test_a_halved_limit_climbs_back_second_by_second_and_stops_at_its_rate(database_dsn: str):
    rate, burst = 20, 4
    adaptive = Adaptive(recovery=4.0, hold=5.0, floor=0.02)  # from 0.5 back to 1 in 2 s
    limit = Limit("domain:gmail.com", parse_rate(f"{rate}/s", burst=burst))
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        Pacer(conn, adaptive).throttled([limit.key])
    admissions = hammer(database_dsn, [limit], nodes=3, seconds=4.5, adaptive=adaptive)
    halved = factor_row(database_dsn, limit.key)[1]
    # Expected in each second from the halving: rate * the integral of min(1, 0.5 + t / 4).
    expected = [rate * (0.5 + 1 / 8), rate * (0.5 + 3 / 8), rate, rate]
    measured = [sent_in(admissions, halved + timedelta(seconds=i), halved + timedelta(seconds=i + 1))
                for i in range(4)]
    # The first second starts at the halving, the nodes a moment later (a few sends lost, made up
    # in part by the idle limit's burst, shrunk to 1 + 3 * 0.5 sends).
    assert expected[0] - 3 <= measured[0] <= expected[0] + burst, (measured, expected)
    for got, want in zip(measured[1:], expected[1:]):
        assert got == pytest.approx(want, abs=3), (measured, expected)
    assert measured[1] < measured[3]  # it did climb
    assert max(measured[2:]) <= rate + 1  # and stopped at the configured rate
