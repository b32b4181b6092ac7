"""One scenario's stage: its own database on the throw-away server, a broadcast, a relay, two nodes;
and, once the scenario is over, the count of what the relay received against what was promised."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from senddock.chaos.lab import Node, Probe, Relay, cli_json, node_settings, wait_until, write_config
from senddock.domain.campaign_control import NEVER_REQUEUED
from senddock.testing import create_database, migrate_database

NODE_NAMES = ("chaos-a", "chaos-b")


@dataclass
class Options:
    """How big and how hard: the defaults are the issue's full-size run."""

    recipients: int = 5000
    kills: int = 20
    workers: int = 2  # per node
    outage: float = 10.0  # seconds the relay is gone
    delay: float = 0.005  # the relay's latency per message
    resume_timeout: float = 120.0  # how long a campaign may make no progress before the scenario gives up
    breaker: int = 20  # transport.max_consecutive_failures
    seed: int = 20261203
    lag: float = 1.0  # failover: seconds the primary's walsenders are stopped before it dies
    promote_after: float = 2.0  # failover: seconds from the primary's death to the standby's promotion

    @property
    def breaker_window(self) -> int:
        """Failures a node may let through before its breaker trips, plus one send per worker in
        flight when the pause commits; every node counts its own."""
        return len(NODE_NAMES) * (self.breaker + self.workers)


@dataclass
class Row:
    """One line of the chaos table, with the limits it was judged against and why it failed."""

    scenario: str
    recipients: int
    delivered: int = 0
    dropped: int = 0
    duplicates: int = 0
    duplicates_listed: int = 0  # by `senddock campaign log ID --in-doubt --json`
    suppressed_wrongly: int = 0
    resume_s: float | None = None
    faults: int = 0
    allowed_duplicates: int = 0
    allowed_suppressions: int = 0
    end_state: str = ""
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "passed": self.passed, "recipients": self.recipients,
                "delivered": self.delivered, "dropped": self.dropped, "duplicates": self.duplicates,
                "duplicates_listed_in_doubt": self.duplicates_listed, "suppressed_wrongly": self.suppressed_wrongly,
                "time_to_resume_s": self.resume_s, "faults": self.faults,
                "allowed_duplicates": self.allowed_duplicates, "allowed_suppressions": self.allowed_suppressions,
                "end_state": self.end_state, "seconds": self.seconds, "problems": self.problems,
                "details": self.details}


class Stage:
    """A fresh database named after the scenario, filled and enqueued; the relay and both nodes."""

    def __init__(self, server: Any, scenario: str, options: Options, folder: Path,
                 settings: dict[str, Any] | None = None) -> None:
        self.options = options
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.dsn = create_database(server.get_uri(), f"chaos_{scenario.replace('-', '_')}")
        migrate_database(self.dsn)
        self.relay = Relay(delay=options.delay)
        self.probe = Probe(self.dsn)
        self.nodes: list[Node] = []
        self.relay.start()
        try:
            base = node_settings(self.relay.port, workers=options.workers, breaker=options.breaker, kills=options.kills)
            self.config_path = write_config(folder, {**base, **(settings or {})})
            self.emails = self._enqueue(options.recipients)
        except BaseException:
            self.close()
            raise
        for name in NODE_NAMES:
            (folder / f"{name}.log").unlink(missing_ok=True)  # a kept --logs folder of an earlier run
        self.nodes = [Node(name, self.config_path, self.dsn, folder / f"{name}.log") for name in NODE_NAMES]

    def _enqueue(self, recipients: int) -> set[str]:
        """A list of readers and a campaign to them, sent (enqueued) as campaign 1."""
        from senddock.api import Senddock
        from senddock.loading import load_config
        from senddock.store.db import Database

        config = load_config(self.config_path, environ={"SENDDOCK_DATABASE_URL": self.dsn})
        with Senddock(config, database=Database(config.database, dsn=self.dsn)) as app:
            app.create_list("chaos")
            with app.db.connection() as conn:
                conn.execute("INSERT INTO subscribers (email, name) SELECT 'reader' || i || '@example.com', "
                             "'Reader ' || i FROM generate_series(1, %(n)s) i", {"n": recipients})
                conn.execute("INSERT INTO list_members (list_id, subscriber_id) SELECT 1, id FROM subscribers")
            self.campaign_id = app.create_campaign(name="Chaos", lists=["chaos"], subject="Hello from the chaos suite",
                                                   from_addr="News <news@example.com>", text_body="Hello!")
            app.send_campaign(self.campaign_id)
        return {f"reader{i}@example.com" for i in range(1, recipients + 1)}

    # -- looking ---------------------------------------------------------------------------------

    def sent(self) -> int:
        return self.probe.scalar("SELECT count(*) FROM broadcast_jobs WHERE status = 'sent'")

    def campaign(self) -> tuple[str, str | None]:
        return tuple(self.probe.rows("SELECT status, paused_reason FROM campaigns WHERE id = %(id)s",
                                     {"id": self.campaign_id})[0])

    def over(self) -> bool:
        return self.campaign()[0] in ("finished", "cancelled")

    def has_sent(self, node: Node) -> bool:
        """The node's current incarnation has recorded a send: it is past its start and recovery."""
        return self.probe.scalar(
            "SELECT EXISTS (SELECT 1 FROM delivery_attempts a JOIN nodes n ON n.id = a.node_id "
            "WHERE n.name = %(name)s AND n.pid = %(pid)s AND a.outcome = 'sent')", {"name": node.name, "pid": node.pid})

    def wait_for_sent(self, fraction: float) -> bool:
        """Until this fraction of the broadcast is sent; False if it ended (or stalled) first."""
        target = int(self.options.recipients * fraction)
        wait_until(lambda: self.sent() >= target or self.over(), self.options.resume_timeout)
        return self.sent() >= target and not self.over()

    def in_flight(self, node: Node) -> int:
        return self.probe.scalar(
            "SELECT count(*) FROM broadcast_jobs j JOIN nodes n ON n.id = j.claimed_by "
            "WHERE j.status = 'sending' AND n.name = %(name)s AND n.pid = %(pid)s", {"name": node.name, "pid": node.pid})

    def await_end(self, *, stop_when_paused: bool = False) -> str:
        """Wait until the campaign is finished or cancelled ('over'), paused when asked ('paused'),
        or makes no progress for ``resume_timeout`` seconds ('stalled')."""
        last, quiet_since = None, time.monotonic()
        while True:
            status, _ = self.campaign()
            if status in ("finished", "cancelled"):
                return "over"
            if stop_when_paused and status == "paused":
                return "paused"
            progress = (status, self.sent(), len(self.relay.arrivals()))
            if progress != last:
                last, quiet_since = progress, time.monotonic()
            elif time.monotonic() - quiet_since > self.options.resume_timeout:
                return "stalled"
            time.sleep(0.1)

    def operator(self, *argv: str) -> dict[str, Any]:
        """A real `senddock campaign ... ID --json`, as an operator would type it."""
        code, payload = cli_json(self.dsn, self.config_path, "campaign", *argv, str(self.campaign_id))
        if code != 0:
            raise RuntimeError(f"senddock campaign {' '.join(argv)} {self.campaign_id} exited {code}: {payload}")
        return payload

    def requeueable_reasons(self) -> dict[str, int]:
        failed = self.operator("status")["failed_by_reason"]
        return {reason: n for reason, n in failed.items() if reason not in NEVER_REQUEUED}

    # -- ending and counting ---------------------------------------------------------------------

    def stop_nodes(self, row: Row) -> None:
        """SIGTERM to each node; a node that exits badly, or had exited by itself, is a problem."""
        for node in self.nodes:
            if node.proc is None:
                continue
            if not node.alive():
                row.problems.append(f"node {node.name} had exited by itself with status {node.proc.returncode}")
            elif node.stop() != 0:
                row.problems.append(f"node {node.name} exited with status {node.proc.returncode} on SIGTERM")
            else:
                continue
            row.details.setdefault("log_tails", {})[node.name] = node.log_tail()

    def close(self) -> None:
        for node in self.nodes:
            if node.alive():
                node.stop(timeout=5)
        self.relay.stop()
        self.probe.close()

    def count(self, row: Row) -> None:
        """Fill the row from the relay and the database, and judge it."""
        received = self.relay.counts()
        got = set(received)
        row.delivered = len(got & self.emails)
        row.dropped = len(self.emails - got)
        twice = {email for email, n in received.items() if n > 1}
        row.duplicates = len(twice)
        listed = set(self.operator("log", "--in-doubt")["in_doubt"])
        row.duplicates_listed = len(twice & listed)
        row.suppressed_wrongly = self.probe.scalar(
            "SELECT count(*) FROM suppressions WHERE lower(email) = ANY(%(emails)s)", {"emails": list(self.emails)})
        status = self.operator("status")
        row.end_state = status["status"] + (f" ({status['paused_reason']})" if status.get("paused_reason") else "")
        events: dict[str, int] = {}
        for node in self.nodes:
            for event, n in node.events().items():
                if event in INTERESTING_EVENTS:
                    events[event] = events.get(event, 0) + n
        row.details.update({
            "listed_in_doubt": len(listed), "copies_at_most": max(received.values(), default=0),
            "messages_at_relay": sum(received.values()), "failed_by_reason": status["failed_by_reason"],
            "jobs": {k: status[k] for k in ("pending", "sending", "retry", "sent", "failed")},
            "node_events": events,
        })
        strangers = got - self.emails
        if strangers:
            row.problems.append(f"{len(strangers)} messages to addresses that are not recipients")
        if status["status"] != "finished":
            row.problems.append(f"the campaign is {row.end_state}, not finished")
        if row.dropped:
            row.problems.append(f"{row.dropped} recipients never received the message")
        if row.duplicates_listed < row.duplicates:
            row.problems.append(f"{row.duplicates - row.duplicates_listed} of {row.duplicates} duplicates are not "
                                "listed by `campaign log --in-doubt`")
        if row.duplicates > row.allowed_duplicates:
            row.problems.append(f"{row.duplicates} duplicates, more than the {row.allowed_duplicates} allowed")
        if row.suppressed_wrongly > row.allowed_suppressions:
            row.problems.append(f"{row.suppressed_wrongly} addresses suppressed that the relay accepts "
                                f"(allowed: {row.allowed_suppressions})")


# Log events that tell what the engine did about a fault.
INTERESTING_EVENTS = ("job_recovered", "result_committed_again", "batch_put_back", "campaign_paused",
                      "campaign_resumed", "worker_db_lost", "lifeline_lost", "worker_error", "shutdown_timeout")


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None
