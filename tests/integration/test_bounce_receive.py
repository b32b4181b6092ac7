"""`senddock bounces receive` end to end: senddock sends through a relay that accepts every
message and then mails a delivery status notification to the return path for a dead mailbox; the
receiver (a real `senddock bounces receive` process) records it before answering 250, the
address is suppressed, and the next campaign skips it."""

from __future__ import annotations

import os
import signal
import smtplib
import socket
import subprocess
import threading
from email.utils import make_msgid

import pytest
from test_bounce_ingest import dsn, verp_settings
from tests_support import make_broadcast, senddock_executable, suppressed, wait_for

from senddock.api import Senddock
from senddock.bounces.receiver import BounceReceiver, ReceiveSettings
from senddock.sink import Received, Sink, free_port
from senddock.testing import drain

SECRET = "bounce-secret-for-the-receive-tests"
EMAILS = ["ada@example.net", "gone@example.net", "grace@example.net"]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


@pytest.fixture
def receiver(make_config, database_dsn, monkeypatch):
    """(app, receiver port, config path) with `senddock bounces receive` running as a process."""
    monkeypatch.setenv("BOUNCE_SECRET", SECRET)
    port = free_port("127.0.0.1")
    app = Senddock(make_config(verp_settings(free_port("127.0.0.1"), receive={"listen": f"127.0.0.1:{port}"})))
    app.ensure_schema()
    env = {**os.environ, "SENDDOCK_DATABASE_URL": database_dsn, "BOUNCE_SECRET": SECRET}
    process = subprocess.Popen([senddock_executable(), "bounces", "receive", "-c", str(app.config.path), "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        wait_for(lambda: listening(port) or process.poll() is not None, 30, "bounces receive")
        assert process.poll() is None, process.stderr.read()
        yield app, port, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
        app.close()


def test_a_dsn_mailed_by_the_relay_suppresses_the_address_and_the_next_campaign_skips_it(receiver, make_config):
    app, port, process = receiver
    replies: list[tuple] = []

    def relay_bounces(message: Received) -> None:
        """The relay accepted the message; the mailbox turns out not to exist: it mails a DSN to
        the return path, as Postfix would, from a thread of its own."""
        if message.recipients != ("gone@example.net",):
            return

        def mail_back() -> None:
            with smtplib.SMTP("127.0.0.1", port, timeout=30) as client:
                replies.append(client.sendmail("", [message.sender],
                                               dsn(message.sender, "gone@example.net", message.message_id)))
        threading.Thread(target=mail_back).start()

    with Sink("127.0.0.1", app.config.section("smtp")["port"], on_message=relay_bounces) as relay:
        make_broadcast(app, EMAILS)
        drain(app.config)
        wait_for(lambda: replies, 30, "the DSN to be accepted")
        assert replies == [{}]  # 250: recorded
        assert suppressed(app) == {"gone@example.net": "bounced"}

        second = app.create_campaign(name="Second", lists=["news"], subject="Again", from_addr="news@example.com",
                                     text_body="Hello again")
        queued = app.send_campaign(second)
        assert queued.skipped_suppressed == 1
        drain(app.config)
        second_recipients = [m.recipients for m in relay.received[len(EMAILS):]]
    assert sorted(second_recipients) == [("ada@example.net",), ("grace@example.net",)]

    process.send_signal(signal.SIGTERM)
    stdout, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert '"applied": 1' in stdout


def test_the_receiver_is_no_open_relay_and_a_redelivered_dsn_is_recorded_once(receiver):
    app, port, process = receiver
    make_broadcast(app, ["gone@example.net"], send=True)
    with Sink("127.0.0.1", app.config.section("smtp")["port"]) as relay:
        drain(app.config)
        [message] = relay.received
    bounce = dsn(message.sender, "gone@example.net", message.message_id)
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as client:
        client.ehlo()
        client.mail("")
        assert client.rcpt("someone@example.org")[0] == 550  # not ours: never relayed
        assert client.rcpt("postmaster@example.com")[0] == 550
        assert client.rcpt(message.sender)[0] == 250
        assert client.data(bounce)[0] == 250
        # The sender did not see the 250 (a timeout) and sends the same message again.
        assert client.sendmail("", [message.sender.upper()], bounce) == {}
    with app.db.connection() as conn:
        assert conn.execute("SELECT count(*) FROM delivery_events").fetchone()[0] == 1
        assert conn.execute("SELECT via, outcome FROM inbound_mail").fetchall() == [("receive", "applied")]
    assert suppressed(app) == {"gone@example.net": "bounced"}


def test_451_when_on_bounced_failed_and_bracketed_return_paths_are_literal(make_config, monkeypatch):
    """A message recorded but whose on_bounced hooks failed gets 451: only its arrival again runs
    them. A return path at an address literal accepts exactly that literal."""
    from types import SimpleNamespace

    from senddock.bounces.receiver import accepts, receive_settings

    settings = ReceiveSettings("127.0.0.1", 0, ("bounces+*@example.com",), max_message_size=4096, max_connections=2)
    server = BounceReceiver(settings, lambda raw, origin, rcpts: SimpleNamespace(outcome="applied",
                                                                                 hooks_failed=True)).start()
    try:
        with smtplib.SMTP("127.0.0.1", server.port, timeout=10) as client:
            with pytest.raises(smtplib.SMTPDataError) as refused:
                client.sendmail("", ["bounces+x@example.com"], b"Subject: x\r\n\r\nhi\r\n")
            assert refused.value.smtp_code == 451
    finally:
        server.stop()
    monkeypatch.setenv("BOUNCE_SECRET", SECRET)
    config = make_config({"smtp": {"return_path": "bounces+{token}@[192.0.2.1]"},
                          "bounces": {"secret": "${BOUNCE_SECRET}"}})
    patterns = receive_settings(config).addresses
    assert accepts(patterns, "bounces+abc@[192.0.2.1]") and not accepts(patterns, "bounces+abc@2")


def test_451_when_nothing_could_be_recorded_552_when_too_large_421_when_full():
    """The replies that make a sending server keep the message and try later (or give up on a
    message too large), with the recording step failing as a database that is down would."""
    def apply(raw, origin, recipients):
        raise ConnectionError("database is down")

    settings = ReceiveSettings("127.0.0.1", 0, ("bounces+*@example.com",), max_message_size=2048, max_connections=2)
    server = BounceReceiver(settings, apply).start()
    try:
        with smtplib.SMTP("127.0.0.1", server.port, timeout=10) as client:
            client.ehlo()
            client.mail("")
            client.rcpt("bounces+x@example.com")
            assert client.data(b"Subject: x\r\nMessage-ID: " + make_msgid().encode() + b"\r\n\r\nhi\r\n")[0] == 451
            client.mail("")
            client.rcpt("bounces+x@example.com")
            assert client.data(b"Subject: big\r\n\r\n" + (b"x" * 70 + b"\r\n") * 60)[0] == 552
            with smtplib.SMTP("127.0.0.1", server.port, timeout=10):
                with pytest.raises(smtplib.SMTPConnectError) as refused:
                    smtplib.SMTP("127.0.0.1", server.port, timeout=10)
                assert refused.value.smtp_code == 421
    finally:
        server.stop()


def test_the_receiver_also_runs_inside_serve(make_config, database_dsn, monkeypatch):
    monkeypatch.setenv("BOUNCE_SECRET", SECRET)
    port, web_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    with Sink("127.0.0.1", 0) as relay:
        settings = verp_settings(relay.port, receive={"listen": f"127.0.0.1:{port}", "in_serve": True})
        settings["serve"] = {"port": web_port}
        app = Senddock(make_config(settings))
        make_broadcast(app, ["gone@example.net"])
        drain(app.config)
        [message] = relay.received
    env = {**os.environ, "SENDDOCK_DATABASE_URL": database_dsn, "BOUNCE_SECRET": SECRET}
    process = subprocess.Popen([senddock_executable(), "serve", "-c", str(app.config.path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        wait_for(lambda: listening(port) or process.poll() is not None, 30, "serve's bounce receiver")
        assert process.poll() is None, process.stderr.read()
        with smtplib.SMTP("127.0.0.1", port, timeout=30) as client:
            assert client.sendmail("", [message.sender], dsn(message.sender, "gone@example.net",
                                                             message.message_id)) == {}
        assert suppressed(app) == {"gone@example.net": "bounced"}
        assert listening(web_port)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    assert process.returncode == 0
    app.close()
