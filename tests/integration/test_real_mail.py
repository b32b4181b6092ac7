"""Real mail end to end: personalised HTML through a STARTTLS + AUTH relay (aiosmtpd, a certificate
made by trustme), every header checked on the received bytes, a verifying DKIM signature, VERP,
and the one-click unsubscribe of a received message against a running `senddock serve`."""

from __future__ import annotations

import os
import smtplib
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from email import message_from_bytes
from email.policy import default as default_policy

import dkim
import pytest
import trustme
from tests_support import (
    dkim_key,
    dns_for,
    jobs_by_email,
    make_broadcast,
    running_node,
    senddock_executable,
    suppressed,
    wait_for,
)

from senddock.api import Senddock
from senddock.loading import load_config
from senddock.mail import mime, verp
from senddock.mail.compose import Composer
from senddock.mail.unsubscribe import read_token
from senddock.outcome import CampaignContent, Recipient
from senddock.sink import FailRule, Sink, free_port
from senddock.testing import drain, fast_settings

SECRET = "a-long-unsubscribe-secret-for-tests"
BOUNCE_SECRET = "a-long-bounce-secret-for-tests"
HTML = """<html><body>
<p>Hallo {{ subscriber.name }} aus {{ subscriber.attributes.city }},</p>
<p>unsere <b>Herbst</b>-Auswahl ist da.</p>
<p><a href="{{ unsubscribe_url }}">Abmelden</a></p>
</body></html>"""
PEOPLE = [("zoe@example.com", "Zoë Çelik", "Zürich"), ("juergen@bücher.example", "Jürgen Müller", "Köln"),
          ("ada@example.org", "Ada", "London")]


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture
def tls_files(ca, tmp_path):
    """The CA bundle a client trusts, and the server certificate for 127.0.0.1 (relay and serve)."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_pem.write_to_path(str(key_file))
    for blob in cert.cert_chain_pems:
        blob.write_to_path(str(cert_file), append=True)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_context)
    return {"ca": ca_file, "cert": cert_file, "key": key_file, "server_context": server_context}


def settings_for(relay_port: int, tmp_path, *, security: str, serve_port: int = 8025, **smtp) -> dict:
    key_file, record = dkim_key(tmp_path)
    (tmp_path / "dkim.txt").write_text(record)
    settings = fast_settings(relay_port)
    settings["smtp"].update(security=security, **smtp)
    settings["dkim"] = {"domain": "example.com", "selector": "s1", "private_key_file": str(key_file)}
    settings["unsubscribe"] = {"url": f"https://127.0.0.1:{serve_port}", "secret": "${UNSUB_SECRET}"}
    return settings


def personalised_campaign(app: Senddock) -> int:
    app.create_list("news")
    for email, name, city in PEOPLE:
        app.add_subscriber(email, name=name, attributes={"city": city}, lists=["news"])
    campaign_id = app.create_campaign(name="Herbst", lists=["news"], subject="Grüße, {{ subscriber.name }}",
                                      from_addr="Bücherei Zoë <news@example.com>", html_body=HTML)
    app.send_campaign(campaign_id)
    return campaign_id


def test_personalised_html_through_starttls_and_auth_signed_with_verp_and_one_click(
        make_config, tmp_path, tls_files, monkeypatch):
    monkeypatch.setenv("UNSUB_SECRET", SECRET)
    monkeypatch.setenv("SMTP_PASSWORD", "relay-password")
    monkeypatch.setenv("BOUNCE_SECRET", BOUNCE_SECRET)
    serve_port = free_port("127.0.0.1")
    with Sink("127.0.0.1", 0, security="starttls", tls_context=tls_files["server_context"],
              credentials=("mailer", "relay-password")) as relay:
        settings = settings_for(relay.port, tmp_path, security="starttls", serve_port=serve_port,
                                ca_file=str(tls_files["ca"]), username="mailer", password="${SMTP_PASSWORD}",
                                return_path="bounces+{token}@example.com")
        settings["serve"] = {"port": serve_port, "tls_cert_file": str(tls_files["cert"]),
                             "tls_key_file": str(tls_files["key"])}
        settings["bounces"] = {"secret": "${BOUNCE_SECRET}"}
        app = Senddock(make_config(settings))
        campaign_id = personalised_campaign(app)
        drain(app.config)
        received = relay.received
    assert app.campaign_status(campaign_id).sent == 3
    assert len(received) == 3
    record = (tmp_path / "dkim.txt").read_text()
    job_ids = {email: job for email, job in _job_ids(app, campaign_id).items()}
    links = {}
    for message in received:
        # 7-bit through and through: MAIL FROM carries no BODY=8BITMIME (RFC 6152) and needs none,
        # so no relay on the way converts the body under the DKIM body hash.
        assert message.data.isascii()
        parsed = message_from_bytes(message.data, policy=default_policy)
        email, name, city = next(p for p in PEOPLE if mime.ascii_address(p[0]) == message.recipients[0])
        assert parsed["Subject"] == f"Grüße, {name}"
        assert parsed["From"].addresses[0].display_name == "Bücherei Zoë"
        assert parsed["To"].addresses[0].display_name == name
        broadcast_id, job_id = job_ids[email]
        token = verp.make_token(BOUNCE_SECRET, broadcast_id, job_id)
        assert parsed["Message-ID"] == f"<senddock.{token}@example.com>"
        assert message.sender == f"bounces+{token}@example.com"  # VERP, signed
        assert parsed["List-Id"] == '"news" <list-1.example.com>'
        assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        assert dkim.verify(message.data, dnsfunc=dns_for(record)), f"DKIM does not verify for {email}"
        text, html = (part.get_content() for part in parsed.iter_parts())
        assert f"Hallo {name} aus {city}" in html and f"Hallo {name} aus {city}" in text
        url = parsed["List-Unsubscribe"].strip(" <>")
        assert f'href="{url}"' in html
        links[email] = url

    env = {**os.environ, "UNSUB_SECRET": SECRET}
    server = subprocess.Popen([senddock_executable(), "serve", "-c", str(app.config.path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        client = ssl.create_default_context(cafile=str(tls_files["ca"]))
        wait_for(lambda: _get(f"https://127.0.0.1:{serve_port}/healthz", client)[0] == 200, 20, "senddock serve")
        target = "juergen@bücher.example"
        token = links[target].rsplit("/", 1)[1]
        tampered = links[target][:-2] + ("AA" if not token.endswith("AA") else "BB")
        assert _post(tampered, client)[0] == 400
        assert _post(f"https://127.0.0.1:{serve_port}/unsubscribe/garbage", client)[0] == 400
        assert _subscriber_status(app) == {p[0]: "active" for p in PEOPLE}
        status, page = _get(links[target], client)
        assert status == 200 and 'name="List-Unsubscribe" value="One-Click"' in page
        assert _subscriber_status(app)[target] == "active"  # a GET (a link scanner) changes nothing

        status, page = _post(links[target], client)
        assert status == 200 and "juergen@bücher.example" in page
        assert _post(links[target], client)[0] == 200  # providers repeat clicks: still fine
    finally:
        server.terminate()
        assert server.wait(20) == 0, server.stderr.read().decode()
    assert _subscriber_status(app) == {**{p[0]: "active" for p in PEOPLE}, target: "unsubscribed"}
    assert suppressed(app) == {target: "unsubscribed"}
    assert read_token(SECRET, token).campaign_id == campaign_id
    app.close()


def test_starttls_without_auth_says_ehlo_again_inside_tls(make_config, tmp_path, tls_files, monkeypatch):
    """RFC 3207 4.2: after STARTTLS both sides forget what the clear-text EHLO said, and the client
    says EHLO again. With AUTH smtplib's login() did it; without, the session went on to MAIL with
    no EHLO inside TLS (a relay may answer 503), and without the PIPELINING it offers there."""
    monkeypatch.setenv("UNSUB_SECRET", SECRET)
    with Sink("127.0.0.1", 0, security="starttls", tls_context=tls_files["server_context"]) as relay:
        said: list[bool] = []  # per EHLO: was the session in TLS
        greet = relay.handler.handle_EHLO

        async def counted(server, session, envelope, hostname, responses):
            said.append(session.ssl is not None)
            return await greet(server, session, envelope, hostname, responses)

        relay.handler.handle_EHLO = counted
        app = Senddock(make_config(settings_for(relay.port, tmp_path, security="starttls",
                                                ca_file=str(tls_files["ca"]))))
        campaign_id = personalised_campaign(app)
        drain(app.config, concurrency=1)
        assert app.campaign_status(campaign_id).sent == 3
        assert len(relay.received) == 3
    assert said == [False, True]  # one session: EHLO in clear text, then again inside TLS
    app.close()


def test_implicit_tls_relay(make_config, tmp_path, tls_files, monkeypatch):
    monkeypatch.setenv("UNSUB_SECRET", SECRET)
    with Sink("127.0.0.1", 0, security="tls", tls_context=tls_files["server_context"]) as relay:
        app = Senddock(make_config(settings_for(relay.port, tmp_path, security="tls", ca_file=str(tls_files["ca"]))))
        campaign_id = personalised_campaign(app)
        drain(app.config)
        assert app.campaign_status(campaign_id).sent == 3
        assert len(relay.received) == 3
    app.close()


@pytest.mark.parametrize("problem", ["certificate not trusted", "no STARTTLS offered"])
def test_tls_that_cannot_be_set_up_pauses_and_suppresses_nobody(make_config, tmp_path, tls_files, monkeypatch, problem):
    monkeypatch.setenv("UNSUB_SECRET", SECRET)
    if problem == "certificate not trusted":  # the system's CAs do not know trustme's
        relay = Sink("127.0.0.1", 0, security="starttls", tls_context=tls_files["server_context"])
    else:
        relay = Sink("127.0.0.1", 0)
    with relay:
        app = Senddock(make_config(settings_for(relay.port, tmp_path, security="starttls")))
        campaign_id = personalised_campaign(app)
        drain(app.config)
        assert relay.received == []
    status = app.campaign_status(campaign_id)
    assert (status.status, status.paused_reason, status.pending) == ("paused", "tls_failed", 3)
    assert suppressed(app) == {}
    app.close()


def _job_ids(app, campaign_id):
    with app.db.connection() as conn:
        rows = conn.execute("SELECT j.email, j.broadcast_id, j.id FROM broadcast_jobs j JOIN campaigns c "
                            "ON c.broadcast_id = j.broadcast_id WHERE c.id = %s", (campaign_id,)).fetchall()
    return {email: (broadcast, job) for email, broadcast, job in rows}


def _subscriber_status(app):
    with app.db.connection() as conn:
        return dict(conn.execute("SELECT email, status FROM subscribers").fetchall())


def _request(url, context, data=None):
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if data is not None:
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None, ""


def _get(url, context):
    return _request(url, context)


def _post(url, context):
    return _request(url, context, b"List-Unsubscribe=One-Click")


def test_connections_are_reused_and_reopened_after_max_messages_and_after_a_421(make_config, smtp_sink):
    """One worker: messages share a connection up to max_messages_per_connection; a 421 (the
    server closing the session) makes the next message open a fresh one."""
    smtp_sink.handler.rules = [FailRule.parse("user4@*=421 4.7.0 closing connection")]
    # A 421 is throttling: it never uses up max_retries, so only max_age ends user4's retries.
    settings = fast_settings(smtp_sink.port, concurrency=1, claim_batch=20,
                             retry={"schedule": ["500ms"], "max_retries": 1, "jitter": 0, "max_age": "2s"})
    settings["smtp"]["max_messages_per_connection"] = 3
    app = Senddock(make_config(settings))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(10)])
    drain(app.config)
    by_connection: dict[tuple, list[str]] = {}
    for message in smtp_sink.received:
        by_connection.setdefault(message.peer, []).append(message.recipients[0].split("@")[0])
    assert sorted(sum(by_connection.values(), [])) == sorted(f"user{i}" for i in range(10) if i != 4)
    # At most three per connection, and reused: 9 messages need at least three.
    assert all(len(sent) <= 3 for sent in by_connection.values()) and 3 <= len(by_connection) <= 9
    assert max(len(sent) for sent in by_connection.values()) == 3
    # Each 421 ends its session: nothing more goes on the connection of the message before it (one
    # sender: its sends follow one another; the order within the claim is not promised).
    with app.db.connection() as conn:
        refused = [row[0].timestamp() for row in conn.execute(
            "SELECT a.started_at FROM delivery_attempts a JOIN broadcast_jobs j ON j.id = a.job_id "
            "WHERE j.email = 'user4@example.com' ORDER BY a.started_at")]
    assert refused
    for at in refused:
        before = [m for m in smtp_sink.received if m.at < at]
        if before:
            assert not [m for m in smtp_sink.received if m.at > at and m.peer == before[-1].peer], at
    # user4 is answered 421 every time: deferred (more often than max_retries allows a recipient's
    # own failures), then failed once retry.max_age passed, never suppressed.
    assert jobs_by_email(app, campaign_id)["user4@example.com"] == ("failed", "expired", 1)
    with app.db.connection() as conn:
        deferrals = conn.execute("SELECT deferrals FROM broadcast_jobs WHERE email = 'user4@example.com'").fetchone()[0]
    assert deferrals > 1  # more than max_retries
    assert suppressed(app) == {}
    app.close()


def test_connect_at_start_sends_on_the_sessions_opened_before_the_first_claim(make_config, smtp_sink):
    """smtp.connect_at_start: each of the node's 3 senders greets the relay before there is
    anything to send, and the broadcast then goes out on those sessions, none opened at a send."""
    settings = fast_settings(smtp_sink.port, concurrency=3)
    settings["smtp"]["connect_at_start"] = True
    config = make_config(settings)
    app = Senddock(config)
    with running_node(config):
        wait_for(lambda: len(smtp_sink.handler.sessions()) == 3, 10, "3 sessions opened as the node starts")
        opened_at_start = smtp_sink.handler.sessions()
        campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(12)])
        wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 20, "the broadcast to finish")
    assert len(smtp_sink.received) == 12
    assert {message.peer for message in smtp_sink.received} <= opened_at_start
    assert smtp_sink.handler.sessions() == opened_at_start
    app.close()


def test_connecting_ahead_with_no_relay_keeps_nothing_and_with_one_keeps_its_session():
    """A warm-up that cannot connect raises nothing and keeps nothing (the first send opens its own
    connection and reports what goes wrong, as a send); one that can keeps its session."""
    from senddock_smtp import transport

    settings = {"host": "127.0.0.1", "port": free_port("127.0.0.1"), "helo_name": "test", "timeout": "2s",
                "security": "none"}
    state: dict = {}
    transport.connect_ahead(settings, state)
    assert state == {}
    with Sink("127.0.0.1", 0) as sink:
        transport.connect_ahead({**settings, "port": sink.port}, state)
        assert len(sink.handler.sessions()) == 1
        transport.close(state)
    assert state == {}


@pytest.mark.parametrize("address", [
    "user@example.com", "a+b@x.org", "o'neil@x.com", "user@xn--bcher-kva.example", "", '"john doe"@example.com',
    "weird(comment)@x.com", "x@[127.0.0.1]", "<bounces@x.com>", "Bounces <b@x.com>", " a@b.com ", "<>",
])
def test_mail_and_rcpt_write_each_address_as_smtplib_would(address):
    """A stored addr-spec is written as it is (no second parse); anything else as quoteaddr cleans it."""
    from senddock_smtp.transport import _envelope_address

    assert _envelope_address(address) == smtplib.quoteaddr(address)


def test_a_connection_idle_past_the_limit_is_replaced_before_the_next_send(monkeypatch):
    """A relay (or a NAT between) may have dropped a session idle for long: the next send opens a
    fresh one instead of waiting a timeout on the old."""
    from senddock_smtp import transport

    composer = Composer(load_config(None, environ={"SENDDOCK_DATABASE_URL": "postgresql://x@localhost/x"}))
    content = CampaignContent(campaign_id=7, name="n", subject="s", from_addr="news@example.com", text_body="hi")
    prepared = composer.prepare(content)
    messages = [composer.message(prepared, Recipient(f"u{i}@example.com", "", {}, i), job_id=i + 1, broadcast_id=1,
                                 attempt=1) for i in range(3)]
    monkeypatch.setattr(transport, "IDLE_REOPEN", 0.3)
    state: dict = {}
    with Sink("127.0.0.1", 0) as sink:
        settings = {"host": "127.0.0.1", "port": sink.port, "timeout": "5s", "security": "none", "helo_name": "t"}
        assert transport.send(messages[0], settings, state).ok
        assert transport.send(messages[1], settings, state).ok  # at once: the same session
        time.sleep(0.5)
        assert transport.send(messages[2], settings, state).ok  # idle 0.5 s > 0.3 s: a fresh one
        transport.close(state)
        peers = [m.peer for m in sink.received]
    assert peers[0] == peers[1] != peers[2]


@pytest.mark.parametrize("pipelining", [True, False])
def test_mail_rcpt_and_data_go_in_one_write_to_a_relay_that_offers_pipelining(monkeypatch, pipelining):
    """RFC 2920: with a relay that says PIPELINING, MAIL, RCPT and DATA go in one write (the
    message only after DATA's 354); without it, one command at a time. Either way a refusal at
    MAIL, at RCPT or at the end of DATA is reported in its phase with its code, and the next
    message goes out on the same session."""
    from senddock_smtp import transport

    composer = Composer(load_config(None, environ={"SENDDOCK_DATABASE_URL": "postgresql://x@localhost/x"}))
    prepared = composer.prepare(CampaignContent(campaign_id=7, name="n", subject="s", from_addr="news@example.com",
                                                text_body=".a line starting with a dot\n.\nthe end"))
    recipients = ["ok1@example.com", "nobody@example.com", "late@example.com", "ok2@example.com"]
    messages = [composer.message(prepared, Recipient(email, "", {}, i), job_id=i + 1, broadcast_id=1, attempt=1)
                for i, email in enumerate(recipients)]
    writes: list[bytes] = []
    original = smtplib.SMTP.send

    def recorded(self, data):
        writes.append(data if isinstance(data, bytes) else data.encode("ascii"))
        return original(self, data)

    monkeypatch.setattr(smtplib.SMTP, "send", recorded)
    state: dict = {}
    with Sink("127.0.0.1", 0) as sink:
        sink.handler.pipelining = pipelining
        sink.handler.rules = [FailRule.parse("nobody@*=550 5.1.1 no such user"),
                              FailRule.parse("data:late@*=451 4.3.0 try again later")]
        settings = {"host": "127.0.0.1", "port": sink.port, "timeout": "5s", "security": "none", "helo_name": "t"}
        results = [transport.send(m, settings, state) for m in messages]
        sink.handler.rules = [*sink.handler.rules, FailRule.parse("mail:blocked@*=550 5.7.1 sender refused")]
        refused_sender = transport.send(messages[0], {**settings, "return_path": "blocked@example.com"}, state)
        after = transport.send(messages[3], settings, state)
        transport.close(state)
        received = sink.received
    assert [(r.ok, r.phase, r.code) for r in results] == [
        (True, "data", 250), (False, "rcpt", 550), (False, "data", 451), (True, "data", 250)]
    assert (refused_sender.ok, refused_sender.phase, refused_sender.code) == (False, "mail", 550)
    assert after.ok
    assert [m.recipients[0] for m in received] == ["ok1@example.com", "ok2@example.com", "ok2@example.com"]
    assert len({m.peer for m in received}) == 1  # one session throughout
    # The body arrives as written: dot-stuffing undone by the relay.
    body = message_from_bytes(received[0].data, policy=default_policy).get_content()
    assert body.replace("\r\n", "\n") == ".a line starting with a dot\n.\nthe end\n"
    together = [w for w in writes if b"mail FROM:" in w and b"rcpt TO:" in w and b"data\r\n" in w]
    assert len(together) == (6 if pipelining else 0), writes[:4]
