"""Bounces by mail through `senddock bounces ingest`, after a real broadcast through an SMTP relay
with a signed VERP return path: hard bounces and complaints suppress, soft ones at the limit,
and nothing forged, misaddressed, replayed or about a deleted job suppresses anyone."""

from __future__ import annotations

import mailbox
import time
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path

import pytest
from tests_support import make_broadcast, running_node, suppressed, wait_for

from senddock.api import Senddock
from senddock.mail import verp
from senddock.sink import Sink
from senddock.testing import drain, fast_settings

SECRET = "bounce-secret-for-the-ingest-tests"
EMAILS = [f"user{i}@example.net" for i in range(6)]


def verp_settings(relay_port: int, **bounces) -> dict:
    """Test timings, the relay, a signed VERP return path (BOUNCE_SECRET from the environment)."""
    settings = fast_settings(relay_port)
    settings["smtp"]["return_path"] = "bounces+{token}@example.com"
    settings["bounces"] = {"secret": "${BOUNCE_SECRET}", **bounces}
    return settings


@pytest.fixture
def sent(make_config, monkeypatch):
    """Six messages through a relay: (app, config path, {recipient: (return path, Message-ID)})."""
    monkeypatch.setenv("BOUNCE_SECRET", SECRET)
    with Sink("127.0.0.1", 0) as relay:
        app = Senddock(make_config(verp_settings(relay.port)))
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
        diagnostic: str = "550 5.1.1 <{r}>: Recipient address rejected: User unknown",
        date: str = "") -> bytes:
    """A Postfix-style delivery status notification to ``return_path``, quoting our headers."""
    return f"""\
From: MAILER-DAEMON@mx.example.net (Mail Delivery System)
To: {return_path}
Subject: Undelivered Mail Returned to Sender
Message-ID: {make_msgid(domain="mx.example.net")}
Date: {date or formatdate()}
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


def test_soft_bounces_of_three_messages_suppress_and_policy_refusals_never_count(cli, make_config, monkeypatch,
                                                                                 tmp_path):
    """bounces.soft: 3 messages that bounced soft about the mailbox within 30 days, since the last
    delivery, suppress; a report of the same message again, an old report, and refusals of our
    message (5.7.1) count for nothing."""
    monkeypatch.setenv("BOUNCE_SECRET", SECRET)
    with Sink("127.0.0.1", 0) as relay:
        app = Senddock(make_config(verp_settings(relay.port)))
        make_broadcast(app, ["full@example.net"])
        for n in range(5):  # six messages to the same address, one per campaign
            campaign = app.create_campaign(name=f"Issue {n}", lists=["news"], subject="News", text_body="Hi",
                                           from_addr="news@example.com")
            app.send_campaign(campaign)
        drain(app.config)
        messages = [(m.sender, m.message_id) for m in sorted(relay.received, key=lambda m: m.at)]
    assert len(messages) == 6
    config = app.config.path

    def soft(n: int, name: str, **options) -> Path:
        options.setdefault("status", "4.2.2")
        options.setdefault("diagnostic", "452 4.2.2 Mailbox full")
        return write(tmp_path, name, dsn(messages[n][0], "full@example.net", messages[n][1], **options))

    def ingest(*paths) -> dict:
        result = cli("bounces", "ingest", *paths, "-c", config, "--json")
        assert result.exit_code == 0, result.stderr
        return result.json

    refusals = [soft(n, f"policy{n}.eml", status="5.7.1", diagnostic="550 5.7.1 Message rejected as spam")
                for n in range(4)]
    assert ingest(*refusals)["applied"] == 4 and suppressed(app) == {}  # about our message: never counted
    earlier = formatdate(time.time() - 600)  # ten minutes ago, as the reports' Date says
    assert ingest(soft(0, "a.eml", date=earlier), soft(1, "b.eml", date=earlier),
                  soft(0, "a-again.eml", date=earlier))["suppressed"] == 0  # 2 messages
    with app.db.connection() as conn:  # a delivery since (as an SES notification records one): counting starts anew
        conn.execute("INSERT INTO delivery_events (event_key, email, kind, suppresses, occurred_at) "
                     "VALUES ('delivered-1', 'full@example.net', 'delivery', false, now() - interval '5 minutes')")
    old = soft(2, "old.eml", date="Mon, 01 Jan 2024 10:00:00 +0000")  # an archive's report: too old to count
    assert ingest(old, soft(3, "d.eml"), soft(4, "e.eml"))["suppressed"] == 0
    assert ingest(soft(5, "f.eml"))["suppressed"] == 1  # the third message within 30 days
    assert suppressed(app) == {"full@example.net": "bounced"}
    app.close()


def test_a_maildir_is_filed_under_cur_once_applied_and_a_deleted_campaigns_bounce_counts(cli, sent, tmp_path):
    app, config, campaign_id, mail = sent
    box = mailbox.Maildir(tmp_path / "Maildir", create=True)
    box.add(dsn(*mail["user0@example.net"][:1], "user0@example.net", mail["user0@example.net"][1]))
    box.add(vacation(mail["user3@example.net"][0]))
    app.delete_campaign(campaign_id, force=True)  # finished, then deleted with its jobs
    delivered = sorted(p.read_bytes() for p in (tmp_path / "Maildir" / "new").iterdir())
    result = cli("bounces", "ingest", tmp_path / "Maildir", "-c", config, "--json")
    assert result.exit_code == 0
    assert result.json["unknown_job"] == 1 and result.json["ignored"] == 1 and result.json["suppressed"] == 0
    assert suppressed(app) == {}
    assert not list((tmp_path / "Maildir" / "new").iterdir())
    filed = list((tmp_path / "Maildir" / "cur").iterdir())
    assert all(p.name.endswith(":2,S") for p in filed)  # seen, as maildir(5) writes it
    assert sorted(p.read_bytes() for p in filed) == delivered  # renamed, not rewritten
    assert cli("bounces", "ingest", tmp_path / "Maildir", "-c", config, "--json").json["messages"] == 0


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
        app = Senddock(make_config(verp_settings(relay.port)))
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


def test_a_report_is_judged_by_the_jobs_own_line_and_an_unwritable_domain_is_no_crash(cli, sent, tmp_path):
    """A DSN naming several recipients: the job's own block decides (here soft, while another
    address bounced hard). A report naming an address whose domain has no IDNA form (a forged or
    broken one) is an address mismatch, and the next message still applies."""
    app, config, campaign_id, mail = sent
    return_path, message_id = mail["user0@example.net"]
    two = dsn(return_path, "user0@example.net", message_id, status="4.2.2", diagnostic="452 4.2.2 Mailbox full")
    two = two.replace(b"Final-Recipient: rfc822; user0@example.net",
                      b"Final-Recipient: rfc822; other@example.org\nAction: failed\nStatus: 5.1.1\n\n"
                      b"Final-Recipient: rfc822; user0@example.net")
    odd = dsn(mail["user1@example.net"][0], "x@" + "\u00fc" * 70 + ".com", "<x@y>")
    good = dsn(mail["user2@example.net"][0], "user2@example.net", mail["user2@example.net"][1])
    result = cli("bounces", "ingest", write(tmp_path, "two.eml", two), write(tmp_path, "odd.eml", odd),
                 write(tmp_path, "good.eml", good), "-c", config, "--json")
    assert result.exit_code == 0, result.stderr
    assert (result.json["applied"], result.json["address_mismatch"], result.json["suppressed"]) == (2, 1, 1)
    assert suppressed(app) == {"user2@example.net": "bounced"}
    with app.db.connection() as conn:
        assert conn.execute("SELECT email, bounce_type, sub_type FROM delivery_events ORDER BY id").fetchall() == [
            ("user0@example.net", "Transient", "4.2.2"), ("user2@example.net", "Permanent", "5.1.1")]
