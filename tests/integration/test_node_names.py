"""One live process per node name, and a lifeline that is one real database session."""

from __future__ import annotations

import json
import signal
import socket
import threading
import uuid
from pathlib import Path

import psycopg
import pytest

from senddock.api import Senddock
from senddock.store.db import Database
from senddock.core.node_names import NAME_LOCK_CLASS, NodeNameTaken, NotASession
from senddock.core.nodes import Lifeline
from senddock.store.node_identity import LOCK_CLASS, NodeIdentity
from senddock.core.runner import Runner
from senddock.testing import fast_settings
from tests_support import make_broadcast, sent_count, start_node, wait_for, write_config


def _live_names(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute(
            "SELECT n.name FROM nodes n WHERE EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' "
            "AND l.granted AND l.classid = %s AND l.objid = n.lock_id AND l.objsubid = 2) ORDER BY n.name",
            (LOCK_CLASS,))]


def test_a_second_live_process_of_the_same_name_is_refused(make_config, database_dsn, smtp_sink, tmp_path: Path,
                                                           run_senddock):
    settings = fast_settings(smtp_sink.port)
    config_path = write_config(tmp_path, settings)
    first = start_node(config_path, database_dsn, "east")
    try:
        wait_for(lambda: _live_names(database_dsn) == ["east"], 30, "the first node to register")
        second = run_senddock("run", "-c", config_path, "--node", "east", "--json", timeout=60)
        assert second.exit_code == 2
        error = json.loads(second.stdout)["error"]
        assert f"node name 'east' is held by a live node (host {socket.gethostname()}, pid {first.pid}" in error
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first one is untouched
        assert _live_names(database_dsn) == ["east"]
    finally:
        first.terminate()
        first.communicate(timeout=60)
    assert first.returncode == 0


def test_unnamed_processes_on_one_host_get_their_own_names_and_keep_them(make_config, database_dsn, smtp_sink,
                                                                           tmp_path: Path):
    settings = fast_settings(smtp_sink.port, recovery={"heartbeat": "200ms", "lease": "60s"})
    app = Senddock(make_config(settings))
    make_broadcast(app, [f"user{i}@example.com" for i in range(3000)])
    config_path = write_config(tmp_path, settings)
    host = socket.gethostname()
    first = start_node(config_path, database_dsn, None)
    wait_for(lambda: _live_names(database_dsn) == [host], 30, "the first node")
    second = start_node(config_path, database_dsn, None)
    try:
        wait_for(lambda: _live_names(database_dsn) == sorted([host, f"{host}-2"]), 30, "the second node")
        wait_for(lambda: sent_count(database_dsn) > 100, 60, "both sending")
        # The first dies; restarted, it takes its own name back and recovers its jobs at once
        # (a 60s lease: only the name's lock proof explains a fast recovery).
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        first = start_node(config_path, database_dsn, None)
        wait_for(lambda: _live_names(database_dsn) == sorted([host, f"{host}-2"]), 30, "the restarted node")
        with app.db.connection() as conn:
            wait_for(lambda: conn.execute(
                "SELECT count(*) FROM broadcast_jobs j JOIN nodes n ON n.id = j.claimed_by "
                "WHERE j.status = 'sending' AND NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' "
                "AND l.granted AND l.classid = %s AND l.objid = n.lock_id AND l.objsubid = 2)",
                (LOCK_CLASS,)).fetchone()[0] == 0, 20, "the dead incarnation's jobs to be recovered")
    finally:
        for node in (first, second):
            node.terminate()
            node.communicate(timeout=60)
    app.close()


def test_a_node_whose_name_is_taken_while_it_reconnects_stops(make_config, database_dsn, smtp_sink):
    app = Senddock(make_config(fast_settings(smtp_sink.port, recovery={"heartbeat": "200ms", "lease": "2s"})))
    runner = Runner(app.config, node_name="west")
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            runner.run()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    with psycopg.connect(database_dsn, autocommit=True) as usurper:
        try:
            wait_for(lambda: _live_names(database_dsn) == ["west"], 30, "the node to register")
            with psycopg.connect(database_dsn, autocommit=True) as admin:
                # Its lifeline's session is cut, and another process takes the name meanwhile.
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = 'senddock-lifeline west'")
            wait_for(lambda: usurper.execute("SELECT pg_try_advisory_lock(%s, hashtext('west'))",
                                             (NAME_LOCK_CLASS,)).fetchone()[0], 10, "the name to be free")
            usurper.execute("INSERT INTO nodes (id, name, host, pid) VALUES (%s, 'west', 'elsewhere', 4242)",
                            (uuid.uuid4(),))
            lock_id = usurper.execute("SELECT lock_id FROM nodes WHERE host = 'elsewhere'").fetchone()[0]
            usurper.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, lock_id))
            thread.join(30)
        finally:
            runner.request_stop()
            thread.join(30)
    assert isinstance(outcome.get("error"), NodeNameTaken)
    assert "host elsewhere, pid 4242" in str(outcome["error"])
    assert not runner.lifeline.may_send()
    app.close()


class _TransactionPooler:
    """What a pooler in transaction mode does to a client: each statement may run on another
    server connection (here: two real ones, in turn). LISTEN and notifies stay on the first."""

    def __init__(self, dsn: str) -> None:
        self._conns = [psycopg.connect(dsn, autocommit=True) for _ in range(2)]
        self._turn = 0

    def execute(self, *args, **kwargs):
        self._turn += 1
        return self._conns[self._turn % 2].execute(*args, **kwargs)

    def notifies(self, **kwargs):
        return self._conns[0].notifies(**kwargs)

    def transaction(self):
        return self._conns[self._turn % 2].transaction()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for conn in self._conns:
            conn.close()


def test_a_lifeline_behind_a_transaction_pooler_is_refused(make_config, database_dsn):
    config = make_config(fast_settings())
    db = Database(config.database, dsn=database_dsn)
    lifeline = Lifeline(config, db, NodeIdentity.new("pooled"), lambda: None)
    lifeline._connect = lambda: _TransactionPooler(database_dsn)
    lifeline.start()
    try:
        assert lifeline.registered.wait(30)
        assert isinstance(lifeline.error, NotASession)
        assert "database.direct_dsn" in str(lifeline.error)
        assert not lifeline.may_send()
    finally:
        lifeline.stop()
        lifeline.join(10)
        db.close()


@pytest.mark.parametrize("how", ["--node", "node.name"])
def test_an_explicit_name_is_kept_as_given(make_config, database_dsn, smtp_sink, tmp_path: Path, run_senddock, how):
    settings = fast_settings(smtp_sink.port)
    if how == "node.name":
        settings["node"] = {"name": "north"}
    config_path = write_config(tmp_path, settings)
    argv = ["run", "-c", config_path, "--exit-when-idle", "--json"] + (["--node", "north"] if how == "--node" else [])
    result = run_senddock(*argv)
    assert result.exit_code == 0, result.stderr
    with psycopg.connect(database_dsn) as conn:
        assert conn.execute("SELECT name FROM nodes").fetchall() == [("north",)]


def test_a_dead_hosts_lingering_session_does_not_keep_its_name(make_config, database_dsn, smtp_sink):
    """A host that died without closing its connections leaves its lifeline's session on the server
    until TCP keepalive notices (hours). Once its heartbeat is older than the lease, a restart under
    the same name ends that session and takes the name."""
    app = Senddock(make_config(fast_settings(smtp_sink.port, recovery={"heartbeat": "200ms", "lease": "1s"})))
    with psycopg.connect(database_dsn, autocommit=True, application_name="senddock-lifeline ghost") as zombie:
        node_id = uuid.uuid4()
        zombie.execute("INSERT INTO nodes (id, name, host, pid, heartbeat_at) "
                       "VALUES (%s, 'ghost', 'gone', 7, now() - interval '1 minute')", (node_id,))
        lock_id = zombie.execute("SELECT lock_id FROM nodes WHERE id = %s", (node_id,)).fetchone()[0]
        zombie.execute("SELECT pg_advisory_lock(%s, %s), pg_advisory_lock(%s, hashtext('ghost'))",
                       (LOCK_CLASS, lock_id, NAME_LOCK_CLASS))
        Runner(app.config, node_name="ghost", exit_when_idle=True).run()
        with pytest.raises(psycopg.OperationalError):
            zombie.execute("SELECT 1")  # its session was ended
    with psycopg.connect(database_dsn) as conn:
        assert conn.execute("SELECT host FROM nodes WHERE name = 'ghost' ORDER BY started_at").fetchall() == [
            ("gone",), (socket.gethostname(),)]
    app.close()
