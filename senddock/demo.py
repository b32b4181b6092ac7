"""`senddock demo [--crash]`: a whole broadcast on a throw-away embedded Postgres and an in-process sink.

1,000 subscribers, a few whose mailbox does not exist (bounced and suppressed), a few that are
deferred once (retried, then sent). With --crash the sending node runs as a separate process that
is killed with SIGKILL mid-broadcast and restarted: the summary shows it resumed with nothing lost,
and counts duplicates at the SMTP server by Message-ID against the in-doubt attempts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from senddock.api import Senddock
from senddock.loading import load_config
from senddock.store.db import Database, embedded_server, stop_embedded
from senddock.core.runner import Runner
from senddock.sink import FailRule, Sink
from senddock.wording import plural

SUBSCRIBERS = 1000
BOUNCING = 5
DEFERRED = 10


def _settings(port: int, pgdata: Path) -> dict[str, Any]:
    return {
        "database": {"embedded": {"path": str(pgdata)}},
        "smtp": {"host": "127.0.0.1", "port": port, "timeout": "5s", "security": "none"},
        "retry": {"schedule": ["2s"], "max_retries": 3, "jitter": 0},
        "recovery": {"heartbeat": "500ms", "lease": "3s"},
        "poll_interval": "200ms",
        "logging": {"level": "error"},
    }


class _DeferOnce:
    """Answers 451 the first time it sees a 'later' address at RCPT, like a greylisting server."""

    def __init__(self, sink: Sink) -> None:
        self._seen: set[str] = set()
        self._original = sink.handler.handle_RCPT
        sink.handler.handle_RCPT = self

    async def __call__(self, server, session, envelope, address, options):
        if address.startswith("later") and address not in self._seen:
            self._seen.add(address)
            return "451 4.7.1 greylisted, try again shortly"
        return await self._original(server, session, envelope, address, options)


def run_demo(*, crash: bool, show: Callable[[str], None], progress: Any | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="senddock-demo-") as folder:
        pgdata = Path(folder) / "pgdata"
        server = embedded_server(pgdata)
        try:
            with Sink("127.0.0.1", 0, rules=[FailRule.parse("bounce*@*=550 5.1.1 no such user")]) as sink:
                _DeferOnce(sink)
                config_path = Path(folder) / "senddock.yaml"
                config_path.write_text(yaml.safe_dump(_settings(sink.port, pgdata)), encoding="utf-8")
                config = load_config(config_path, environ={})
                with Senddock(config, database=Database(config.database, dsn=server.get_uri())) as app:
                    campaign_id = _prepare(app, show)
                    started = time.monotonic()
                    if crash:
                        _crash_and_resume(app, campaign_id, config_path, server.get_uri(), show, progress)
                    else:
                        _drain_in_process(app, campaign_id, progress)
                    elapsed = time.monotonic() - started
                    return _summary(app, campaign_id, sink, elapsed, crash)
        finally:
            stop_embedded(server)


def _prepare(app: Senddock, show: Callable[[str], None]) -> int:
    app.migrate()
    app.create_list("demo")
    with app.db.connection() as conn:
        conn.execute(
            "INSERT INTO subscribers (email, name) "
            "SELECT CASE WHEN i <= %(b)s THEN 'bounce' || i WHEN i <= %(b)s + %(d)s THEN 'later' || i ELSE 'reader' || i END"
            " || '@example.com', 'Reader ' || i FROM generate_series(1, %(n)s) i",
            {"b": BOUNCING, "d": DEFERRED, "n": SUBSCRIBERS},
        )
        conn.execute("INSERT INTO list_members (list_id, subscriber_id) SELECT 1, id FROM subscribers")
    campaign_id = app.create_campaign(name="Demo", lists=["demo"], subject="Hello from senddock",
                                      from_addr="senddock demo <demo@example.com>", text_body="Hello!")
    sent = app.send_campaign(campaign_id)
    show(f"campaign {campaign_id}: enqueued {plural(sent.enqueued, 'recipient')} on an embedded Postgres "
         f"({BOUNCING} will bounce, {DEFERRED} will be deferred once)")
    return campaign_id


def _watch(app: Senddock, campaign_id: int, progress: Any | None, until: Callable[[Any], bool]) -> Any:
    while True:
        status = app.campaign_status(campaign_id)
        if progress is not None:
            progress(status.sent + status.failed, status.total)
        if until(status):
            return status
        time.sleep(0.1)


def _drain_in_process(app: Senddock, campaign_id: int, progress: Any | None) -> None:
    runner = Runner(app.config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        _watch(app, campaign_id, progress, lambda s: s.status != "sending")
    finally:
        runner.request_stop()
        thread.join(30)


def _crash_and_resume(app, campaign_id, config_path, dsn, show, progress) -> None:
    env = {**os.environ, "SENDDOCK_DATABASE_URL": dsn}
    command = [sys.executable, "-m", "senddock", "run", "-c", str(config_path), "--node", "demo-node"]
    node = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        status = _watch(app, campaign_id, progress, lambda s: s.sent >= s.total * 0.4 or s.status != "sending")
        node.send_signal(signal.SIGKILL)
        node.wait()
        status = app.campaign_status(campaign_id)
        # "jobs" whatever the count: README's walk-through shows this line and matches the word.
        show(f"killed the sending process with SIGKILL at {status.sent} sent, {status.sending} jobs in flight")
        node = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        show("restarted it; it recovers its dead incarnation's jobs at once")
        _watch(app, campaign_id, progress, lambda s: s.status != "sending")
    finally:
        node.terminate()
        node.wait(30)


def _summary(app: Senddock, campaign_id: int, sink: Sink, elapsed: float, crash: bool) -> dict[str, Any]:
    status = app.campaign_status(campaign_id)
    with app.db.connection() as conn:
        retried = conn.execute("SELECT count(DISTINCT job_id) FROM delivery_attempts WHERE outcome = 'retry'").fetchone()[0]
        suppressed = conn.execute("SELECT count(*) FROM suppressions").fetchone()[0]
        in_doubt = {r[0] for r in conn.execute(
            "SELECT DISTINCT j.email FROM delivery_attempts a JOIN broadcast_jobs j ON j.id = a.job_id WHERE a.in_doubt")}
    by_id = Counter(r.message_id for r in sink.received)
    duplicates = {r.recipients[0] for r in sink.received if by_id[r.message_id] > 1}
    return {
        "campaign_id": campaign_id,
        "status": status.status,
        "recipients": status.total,
        "sent": status.sent,
        "retried": retried,
        "bounced": status.bounced,
        "suppressed": suppressed,
        "failed_by_reason": status.failed_by_reason,
        "received_by_smtp_server": len(sink.received),
        "duplicates": len(duplicates),
        "duplicates_explained_by_in_doubt": len(duplicates & in_doubt),
        "in_doubt": len(in_doubt),
        "crashed": crash,
        "seconds": round(elapsed, 1),
    }
