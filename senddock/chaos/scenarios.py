"""The faults, one function per scenario: each injects its fault into a running broadcast, plays
the operator where a person must act, and says when the fault ended (for the time to resume)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from senddock.chaos.lab import GENERIC_550, wait_until
from senddock.core.inflight import RUNWAY
from senddock.chaos.stage import Options, Row, Stage, median
from senddock.testing import crash_postgres, restart_postgres

Say = Callable[[str], None]


def kills(stage: Stage, row: Row, options: Options, server: Any, say: Say) -> None:
    """``kill -9`` the nodes in turn, each restarted at once under its name; every kill lands on a
    node whose current incarnation is sending, spread over the broadcast."""
    rng = random.Random(options.seed)
    restarts: list[tuple[str, int, float]] = []
    in_flight: list[int] = []
    for i in range(options.kills):
        node = stage.nodes[i % len(stage.nodes)]
        threshold = options.recipients * (i + 1) / (options.kills + 2)
        ready = wait_until(lambda: stage.over() or not node.alive()
                           or (stage.sent() >= threshold and stage.has_sent(node)), options.resume_timeout)
        if stage.over() or not node.alive():
            break  # a node that exited by itself is reported when the nodes are stopped
        if not ready:
            row.problems.append(f"{node.name} sent nothing within {options.resume_timeout:.0f}s of its restart")
            break
        time.sleep(rng.uniform(0, 0.05))  # somewhere in a send, not always at its start
        node.kill()
        row.faults += 1
        in_flight.append(stage.in_flight(node))
        node.start()
        restarts.append((node.name, node.pid, node.started_at))
        say(f"  kill {row.faults}/{options.kills}: {node.name} at {stage.sent()} sent, "
            f"{in_flight[-1]} of its jobs in flight; restarted")
    if row.faults < options.kills:
        row.problems.append(f"only {row.faults} of {options.kills} kills landed before the broadcast ended "
                            "(raise --recipients)")
    row.allowed_duplicates = row.faults * RUNWAY * options.workers  # at most its slots in doubt per kill
    outcome = stage.await_end()
    row.details.update({"kills": row.faults, "jobs_in_flight_at_kills": sum(in_flight), "end": outcome})
    # Time to resume: from a restart (Popen) to the relay's first message sent by that incarnation.
    waits = []
    for name, pid, started in restarts:
        node_id = stage.probe.rows("SELECT id FROM nodes WHERE name = %(n)s AND pid = %(p)s "
                                   "ORDER BY started_at DESC LIMIT 1", {"n": name, "p": pid})
        if not node_id:
            continue
        sent_by_it = {r[0] for r in stage.probe.rows(
            "SELECT j.email FROM delivery_attempts a JOIN broadcast_jobs j ON j.id = a.job_id "
            "WHERE a.node_id = %(id)s AND a.outcome = 'sent'", {"id": node_id[0][0]})}
        first = stage.relay.first_arrival_after(started, sent_by_it)
        if first is not None:
            waits.append(first - started)
    row.resume_s = median(waits)
    row.details["resume_s_each"] = [round(w, 2) for w in waits]
    row.details["resume_definition"] = "median, from a killed node's restart to the first message it sends"


def _mid_broadcast(stage: Stage, row: Row, fraction: float) -> bool:
    if not stage.wait_for_sent(fraction):
        row.problems.append(f"the broadcast ended (or stalled) before {fraction:.0%} was sent: no fault injected")
        return False
    return True


def _resume_after(stage: Stage, row: Row, fault_end: float, what: str) -> None:
    first = stage.relay.first_arrival_after(fault_end)
    row.resume_s = round(first - fault_end, 2) if first is not None else None
    row.details["resume_definition"] = f"from {what} to the relay's next message"


def _postgres_fault(stage: Stage, row: Row, say: Say, fault: Callable[[], None], what: str, back: str) -> None:
    """At 40% of the broadcast, break Postgres with ``fault`` and watch the nodes get going again."""
    if not _mid_broadcast(stage, row, 0.4):
        return
    at = stage.sent()
    fault()
    fault_end = time.monotonic()
    row.faults = 1
    say(f"  {what} at {at} sent; {back}")
    row.details["end"] = stage.await_end()
    _resume_after(stage, row, fault_end, back)


def pg_crash(stage: Stage, row: Row, options: Options, server: Any, say: Say) -> None:
    """SIGKILL of one Postgres backend: the postmaster resets every process and replays its WAL."""
    _postgres_fault(stage, row, say, lambda: crash_postgres(stage.dsn), "Postgres crash-restart",
                    "Postgres accepting connections again")


def pg_restart(stage: Stage, row: Row, options: Options, server: Any, say: Say) -> None:
    """``pg_ctl restart -m fast``: a clean shutdown (every connection closed) and a start."""
    _postgres_fault(stage, row, say, lambda: restart_postgres(server, mode="fast"), "Postgres fast shutdown + restart",
                    "Postgres up again")


def smtp_outage(stage: Stage, row: Row, options: Options, server: Any, say: Say) -> None:
    """The relay goes away (connections cut, new ones refused) and comes back on the same port.
    Nobody touches the campaign: it must get going again by itself."""
    if not _mid_broadcast(stage, row, 0.3):
        return
    at = stage.sent()
    stage.relay.stop()
    time.sleep(options.outage)
    stage.relay.start()
    fault_end = time.monotonic()
    row.faults = 1
    # In-flight sends cut by the outage may have reached the relay: one per worker at most.
    row.allowed_duplicates = len(stage.nodes) * options.workers
    status, reason = stage.campaign()
    say(f"  relay gone for {options.outage:g}s at {at} sent; back now (campaign {status}"
        + (f": {reason})" if reason else ")"))
    row.details["campaign_when_relay_came_back"] = status + (f" ({reason})" if reason else "")
    row.details["end"] = stage.await_end()
    if row.details["end"] == "stalled":
        status, reason = stage.campaign()
        row.problems.append(f"the campaign was still {status}" + (f" ({reason})" if reason else "")
                            + f" {time.monotonic() - fault_end:.0f}s after the relay came back: it did not resume "
                            "by itself")
    _resume_after(stage, row, fault_end, "the relay's return")


def relay_refusal(stage: Stage, row: Row, options: Options, server: Any, say: Say) -> None:
    """The relay refuses every recipient with a generic 550 (no enhanced code). It is the relay's
    fault, not the readers': nobody may be suppressed, and the campaign must stop for a person.
    The harness then plays that person: fixes the relay, requeues what failed, resumes."""
    if not _mid_broadcast(stage, row, 0.3):
        return
    at = stage.sent()
    stage.relay.refuse_everyone(GENERIC_550)
    row.faults = 1
    row.allowed_suppressions = options.breaker_window
    say(f"  relay refuses everyone with {GENERIC_550!r} from {at} sent")
    end = stage.await_end(stop_when_paused=True)
    status, reason = stage.campaign()
    row.details["campaign_when_refusing"] = status + (f" ({reason})" if reason else "")
    if end != "paused":
        row.problems.append(f"the campaign never paused while the relay refused everyone (it is {status})")
        stage.relay.accept_everyone()
        row.details["end"] = end
        return
    stage.relay.accept_everyone()
    reasons = stage.requeueable_reasons()
    for failure in reasons:
        stage.operator("requeue", "--reason", failure)
    fault_end = time.monotonic()  # the operator types `senddock campaign resume ID`
    stage.operator("resume")
    say(f"  campaign paused ({reason}); relay fixed, requeued {reasons or 'nothing'}, resumed")
    row.details["requeued"] = reasons
    row.details["end"] = stage.await_end()
    _resume_after(stage, row, fault_end, "the operator's resume")


def failover(stage: Stage, row: Row, options: Options, server: Any, say: Say) -> None:
    """An asynchronous standby promoted mid-broadcast, both nodes living on: at half the broadcast
    the primary's walsenders stop for ``options.lag`` seconds (what it commits meanwhile, claims
    and results, never reaches the standby), then the primary dies (every process killed), and
    ``options.promote_after`` seconds later the standby is promoted. The nodes find it by their
    multi-host DSN; nobody may be sent twice without being listed in doubt."""
    if not _mid_broadcast(stage, row, 0.5):
        return
    at = stage.sent()
    server.hold_replication()
    time.sleep(options.lag)
    lost_from = stage.sent()
    server.crash_primary()
    time.sleep(options.promote_after)
    server.promote()
    fault_end = time.monotonic()
    row.faults = 1
    # A send in flight at the failover may be recorded in doubt and sent again: at most its slots
    # per node (see inflight.RUNWAY). Every duplicate must be listed.
    row.allowed_duplicates = len(stage.nodes) * RUNWAY * options.workers
    say(f"  replication held at {at} sent, primary killed {options.lag:g}s later at {lost_from} sent; "
        f"standby promoted after {options.promote_after:g}s")
    row.details["sent_when_held"], row.details["sent_when_primary_died"] = at, lost_from
    row.details["end"] = stage.await_end()
    row.details["sent_after_promotion_counted"] = stage.sent()
    _resume_after(stage, row, fault_end, "the standby's promotion")


SCENARIOS: dict[str, Callable[..., None]] = {
    "kills": kills,
    "pg-crash": pg_crash,
    "pg-restart": pg_restart,
    "smtp-outage": smtp_outage,
    "relay-refusal": relay_refusal,
    "failover": failover,
}

# Settings a scenario's nodes need beyond the suite's (node_settings). Failover: nodes that live
# through it must not take each other for dead meanwhile (the primary's last second is lost and the
# promotion takes two more), so a lease longer than the outage.
SCENARIO_SETTINGS: dict[str, dict[str, Any]] = {
    "failover": {"recovery": {"heartbeat": "500ms", "lease": "15s", "max_rescues": 3}},
}
