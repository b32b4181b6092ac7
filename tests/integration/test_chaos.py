"""The chaos suite, shortened: every scenario of bench/chaos.py on a small broadcast.

Each runs two real `senddock run` processes against a throw-away embedded Postgres of this
module's own (never the server in SENDDOCK_TEST_DSN: it is crashed and restarted) and the
in-process sink, and asserts the suite's pass criteria, not its timings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from senddock.chaos import SCENARIOS, Options, format_table, run_scenario
from senddock.chaos.lab import throwaway_postgres

pytestmark = pytest.mark.slow

# 500 readers through 2 nodes x 2 sends in flight, a relay with 5 ms of latency: a few seconds a
# scenario; 4 kills, a 3 s outage; a failover whose primary lost its last 0.3 s (the broadcast
# still has readers left when the standby is promoted, 1 s later). A paused campaign gets 30 s to
# resume by itself.
SHORT = Options(recipients=500, kills=4, outage=3.0, resume_timeout=30.0, lag=0.3, promote_after=1.0)


@pytest.fixture(scope="module")
def chaos_server():
    with throwaway_postgres() as server:
        yield server


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_chaos_scenario_keeps_the_promise(chaos_server, scenario: str, tmp_path: Path):
    row = run_scenario(chaos_server, scenario, SHORT, tmp_path, say=print)
    print(format_table([row]))
    assert row.faults >= (SHORT.kills if scenario == "kills" else 1), "the fault was not injected"
    assert row.passed, f"{scenario}: " + "; ".join(row.problems) + f"\ndetails: {row.details}"
    assert row.dropped == 0 and row.duplicates_listed == row.duplicates
    assert row.duplicates <= row.allowed_duplicates and row.suppressed_wrongly <= row.allowed_suppressions
