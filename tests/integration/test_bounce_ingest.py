"""Bounces by mail through `senddock bounces ingest`, after a real broadcast through an SMTP relay
with a signed VERP return path: hard bounces and complaints suppress, soft ones at the limit,
and nothing forged, misaddressed, replayed or about a deleted job suppresses anyone."""

from __future__ import annotations

import mailbox
from email.message import EmailMessage
from email.utils import make_msgid

import pytest
from tests_support import make_broadcast, running_node, suppressed, wait_for

from senddock.api import Senddock
from senddock.mail import verp
from senddock.sink import Sink
from senddock.testing import drain, fast_settings

SECRET = "bounce-secret-for-the-ingest-tests"
EMAILS = [f"user{i}@example.net" for i in range(6)]


@pytest.fixture
def sent(make_config, monkeypatch):
    """Six messages through a relay: (app, config path, {recipient: (return path, Message-ID)})."""
    monkeypatch.setenv("BOUNCE_SECRET", SECRET)
    with Sink("127.0.0.1", 0) as relay:
        settings = fast_settings(relay.port)
        settings["smtp"]["return_path"] = "bounces+{token}@example.com"
        settings["bounces"] = {"secret": "${BOUNCE_SECRET}"}
        app = Senddock(make_config(settings))
        campaign_id = make_broadcast(app, EMAILS)
        drain(app.config)
        received = relay.received
    assert len(received) == len(EMAILS)
    yield app, app.config.path, campaign_id, {m.recipients[0]: (m.sender, m.message_id) for m in received}
    app.close()


def returned(message_id: str, recipient: str) -> str:
    """The last part of a report: our message's headers, as the reporting server returns them."""
    return (f"--B\nContent-Type: text/rfc822-headers\n\nMessage-ID: {message_id}\nFrom: news@example.com\n"
            f"To: {recipient}\nSubject: Hello\n\n--B--\n")


def dsn(return_path: str, recipient: str, returned_id: str, *, status: str = "5.1.1", action: str = "failed",
        diagnostic: str = "550 5.1.1 <{r}>: Recipient address rejected: User unknown") -> bytes:
    """A Postfix-style delivery status notification to ``return_path``, quoting our headers."""
    return f"""\
From: MAILER-DAEMON@mx.example.net (Mail Delivery System)
To: {return_path}
Subject: Undelivered Mail Returned to Sender
Message-ID: {make_msgid(domain="mx.example.net")}
Auto-Submitted: auto-replied
MIME-Version: 1.0
Content-Type: multipart/report; report-type=delivery-status; boundary="B"

--B
Content-Type: text/plain

This is the mail system at host mx.example.net.

--B
Content-Type: message/delivery-status

Reporting-MTA: dns; mx.example.net

Final-Recipient: rfc822; {recipient}
Action: {action}
Status: {status}
Diagnostic-Code: smtp; {diagnostic.format(r=recipient)}

{returned(returned_id, recipient)}""".encode()


def arf(return_path: str, recipient: str, returned_id: str) -> bytes:
    """An RFC 5965 abuse report quoting our message."""
    return f"""\
From: feedback@arf.mail.example.org
To: abuse@example.com
Subject: FW: Hello
Message-ID: {make_msgid(domain="arf.mail.example.org")}
MIME-Version: 1.0
Content-Type: multipart/report; report-type=feedback-report; boundary="B"

--B
Content-Type: text/plain

This is an email abuse report for an email message received from IP 192.0.2.1.

--B
Content-Type: message/feedback-report

Feedback-Type: abuse
User-Agent: ExampleFBL/1.0
Version: 1
Original-Mail-From: <{return_path}>
Original-Rcpt-To: <{recipient}>

{returned(returned_id, recipient)}""".encode()


def vacation(return_path: str) -> bytes:
    message = EmailMessage()
    message["From"] = "user3@example.net"
    message["To"] = return_path
    message["Subject"] = "Out of office: Hello"
    message["Auto-Submitted"] = "auto-replied"
    message.set_content("I am away until Monday.\n")
    return bytes(message)


def write(folder, name: str, data: bytes):
    path = folder / name
    path.write_bytes(data)
    return path


def test_ingest_suppresses_hard_bounces_and_complaints_only_for_their_own_jobs(cli, sent, tmp_path):
    app, config, campaign_id, mail = sent
    forged_path = "bounces+" + verp.make_token("someone-elses-secret-01", 1, 5) + "@example.com"
    files = [
        write(tmp_path, "hard.eml", dsn(*mail["user0@example.net"][:1], "user0@example.net", mail["user0@example.net"][1])),
        write(tmp_path, "complaint.eml", arf(mail["user1@example.net"][0], "user1@example.net", mail["user1@example.net"][1])),
        write(tmp_path, "soft.eml", dsn(mail["user2@example.net"][0], "user2@example.net", "<x@y>", status="4.2.2",
                                        diagnostic="552 4.2.2 Mailbox full")),
        write(tmp_path, "vacation.eml", vacation(mail["user3@example.net"][0])),
        # A perfect bounce with a token no configured key made: recorded as forged.
        write(tmp_path, "forged.eml", dsn(forged_path, "user4@example.net", "<x@y>")),
        # user5's real token, but a report about somebody else: nobody is suppressed.
        write(tmp_path, "mismatch.eml", dsn(mail["user5@example.net"][0], "victim@example.org", "<x@y>")),
        # The unsigned token of earlier versions names no job.
        write(tmp_path, "unsigned.eml", dsn("bounces+b1.j5@example.com", "user4@example.net", "<x@y>")),
    ]
    first = cli("bounces", "ingest", *files, "-c", config, "--json")
    assert first.exit_code == 0, first.stderr
    assert {k: v for k, v in first.json.items() if v} == {
        "messages": 7, "applied": 3, "ignored": 1, "forged": 1, "address_mismatch": 1, "unattributed": 1,
        "suppressed": 2}
    assert suppressed(app) == {"user0@example.net": "bounced", "user1@example.net": "complained"}

    again = cli("bounces", "ingest", *files, "-c", config, "--json")  # a relay's retry, a second fetch
    assert again.exit_code == 0 and again.json["replayed"] == 7 and again.json["suppressed"] == 0
    assert suppressed(app) == {"user0@example.net": "bounced", "user1@example.net": "complained"}
    with app.db.connection() as conn:
        events = conn.execute("SELECT email, kind, bounce_type, suppresses FROM delivery_events ORDER BY id").fetchall()
        outcomes = dict(conn.execute("SELECT outcome, count(*) FROM inbound_mail GROUP BY outcome").fetchall())
    assert events == [("user0@example.net", "bounce", "Permanent", True),
                      ("user1@example.net", "complaint", None, True),
                      ("user2@example.net", "bounce", "Transient", False)]
    assert outcomes == {"applied": 3, "ignored": 1, "forged": 1, "address_mismatch": 1, "unattributed": 1}

    status = cli("campaign", "status", campaign_id, "-c", config, "--json").json
    assert status["bounces"] == {"hard": 1, "soft": 1, "complaints": 1, "hard_rate": round(1 / 6, 6),
                                 "soft_rate": round(1 / 6, 6), "complaint_rate": round(1 / 6, 6),
                                 "complaint_rate_limit": 0.003}
    human = cli("campaign", "status", campaign_id, "-c", config).stdout
    assert ("bounces: hard 1 (16.67%), soft 1 (16.67%), complaints 1 (16.67%, at or above the 0.3% Gmail and "
            "Yahoo allow bulk senders)") in human


def test_soft_bounces_suppress_at_the_limit_and_policy_refusals_never(cli, sent, tmp_path):
    app, config, campaign_id, mail = sent
    return_path, message_id = mail["user2@example.net"]
    refusals = [write(tmp_path, f"policy{i}.eml", dsn(return_path, "user2@example.net", message_id, status="5.7.1",
                                                       diagnostic="550 5.7.1 Message rejected as spam"))
                for i in range(4)]
    assert cli("bounces", "ingest", *refusals, "-c", config, "--json").json["applied"] == 4
    assert suppressed(app) == {}  # about our message, not the address: never counted
    full = [write(tmp_path, f"full{i}.eml", dsn(return_path, "user2@example.net", message_id, status="4.2.2",
                                                 diagnostic="452 4.2.2 Mailbox full"))
            for i in range(3)]
    assert cli("bounces", "ingest", *full[:2], "-c", config, "--json").json["suppressed"] == 0
    with app.db.connection() as conn:  # a delivery in between (as an SES notification records one)...
        conn.execute("INSERT INTO delivery_events (event_key, email, kind, suppresses) "
                     "VALUES ('delivered-1', 'user2@example.net', 'delivery', false)")
    after_delivery = [write(tmp_path, f"later{i}.eml", dsn(return_path, "user2@example.net", message_id,
                                                            status="4.2.2", diagnostic="452 4.2.2 Mailbox full"))
                      for i in range(2)]
    assert cli("bounces", "ingest", *after_delivery, "-c", config, "--json").json["suppressed"] == 0  # ...counts anew
    third = cli("bounces", "ingest", full[2], "-c", config, "--json")
    assert third.json["suppressed"] == 1  # bounces.soft.limit: 3 within 30 days
    assert suppressed(app) == {"user2@example.net": "bounced"}


def test_a_maildir_is_filed_under_cur_once_applied_and_a_deleted_campaigns_bounce_counts(cli, sent, tmp_path):
    app, config, campaign_id, mail = sent
    box = mailbox.Maildir(tmp_path / "Maildir", create=True)
    box.add(dsn(*mail["user0@example.net"][:1], "user0@example.net", mail["user0@example.net"][1]))
    box.add(vacation(mail["user3@example.net"][0]))
    app.delete_campaign(campaign_id, force=True)  # finished, then deleted with its jobs
    result = cli("bounces", "ingest", tmp_path / "Maildir", "-c", config, "--json")
    assert result.exit_code == 0
    assert result.json["unknown_job"] == 1 and result.json["ignored"] == 1 and result.json["suppressed"] == 0
    assert suppressed(app) == {}
    assert not list((tmp_path / "Maildir" / "new").iterdir()) and len(list((tmp_path / "Maildir" / "cur").iterdir())) == 2


def test_unreadable_paths_are_named_and_the_rest_still_applies(cli, sent, tmp_path):
    app, config, campaign_id, mail = sent
    good = write(tmp_path, "hard.eml", dsn(mail["user0@example.net"][0], "user0@example.net", "<x@y>"))
    (tmp_path / "plain-folder").mkdir()
    result = cli("bounces", "ingest", tmp_path / "missing.eml", tmp_path / "plain-folder", good, "-c", config, "--json")
    assert result.exit_code == 1
    assert result.json["applied"] == 1 and result.json["suppressed"] == 1
    assert result.json["problems"] == [f"{tmp_path / 'missing.eml'}: no such file or folder",
                                       f"{tmp_path / 'plain-folder'}: a folder that is no Maildir (it needs cur/, new/ "
                                       "and tmp/)"]


def test_hard_bounces_by_mail_count_in_the_bounce_rate_breaker(make_config, monkeypatch):
    """Six of a campaign's first ten messages bounce by mail while it is still sending: it pauses
    for its bounce rate (breaker.early_bounces: 5 of the first 10), as for bounces at the send."""
    monkeypatch.setenv("BOUNCE_SECRET", SECRET)
    emails = [f"reader{i:02d}@example.net" for i in range(40)]
    with Sink("127.0.0.1", 0) as relay:
        settings = fast_settings(relay.port)
        settings["smtp"]["return_path"] = "bounces+{token}@example.com"
        settings["bounces"] = {"secret": "${BOUNCE_SECRET}"}
        app = Senddock(make_config(settings))
        campaign_id = make_broadcast(app, emails, send=False)
        app.set_campaign_rate(campaign_id, "10/s")  # still sending when the bounces come back
        app.send_campaign(campaign_id)
        with running_node(app.config):
            wait_for(lambda: len(relay.received) >= 10, 30, "ten messages sent")
            first = sorted(relay.received, key=lambda m: m.at)[:6]
            # Through the API: this test process's node logs to stdout, where the CLI's JSON goes.
            outcomes = [app.apply_mail(dsn(m.sender, m.recipients[0], m.message_id), via="ingest").outcome
                        for m in first]
            assert outcomes == ["applied"] * 6
            status = app.campaign_status(campaign_id)
            assert (status.status, status.paused_reason) == ("paused", "bounce_rate")
    assert status.sent < len(emails)
    app.close()
