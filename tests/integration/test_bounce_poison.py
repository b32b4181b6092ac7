"""One bad message never stops bounce intake (issue 33 §1): texts a message brings are made storable
before they reach SQL, and what still cannot be applied is a counted outcome (`unreadable`),
recorded once, answered permanently, left where an operator can see it.

The fuzz test feeds the parser and the intake mutated real samples (tests/bounce_samples), random
bytes, headers and MIME trees, with hypothesis (derandomized: the same examples in every run)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psycopg
import pytest
from aiosmtpd.smtp import Envelope, Session
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bounce_ingest import SECRET, dsn, sent  # noqa: F401 - fixture
from tests_support import suppressed

from senddock.bounces.parsing import parse_mail
from senddock.bounces.receiver import ReceiveSettings, _Handler
from senddock.domain import mail_events
from senddock.domain.mail_events import OUTCOMES

SAMPLES = sorted((Path(__file__).resolve().parents[1] / "bounce_samples").glob("*.eml"))
NUL_RECIPIENT = b"""From: MAILER-DAEMON@mx.example.net
To: bounces+anything@example.com
Subject: Undelivered Mail Returned to Sender
MIME-Version: 1.0
Content-Type: multipart/report; report-type=delivery-status; boundary="B"

--B
Content-Type: message/delivery-status

Reporting-MTA: dns; mx.example.net

Final-Recipient: rfc822; victim@example.com\x00x
Action: failed
Status: 5.1.1

--B--
"""


def receive(app, raw: bytes) -> str:
    """The reply `bounces receive` gives to this message (its handler, with the API's apply)."""
    from concurrent.futures import ThreadPoolExecutor

    settings = ReceiveSettings("127.0.0.1", 0, ("bounces+*@example.com",), 10 << 20, 5)

    def apply(data, origin, recipients):
        return app.apply_mail(data, via="receive", origin=origin, envelope_recipients=recipients)

    envelope = Envelope()
    envelope.original_content = raw
    envelope.rcpt_tos = ["bounces+anything@example.com"]
    session = Session(loop=None)
    session.peer = ("192.0.2.7", 25000)
    with ThreadPoolExecutor(1) as executor:
        return asyncio.run(_Handler(settings, apply, executor).handle_DATA(None, session, envelope))


def test_a_nul_in_a_recipient_no_longer_makes_the_receiver_answer_451_forever(sent):
    app, _, _, _ = sent
    reply = receive(app, NUL_RECIPIENT)
    assert reply.startswith("250"), reply
    assert receive(app, NUL_RECIPIENT).startswith("250")  # again: a replay, still no 4xx
    with app.db.connection() as conn:
        [(recipients, outcome)] = conn.execute("SELECT recipients, outcome FROM inbound_mail").fetchall()
    assert outcome == "unattributed" and recipients == ["victim@example.comx"]


def test_a_nul_in_the_diagnostic_and_a_date_in_year_1_are_applied_with_a_valid_token(sent):
    app, _, _, mail = sent
    return_path, message_id = mail["user0@example.net"]
    raw = dsn(return_path, "user0@example.net", message_id, diagnostic="550 5.1.1 gone\x00 for good",
              date="Mon, 07 Dec 1 16:20:00 -2359")
    assert receive(app, raw).startswith("250 2.0.0 Recorded: applied")
    assert suppressed(app) == {"user0@example.net": "bounced"}
    with app.db.connection() as conn:
        diagnostic = conn.execute("SELECT diagnostic FROM delivery_events").fetchone()[0]
    assert "\x00" not in diagnostic and "gone for good" in diagnostic


def test_a_message_that_cannot_be_applied_is_unreadable_once_and_ingest_goes_on(cli, sent, tmp_path, monkeypatch):
    """Whatever still fails (here: the database refusing a text as Postgres does NUL) makes the
    message `unreadable`: recorded, named, left in new/, and the next message is applied."""
    app, config, _, mail = sent
    maildir = tmp_path / "Maildir"
    for sub in ("cur", "new", "tmp"):
        (maildir / sub).mkdir(parents=True)
    poison = dsn(*mail["user1@example.net"][:1], "user1@example.net", mail["user1@example.net"][1])
    (maildir / "new" / "1.poison").write_bytes(poison)
    (maildir / "new" / "2.good").write_bytes(dsn(mail["user2@example.net"][0], "user2@example.net",
                                                 mail["user2@example.net"][1]))
    outcome = mail_events._outcome

    def refused_once(db, pm, config_, suppressions, parsed, replayed):
        if "user1@example.net" in parsed.report.recipients:
            raise psycopg.errors.CharacterNotInRepertoire('invalid byte sequence for encoding "UTF8": 0x00')
        return outcome(db, pm, config_, suppressions, parsed, replayed)

    monkeypatch.setattr(mail_events, "_outcome", refused_once)
    result = cli("bounces", "ingest", "-c", config, str(maildir), "--json")
    assert result.exit_code == 1, result.stderr  # a problem found in the input, named
    assert (result.json["unreadable"], result.json["applied"]) == (1, 1)
    [problem] = result.json["problems"]
    assert problem.startswith(f"{maildir}#1: unreadable (CharacterNotInRepertoire") and "left where it is" in problem
    assert suppressed(app) == {"user2@example.net": "bounced"}
    assert sorted(p.name for p in (maildir / "new").iterdir()) == ["1.poison"]
    with app.db.connection() as conn:
        assert conn.execute("SELECT outcome FROM inbound_mail ORDER BY id").fetchall() == [("unreadable",), ("applied",)]
    # Read again, it is a replay of an unreadable message: counted, not tried as new.
    again = cli("bounces", "ingest", "-c", config, str(maildir), "--json")
    assert again.json["unreadable"] == 1


def test_the_receiver_answers_554_not_451_to_what_it_cannot_apply_for_any_reason_but_the_database():
    from concurrent.futures import ThreadPoolExecutor

    def broken(raw, origin, recipients):
        raise KeyError("a bug")

    envelope = Envelope()
    envelope.original_content = b"Subject: x\r\n\r\nx\r\n"
    envelope.rcpt_tos = ["bounces+x@example.com"]
    settings = ReceiveSettings("127.0.0.1", 0, ("bounces+*@example.com",), 1 << 20, 5)
    with ThreadPoolExecutor(1) as executor:
        reply = asyncio.run(_Handler(settings, broken, executor).handle_DATA(None, Session(loop=None), envelope))
    assert reply.startswith("554 5.6.0")


# -- the fuzz test ------------------------------------------------------------------------------

_PRINTABLE_JUNK = st.binary(max_size=64) | st.sampled_from(
    [b"\x00", b"\xff\xfe", b"\r", b"\n\n", b"=?utf-8?q?", b"--B", b"Content-Type: multipart/mixed; boundary=Q\n",
     b"Final-Recipient: rfc822; a\x00@b\n", b"Date: Mon, 07 Dec 1 16:20:00 -2359\n", b"\x1b[31m", b"\xed\xa0\x80"])


@st.composite
def mutated(draw, base: list[bytes]) -> bytes:
    raw = draw(st.sampled_from(base))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(raw)))
        kind = draw(st.sampled_from(["insert", "cut", "header", "nest", "date"]))
        if kind == "insert":
            raw = raw[:at] + draw(_PRINTABLE_JUNK) + raw[at:]
        elif kind == "cut":
            raw = raw[:at] + raw[at + draw(st.integers(0, 200)):]
        elif kind == "header":
            name = draw(st.sampled_from([b"Final-Recipient", b"Diagnostic-Code", b"Status", b"Action", b"Message-ID",
                                         b"To", b"Delivered-To", b"Content-Type", b"Subject"]))
            raw = name + b": " + draw(_PRINTABLE_JUNK) + b"\n" + raw
        elif kind == "nest":
            depth = draw(st.integers(1, 60))
            raw = (b"Content-Type: multipart/mixed; boundary=N\n\n--N\n" * depth) + raw
        else:
            raw = b"Date: " + draw(st.sampled_from([b"Mon, 07 Dec 1 16:20:00 -2359", b"Fri, 31 Dec 9999 23:59:59 +9999",
                                                     b"yesterday", b"\x00"])) + b"\n" + raw
    return raw


def test_no_mutated_message_stops_the_parser_the_intake_or_the_receiver(sent):
    app, _, _, mail = sent
    return_path, message_id = mail["user3@example.net"]
    # The valid report as often as all the samples: its mutations reach the job, the event, the hooks.
    base = [path.read_bytes() for path in SAMPLES] + [dsn(return_path, "user3@example.net", message_id)] * len(SAMPLES)
    seen: list[str] = []

    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(raw=mutated(base) | st.binary(max_size=2000))
    def check(raw: bytes) -> None:
        parsed = parse_mail(app.config, raw)
        texts = [*parsed.report.recipients, parsed.report.status or "", parsed.report.reason or "", parsed.key]
        assert not any("\x00" in text for text in texts)
        outcome = app.apply_mail(raw, via="ingest", origin="fuzz")
        assert outcome.outcome in OUTCOMES
        reply = receive(app, raw)
        assert reply[:1] in ("2", "5"), reply  # never a 4xx: the database is up
        seen.append(outcome.outcome)

    check()
    assert len(seen) == 150
    # And the next good message is applied.
    good = dsn(mail["user4@example.net"][0], "user4@example.net", mail["user4@example.net"][1])
    assert app.apply_mail(good, via="ingest", origin="after the fuzz").outcome == "applied"
    assert "user4@example.net" in suppressed(app)
    print(json.dumps({o: seen.count(o) for o in sorted(set(seen))}))
