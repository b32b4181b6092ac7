"""Pacing while sending: limits shared by every node, held-back jobs that spend no attempt and are
never in doubt, and other domains that keep flowing past a slow one."""

from __future__ import annotations

import threading
import time
from collections import Counter

from senddock.api import Senddock
from senddock.testing import drain, fast_settings
from tests_support import make_broadcast, wait_for


def most_in_any_window(times: list[float], width: float) -> int:
    """The most sends any window of ``width`` seconds saw (windows start at a send)."""
    times = sorted(times)
    most, j = 0, 0
    for i, start in enumerate(times):
        while j < len(times) and times[j] < start + width:
            j += 1
        most = max(most, j - i)
    return most


def started_times(app) -> list[float]:
    """When each send began, in seconds (the sender stamps it once the limits admitted the job)."""
    with app.db.connection() as conn:
        return [r[0] for r in conn.execute("SELECT extract(epoch FROM started_at)::float8 FROM delivery_attempts")]


def attempts_of(app) -> list[tuple]:
    with app.db.connection() as conn:
        return conn.execute("SELECT outcome, in_doubt, count(*) FROM delivery_attempts "
                            "GROUP BY 1, 2 ORDER BY 1, 2").fetchall()


def test_a_slow_domain_is_held_back_without_attempts_while_the_others_flow(make_config, smtp_sink):
    """slow.example at 5/s (burst 1) among fast recipients: its sends are spaced by the rate, the
    others all go out long before it is done, each job has exactly one attempt (held-back jobs
    spend none) and nothing is in doubt."""
    pacing = {"domains": [{"match": ["slow.example"], "rate": "5/s", "burst": 1}]}
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=10, pacing=pacing)))
    slow = [f"s{i}@slow.example" for i in range(15)]
    fast = [f"f{i}@fast.example" for i in range(60)]
    emails = [e for pair in zip(slow, fast[:15]) for e in pair] + fast[15:]
    campaign_id = make_broadcast(app, emails)
    drain(app.config)

    assert Counter(r.recipients[0] for r in smtp_sink.received) == Counter(emails)
    at = {r.recipients[0]: r.at for r in smtp_sink.received}
    slow_times = sorted(at[e] for e in slow)
    assert slow_times[-1] - slow_times[0] >= 14 / 5 * 0.9, "15 sends at 5/s take 2.8 s"
    assert most_in_any_window(slow_times, 1.0) <= 5 * 1.25 + 1, "no second above rate + burst (+ latency)"
    assert max(at[e] for e in fast) < slow_times[4], "the fast domain did not wait for the slow one"
    assert attempts_of(app) == [("sent", False, len(emails))]
    with app.db.connection() as conn:
        assert conn.execute("SELECT max(attempts), max(deferrals) FROM broadcast_jobs").fetchone() == (1, 0)
    assert app.campaign_status(campaign_id).status == "finished"
    app.close()


def test_three_nodes_share_one_global_limit(make_config, smtp_sink):
    """Three nodes with `global: 20/s, burst 5` and 200 recipients: together they never send more
    than 20·w + 5 in any window of w seconds, all three send, and everyone gets one message.
    (200, ten seconds of sending: on a loaded machine, with the suite running in parallel, a node
    thread took seconds to start, and with 120 the other two had taken every job by then.)
    Measured at each send's start (delivery_attempts.started_at, stamped by the sender after the
    limit admitted it): admissions are bounded exactly, starts are those plus the hand-over to a
    sender thread, which a loaded 2-core machine can delay (0.25 s of it allowed)."""
    pacing = {"global": {"rate": "20/s", "burst": 5}}
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=20, pacing=pacing)))
    emails = [f"user{i}@example.com" for i in range(200)]
    campaign_id = make_broadcast(app, emails)
    nodes = [threading.Thread(target=drain, args=(app.config,), kwargs={"node_name": f"paced-{i}"})
             for i in range(3)]
    for node in nodes:
        node.start()
    for node in nodes:
        node.join(120)

    assert Counter(r.recipients[0] for r in smtp_sink.received) == Counter(emails)
    times = started_times(app)
    for width in (1.0, 2.0, 4.0):
        assert most_in_any_window(times, width) <= 20 * (width + 0.25) + 5, width
    assert max(times) - min(times) >= (200 - 5) / 20 * 0.95
    with app.db.connection() as conn:
        by_node = dict(conn.execute("SELECT node, count(*) FROM delivery_attempts GROUP BY node").fetchall())
    assert set(by_node) == {"paced-0", "paced-1", "paced-2"}, by_node
    assert attempts_of(app) == [("sent", False, len(emails))]
    assert app.campaign_status(campaign_id).status == "finished"
    app.close()


def test_a_campaigns_own_rate_paces_it(make_config, smtp_sink):
    """`campaign set-rate` on a sending campaign: 10/s, burst 2, for 30 recipients."""
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=10)))
    emails = [f"user{i}@example.com" for i in range(30)]
    campaign_id = make_broadcast(app, emails)
    app.set_campaign_rate(campaign_id, "10/s", burst=2)
    drain(app.config)

    assert Counter(r.recipients[0] for r in smtp_sink.received) == Counter(emails)
    times = started_times(app)
    assert most_in_any_window(times, 1.0) <= 10 * 1.25 + 2
    assert max(times) - min(times) >= (30 - 2) / 10 * 0.95
    assert attempts_of(app) == [("sent", False, len(emails))]
    app.close()


def test_a_domain_groups_concurrency_holds_for_all_nodes_together(make_config, smtp_sink):
    """`concurrency: 3` for slow.example, a relay taking 100 ms a message, two nodes of 20 sends
    in flight each: never more than 3 of the group's sends in flight at once (sampled in the
    database, where a send in flight is a job marked begun and not recorded), while the other
    domain's recipients use the rest."""
    smtp_sink.handler.delay = 0.1
    pacing = {"domains": [{"match": ["slow.example"], "concurrency": 3}]}
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=20, pacing=pacing)))
    slow = [f"s{i}@slow.example" for i in range(30)]
    other = [f"o{i}@other.example" for i in range(60)]
    campaign_id = make_broadcast(app, slow + other)
    peak, done = Counter(), threading.Event()

    def sample() -> None:
        with app.db.connection() as conn:
            while not done.is_set():
                for domain, n in conn.execute("SELECT domain, count(*) FROM broadcast_jobs "
                                              "WHERE status = 'sending' AND send_begun GROUP BY domain"):
                    peak[domain] = max(peak[domain], n)
                time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    nodes = [threading.Thread(target=drain, args=(app.config,), kwargs={"node_name": f"capped-{i}"})
             for i in range(2)]
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            node.join(120)
    finally:
        done.set()
        sampler.join()
    assert Counter(r.recipients[0] for r in smtp_sink.received) == Counter(slow + other)
    assert peak["slow.example"] == 3, peak
    assert peak["other.example"] > 3, peak
    assert attempts_of(app) == [("sent", False, 90)]
    assert app.campaign_status(campaign_id).status == "finished"
    app.close()


def test_throttling_replies_halve_a_groups_rate_which_recovers_slowly(make_config, smtp_sink):
    """Adaptive pacing against a relay that throttles for a moment: gmail.example at 20/s, the relay
    answers `421 4.7.28` to everything for 0.3 s; the group's factor is halved once (hold: 1 s, so
    the sends in flight that all report it do not halve it again), the next seconds arrive at about
    half the rate, and the rate climbs back (recovery: 20 s from nothing, so from one half in 10 s).
    Throttled sends spend no attempt and everyone gets one message."""
    from senddock.sink import FailRule
    from tests_support import running_node

    pacing = {"domains": [{"match": ["gmail.example"], "rate": "20/s", "burst": 5}],
              "adaptive": {"recovery": "20s", "hold": "1s"}}
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=10, pacing=pacing)))
    emails = [f"user{i}@gmail.example" for i in range(330)]
    campaign_id = make_broadcast(app, emails)

    def factor() -> float:
        with app.db.connection() as conn:
            row = conn.execute("SELECT factor FROM pacing_limits WHERE key = 'domain:gmail.example'").fetchone()
        return 1.0 if row is None else row[0]

    with running_node(app.config) as runner:
        wait_for(lambda: len(smtp_sink.received) >= 60, 30, "sixty sends at the configured rate")
        smtp_sink.handler.rules = [FailRule.parse("*=421 4.7.28 Our system has detected an unusual rate")]
        throttled_at = time.time()
        time.sleep(0.3)
        smtp_sink.handler.rules = []
        halved = factor()
        wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 90, "the rest")
        stats = runner.stats.snapshot()
    assert 0.45 <= halved <= 0.55, halved
    times = sorted(r.at for r in smtp_sink.received)
    before = [t for t in times if throttled_at - 2.0 <= t < throttled_at]
    after = [t for t in times if throttled_at + 0.5 <= t < throttled_at + 2.5]
    late = [t for t in times if throttled_at + 11 <= t < throttled_at + 13]
    assert len(before) >= 2 * 20 * 0.8, len(before)
    assert len(after) <= 2 * 20 * 0.65 + 1, (len(after), len(before))
    assert len(late) >= 2 * 20 * 0.8, len(late)
    assert Counter(r.recipients[0] for r in smtp_sink.received) == Counter(emails)
    assert stats.get("retry", 0) >= 1
    with app.db.connection() as conn:
        assert conn.execute("SELECT max(attempts) FROM broadcast_jobs").fetchone() == (1,)
    app.close()


def test_the_gate_keeps_the_latency_margin_back_from_an_idle_limits_burst(make_config, database_dsn):
    """The claimer's gate takes with the config's `pacing.latency_margin`: of 100 jobs claimed for
    an idle `global: 60/s` (burst 60), 45 may begin at once with the default 250 ms, 60 with 0s;
    the rest go back as retries, no attempt spent."""
    import uuid

    import psycopg

    from senddock.core.pacing_gate import PacingGate
    from senddock.store.jobs import JobQueue
    from tests_support import register

    admitted = {}
    for margin in ("250ms", "0s"):
        app = Senddock(make_config(fast_settings(pacing={"global": "60/s", "latency_margin": margin})))
        make_broadcast(app, [f"user{i}@example.com" for i in range(100)])
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM pacing_limits")  # each margin starts from an idle limit
            queue = JobQueue(conn, register(conn, f"gate-{margin}"))
            token = uuid.uuid4()
            jobs = queue.claim(100, token, begun=False)
            admitted[margin] = len(PacingGate(app.config.pacing, "smtp").admit(queue, token, jobs))
            held = conn.execute("SELECT count(*), max(attempts) FROM broadcast_jobs WHERE id = ANY(%s) "
                                "AND status = 'retry' AND claim_token IS NULL", ([j.id for j in jobs],)).fetchone()
        assert held == (100 - admitted[margin], 0)
        app.close()
    assert admitted == {"250ms": 45, "0s": 60}


def test_adaptive_pacing_learns_the_rate_a_provider_allows_and_stays_under_it(make_config):
    """A group configured at 100/s whose provider allows 5/s (`421 4.7.28` beyond, `senddock sink
    --limit`): halvings bring it down within a few holds, and then it climbs back at a pace
    proportional to the rate it was throttled at, not a tenth of 100/s a tenth of the recovery:
    once learned, under a tenth of the attempts are throttled (the additive climb had half)."""
    from senddock.sink import RateRule, Sink
    from tests_support import running_node

    pacing = {"domains": [{"match": ["provider.example"], "rate": "100/s", "burst": 5}],
              "adaptive": {"recovery": "10s", "hold": "1s"}}
    limit = RateRule.parse("5/s=421 4.7.28 Our system has detected an unusual rate of unsolicited mail")
    with Sink("127.0.0.1", 0, limit=limit) as relay:
        app = Senddock(make_config(fast_settings(relay.port, concurrency=10, pacing=pacing,
                                                 retry={"schedule": ["500ms"], "jitter": 0})))
        emails = [f"user{i}@provider.example" for i in range(110)]
        campaign_id = make_broadcast(app, emails)
        with running_node(app.config):
            wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 120, "the broadcast to end")
        accepted = sorted(m.at for m in relay.received)
        refused = sorted(relay.handler.limited)
        status = app.pacing_status()
    assert Counter(m.recipients[0] for m in relay.received) == Counter(emails)  # everyone once, nobody lost
    learned = refused[0] + 10  # a few holds to come down from 100/s, twice the recovery's climb
    late_accepted = [t for t in accepted if t >= learned]
    late_refused = [t for t in refused if t >= learned]
    assert len(late_accepted) >= 30, "the measurement needs sends after the learning"
    throttled = len(late_refused) / (len(late_refused) + len(late_accepted))
    print(f"throttled after learning: {len(late_refused)} of {len(late_refused) + len(late_accepted)}")
    assert throttled < 0.10, (len(late_refused), len(late_accepted))
    # The effective rate status shows is near what the provider allows, not the configured 100/s.
    [group] = [s for s in status if s.key == "domain:provider.example"]
    assert 1.0 <= group.effective_per_second <= 8.0, group.effective_per_second
    app.close()
