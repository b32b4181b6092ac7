"""The chaos suite: one broadcast per scenario, a fault injected mid-way, and a count of what the
relay received against senddock's promise (nobody sent twice unless recorded as in doubt, nobody
silently dropped).

Scenarios (``SCENARIOS``): ``kills`` (two nodes, ``kill -9`` in turn, each restarted),
``pg-crash`` (SIGKILL of one Postgres backend: a crash-restart), ``pg-restart`` (fast shutdown and
start), ``smtp-outage`` (the relay gone for a while, back on the same port), ``relay-refusal``
(every recipient refused with a generic 550), ``failover`` (an asynchronous standby promoted after
the primary's last second of WAL was lost, both nodes living on). Everything runs on a throw-away
embedded Postgres that :func:`run_chaos` starts and always stops (failover: a primary and standby
of its own, :mod:`senddock.chaos.replica`), never on a configured server.

``bench/chaos.py`` is the command line; ``tests/integration/test_chaos.py`` runs each scenario
shortened.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import nullcontext
from collections.abc import Callable, Sequence
from pathlib import Path

from senddock.chaos.lab import throwaway_postgres
from senddock.chaos.replica import ReplicatedPair
from senddock.chaos.scenarios import SCENARIO_SETTINGS, SCENARIOS
from senddock.chaos.stage import Options, Row, Stage

# Scenarios that run on a server pair of their own (see chaos.replica), not the suite's shared one.
OWN_SERVERS = {"failover"}

__all__ = ["SCENARIOS", "Options", "Row", "format_table", "run_chaos", "run_scenario"]


def run_scenario(server, name: str, options: Options, folder: Path, say: Callable[[str], None] = lambda _: None) -> Row:
    """Run one scenario on ``server`` (a throw-away embedded Postgres) in its own database; the
    failover scenario makes a primary and standby of its own instead (it breaks them for good)."""
    with (ReplicatedPair() if name in OWN_SERVERS else nullcontext(server)) as server:
        return _run_scenario(server, name, options, folder, say)


def _run_scenario(server, name: str, options: Options, folder: Path, say: Callable[[str], None]) -> Row:
    inject = SCENARIOS[name]
    row = Row(scenario=name, recipients=options.recipients)
    started = time.monotonic()
    stage = Stage(server, name, options, folder / name, SCENARIO_SETTINGS.get(name))
    try:
        for node in stage.nodes:
            node.start()
        inject(stage, row, options, server, say)
        stage.stop_nodes(row)
        stage.count(row)
    finally:
        stage.close()
    row.seconds = round(time.monotonic() - started, 1)
    return row


def run_chaos(options: Options, names: Sequence[str], *, logs: Path | None = None,
              say: Callable[[str], None] = lambda _: None) -> list[Row]:
    """Every named scenario in turn on one throw-away Postgres (a fresh database each).

    The nodes' logs and configs go to ``logs`` when given (kept), else to a temporary folder.
    """
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="senddock-chaos-") as scratch, throwaway_postgres() as server:
        folder = logs or Path(scratch)
        for name in names:
            say(f"{name}: {options.recipients} recipients, 2 nodes x {options.workers} sends in flight")
            row = run_scenario(server, name, options, folder, say)
            say(f"{name}: {'PASS' if row.passed else 'FAIL'} in {row.seconds}s")
            rows.append(row)
    return rows


def format_table(rows: Sequence[Row]) -> str:
    """The chaos table, then one line per problem of each failed scenario."""
    from senddock.cli.output import table

    lines = [table(
        ["scenario", "recipients", "delivered", "dropped", "duplicates", "listed in doubt", "suppressed wrongly",
         "resume (s)", "result"],
        [[r.scenario, r.recipients, r.delivered, r.dropped, r.duplicates,
          f"{r.duplicates_listed}/{r.duplicates}", r.suppressed_wrongly,
          "-" if r.resume_s is None else f"{r.resume_s:.2f}", "PASS" if r.passed else "FAIL"] for r in rows],
    )]
    for r in rows:
        for problem in r.problems:
            lines.append(f"{r.scenario} FAIL: {problem}")
    return "\n".join(lines)
