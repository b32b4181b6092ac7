"""`senddock bounces fetch` against a real IMAP and POP3 server (dovecot): each message is applied,
then moved or deleted; nothing is removed that was not applied; --watch keeps reading."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from test_bounce_ingest import SECRET, dsn, vacation, verp_settings
from tests_support import Dovecot, make_broadcast, senddock_executable, suppressed, wait_for

from senddock.api import Senddock
from senddock.sink import Sink
from senddock.testing import drain

EMAILS = ["ada@example.net", "gone@example.net", "moved@example.net"]


@pytest.fixture
def dovecot():
    with Dovecot() as server:
        yield server


@pytest.fixture
def sent(make_config, monkeypatch, dovecot):
    """Three messages through a relay, and a config whose bounces.mailbox is ``url``'s."""
    monkeypatch.setenv("BOUNCE_SECRET", SECRET)
    monkeypatch.setenv("MAILBOX_PASSWORD", Dovecot.PASSWORD)

    def configured(url: str, max_message_size: str = "10MiB", **mailbox) -> tuple[Senddock, dict]:
        with Sink("127.0.0.1", 0) as relay:
            app = Senddock(make_config(verp_settings(relay.port, max_message_size=max_message_size, mailbox={
                "url": url, "password": "${MAILBOX_PASSWORD}", "security": "none", "interval": "200ms", **mailbox})))
            make_broadcast(app, EMAILS)
            drain(app.config)
            return app, {m.recipients[0]: (m.sender, m.message_id) for m in relay.received}

    return configured


def bounce_for(mail: dict, email: str) -> bytes:
    return dsn(mail[email][0], email, mail[email][1])


def test_imap_messages_are_moved_only_once_applied(cli, sent, dovecot):
    app, mail = sent(f"imap://{Dovecot.USER}@127.0.0.1:{dovecot.imap_port}/INBOX", after="move:Processed")
    dovecot.deliver(bounce_for(mail, "gone@example.net"), bounce_for(mail, "moved@example.net"),
                    vacation(mail["ada@example.net"][0]))
    result = cli("bounces", "fetch", "-c", app.config.path, "--json")
    assert result.exit_code == 0, result.stderr
    assert (result.json["messages"], result.json["applied"], result.json["ignored"]) == (3, 2, 1)
    assert suppressed(app) == {"gone@example.net": "bounced", "moved@example.net": "bounced"}
    assert (dovecot.count("INBOX"), dovecot.count("Processed")) == (0, 3)
    assert cli("bounces", "fetch", "-c", app.config.path, "--json").json["messages"] == 0
    app.close()


def test_pop3_deletes_after_applying_and_a_refused_login_removes_nothing(cli, sent, dovecot, monkeypatch):
    app, mail = sent(f"pop3://{Dovecot.USER}@127.0.0.1:{dovecot.pop3_port}")
    dovecot.deliver(bounce_for(mail, "gone@example.net"))
    monkeypatch.setenv("MAILBOX_PASSWORD", "wrong")
    refused = cli("bounces", "fetch", "-c", app.config.path, "--json")
    assert refused.exit_code == 1 and "Traceback" not in refused.stderr
    assert refused.json["problems"][0].startswith(f"pop3://{Dovecot.USER}@127.0.0.1:{dovecot.pop3_port}: error_proto")
    assert "wrong" not in refused.stdout + refused.stderr
    assert dovecot.count() == 1 and suppressed(app) == {}
    monkeypatch.setenv("MAILBOX_PASSWORD", Dovecot.PASSWORD)
    fetched = cli("bounces", "fetch", "-c", app.config.path, "--json")
    assert fetched.exit_code == 0 and fetched.json["applied"] == 1
    assert dovecot.count() == 0 and suppressed(app) == {"gone@example.net": "bounced"}
    app.close()


@dataclass
class Watch:
    process: subprocess.Popen
    stdout: str = ""
    stderr: str = ""


@contextmanager
def watching(app, database_dsn: str) -> Iterator[Watch]:
    """`senddock bounces fetch --watch --json` on ``app``'s config, as a process of its own,
    stopped with SIGTERM at the end of the block (its output then in the Watch)."""
    env = {**os.environ, "SENDDOCK_DATABASE_URL": database_dsn, "BOUNCE_SECRET": SECRET,
           "MAILBOX_PASSWORD": Dovecot.PASSWORD}
    watch = Watch(subprocess.Popen([senddock_executable(), "bounces", "fetch", "--watch", "-c", str(app.config.path),
                                    "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True))
    try:
        yield watch
    finally:
        watch.process.send_signal(signal.SIGTERM)
        watch.stdout, watch.stderr = watch.process.communicate(timeout=30)


def test_watch_keeps_reading_until_stopped(sent, dovecot, database_dsn):
    app, mail = sent(f"imap://{Dovecot.USER}@127.0.0.1:{dovecot.imap_port}/INBOX")
    with watching(app, database_dsn) as watch:
        dovecot.deliver(bounce_for(mail, "gone@example.net"))
        wait_for(lambda: suppressed(app) == {"gone@example.net": "bounced"}, 30, "the first bounce")
        dovecot.deliver(bounce_for(mail, "moved@example.net"))
        wait_for(lambda: "moved@example.net" in suppressed(app), 30, "the second bounce, read on the next round")
        wait_for(lambda: dovecot.count() == 0, 10, "the mailbox to be emptied")
    assert watch.process.returncode == 0, watch.stderr
    assert '"applied": 2' in watch.stdout
    app.close()


@pytest.mark.parametrize("protocol", ["imap", "pop3"])
def test_a_message_over_max_message_size_is_counted_and_removed_unread(cli, sent, dovecot, protocol):
    port = dovecot.imap_port if protocol == "imap" else dovecot.pop3_port
    folder = "/INBOX" if protocol == "imap" else ""
    app, mail = sent(f"{protocol}://{Dovecot.USER}@127.0.0.1:{port}{folder}", max_message_size="4KiB")
    dovecot.deliver(b"Subject: huge\r\nMessage-ID: <huge@example.org>\r\n\r\n" + (b"x" * 70 + b"\r\n") * 200,
                    bounce_for(mail, "gone@example.net"))
    result = cli("bounces", "fetch", "-c", app.config.path, "--json")
    assert result.exit_code == 0, result.stderr
    assert (result.json["too_large"], result.json["applied"], result.json["suppressed"]) == (1, 1, 1)
    assert dovecot.count() == 0
    app.close()
