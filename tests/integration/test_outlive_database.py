"""Long-running intake outlives the database going away and coming back (issue 32 §4), as
`senddock run` does: `bounces fetch --watch` and `events ingest` reading a pipe keep the message
or notification in hand, wait for the database, apply it once it answers, and go on."""

from __future__ import annotations

import json
import os
import subprocess
import time

import yaml
from test_bounce_fetch import bounce_for, sent, watching  # noqa: F401 - fixtures
from test_bounce_fetch import dovecot as dovecot  # noqa: F401 - fixture
from test_events import bounce, sns
from test_events import sent as ses_sent  # noqa: F401 - fixture
from test_ses_like import aws_env, moto_server  # noqa: F401 - fixtures
from tests_support import Dovecot, database_away, senddock_executable, suppressed, wait_for


def waiting_a_second(config_path) -> None:
    """A command of this config waits a second for a connection, less than the outages below: it
    sees the database gone (psycopg_pool's own wait would absorb a short outage unseen)."""
    settings = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    settings.setdefault("database", {})["connect_timeout"] = "1s"
    config_path.write_text(yaml.safe_dump(settings), encoding="utf-8")


def test_events_ingest_on_a_pipe_waits_out_the_database_and_applies_every_notification(ses_sent, database_dsn):  # noqa: F811
    app, config, ids = ses_sent
    waiting_a_second(config)
    env = {**os.environ, "SENDDOCK_DATABASE_URL": database_dsn}
    process = subprocess.Popen([senddock_executable(), "events", "ingest", "-c", str(config), "--json", "-"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        process.stdin.write(json.dumps(sns(bounce(ids["user0@example.com"], "user0@example.com"))) + "\n")
        process.stdin.flush()
        wait_for(lambda: "user0@example.com" in suppressed(app), 30, "the first notification")
        with database_away(database_dsn):
            process.stdin.write(json.dumps(sns(bounce(ids["user1@example.com"], "user1@example.com",
                                                      feedback="fb-2"))) + "\n")
            process.stdin.flush()
            time.sleep(3)
            assert process.poll() is None, "ingest exited while the database was away"
        wait_for(lambda: "user1@example.com" in suppressed(app), 30, "the notification that waited")
        stdout, stderr = process.communicate(timeout=30)  # closes its input: the end of the stream
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    summary = json.loads(stdout)
    assert (summary["documents"], summary["recorded"], summary["problems"]) == (2, 2, [])
    assert "database_lost" in stderr and "database_back" in stderr


def test_bounces_fetch_watch_waits_out_the_database_and_applies_the_message_it_holds(sent, dovecot, database_dsn):  # noqa: F811
    app, mail = sent(f"imap://{Dovecot.USER}@127.0.0.1:{dovecot.imap_port}/INBOX", interval="200ms")
    waiting_a_second(app.config.path)
    with watching(app, database_dsn) as watch:
        dovecot.deliver(bounce_for(mail, "gone@example.net"))
        wait_for(lambda: suppressed(app) == {"gone@example.net": "bounced"}, 30, "the first bounce")
        with database_away(database_dsn):
            dovecot.deliver(bounce_for(mail, "moved@example.net"))
            time.sleep(3)
            assert watch.process.poll() is None, "fetch --watch exited while the database was away"
            assert dovecot.count() == 1  # not applied, so still in the mailbox
        wait_for(lambda: "moved@example.net" in suppressed(app), 30, "the bounce that waited")
        wait_for(lambda: dovecot.count() == 0, 10, "the mailbox to be emptied once it was applied")
    assert watch.process.returncode == 0, watch.stderr
    assert json.loads(watch.stdout)["applied"] == 2
    assert "database_lost" in watch.stderr and "database_back" in watch.stderr
    app.close()
