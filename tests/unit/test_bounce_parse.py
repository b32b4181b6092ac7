"""`senddock bounces parse`: the JSON-lines interface, the three kinds of input, and bad input
(a 50 MB message, binary garbage, broken MIME, a DSN naming 10,000 recipients) answered with a
result, never a traceback. No database: parse needs none."""

from __future__ import annotations

import json
import mailbox
import os
from pathlib import Path

import pytest
import structlog

from senddock.cli import main
from senddock.mail import verp

SECRET = "bounce-secret-for-the-parse-tests"


@pytest.fixture
def parse(tmp_path, capsys, monkeypatch):
    config = tmp_path / "senddock.yaml"
    config.write_text('bounces: {secret: "${BOUNCE_SECRET}"}\nlogging: {level: error}\n', encoding="utf-8")
    monkeypatch.setenv("BOUNCE_SECRET", SECRET)
    monkeypatch.setenv("SENDDOCK_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")  # never reached

    def run(*paths, json_mode: bool = True) -> tuple[int, list[dict] | str, str]:
        capsys.readouterr()
        try:
            code = main(["bounces", "parse", *map(str, paths), "-c", str(config), *(["--json"] if json_mode else [])])
        finally:
            structlog.reset_defaults()
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return code, ([json.loads(line) for line in out.splitlines()] if json_mode else out), err

    return run


def dsn(recipients: list[str], token: str | None = None, status: str = "5.1.1") -> bytes:
    blocks = "".join(f"Final-Recipient: rfc822; {r}\nAction: failed\nStatus: {status}\n"
                     f"Diagnostic-Code: smtp; 550 {status} user unknown\n\n" for r in recipients)
    to = f"bounces+{token}@example.com" if token else "bounces@example.com"
    return (f"From: MAILER-DAEMON@mx.example.net\nTo: {to}\nSubject: Undelivered Mail\nMessage-ID: <d1@mx>\n"
            "MIME-Version: 1.0\nContent-Type: multipart/report; report-type=delivery-status; boundary=\"B\"\n\n"
            "--B\nContent-Type: text/plain\n\nSorry.\n\n--B\nContent-Type: message/delivery-status\n\n"
            f"Reporting-MTA: dns; mx.example.net\n\n{blocks}--B--\n").encode()


def test_one_json_line_per_message_with_the_interfaces_keys(parse, tmp_path):
    token = verp.make_token(SECRET, 7, 101)
    (tmp_path / "one.eml").write_bytes(dsn(["Gone.User@Example.ORG"], token))
    code, lines, _ = parse(tmp_path / "one.eml")
    assert code == 0
    assert lines == [{"source": str(tmp_path / "one.eml"), "kind": "hard", "recipients": ["gone.user@example.org"],
                      "status": "5.1.1", "reason": "550 5.1.1 user unknown",
                      "job": {"broadcast_id": 7, "job_id": 101}}]


def test_mbox_and_maildir_messages_are_numbered(parse, tmp_path):
    box = mailbox.mbox(tmp_path / "bounces.mbox")
    for n in range(3):
        box.add(dsn([f"user{n}@example.org"]))
    box.close()
    folder = mailbox.Maildir(tmp_path / "Maildir", create=True)
    folder.add(b"From: someone@example.org\nSubject: Re: Hello\n\nThanks!\n")
    code, lines, _ = parse(tmp_path / "bounces.mbox", tmp_path / "Maildir")
    assert code == 0
    assert [(line["source"], line["kind"], line["recipients"], line["job"]) for line in lines] == [
        (f"{tmp_path / 'bounces.mbox'}#1", "hard", ["user0@example.org"], None),
        (f"{tmp_path / 'bounces.mbox'}#2", "hard", ["user1@example.org"], None),
        (f"{tmp_path / 'bounces.mbox'}#3", "hard", ["user2@example.org"], None),
        (f"{tmp_path / 'Maildir'}#1", "not_bounce", [], None)]
    assert os.listdir(tmp_path / "Maildir" / "new")  # parse is a dry run: nothing is filed


def test_bad_input_gets_a_result_never_a_traceback(parse, tmp_path):
    big = tmp_path / "big.eml"
    with big.open("wb") as file:  # 50 MB, over bounces.max_message_size (10 MiB): not read
        file.write(b"Subject: huge\n\n")
        file.truncate(50 * 1024 * 1024)
    garbage = tmp_path / "garbage.eml"
    garbage.write_bytes(bytes(range(256)) * 400)
    broken = tmp_path / "broken.eml"
    broken.write_bytes(b"Content-Type: multipart/report; report-type=delivery-status; boundary=\"X\"\n"
                       b"Subject: =?utf-8?q?=FF=FE?=\n\n--X\nContent-Type: message/delivery-status\n\n"
                       b"Final-Recipient: rfc822;\nAction: failed\nStatus: 9.9\n\n--X\nContent-Type: text/\xff\n")
    many = tmp_path / "many.eml"
    many.write_bytes(dsn([f"user{n}@example.org" for n in range(10_000)], verp.make_token(SECRET, 1, 2)))
    # The email package parses a header in time and memory growing with the square of its
    # encoded words: unbounded, this 700 KB Subject took 73 s and 17 GB.
    words = tmp_path / "words.eml"
    words.write_text("From: a@b\nSubject: " + " ".join(["=?utf-8?q?a?="] * 50_000) + "\n\nb\n")
    nested = tmp_path / "nested.eml"  # parts inside parts, 3,000 deep: Python's recursion limit
    nested.write_bytes(b"Content-Type: message/rfc822\n\n" * 3000 + b"Subject: deep\n\nhi\n")
    code, lines, _ = parse(big, garbage, broken, many, words, nested)
    assert code == 0
    by_name = {line["source"].rsplit("/", 1)[1]: line for line in lines}
    assert by_name["big.eml"]["kind"] == "not_bounce"
    assert by_name["big.eml"]["reason"] == "not read: larger than bounces.max_message_size (10MiB)"
    assert by_name["garbage.eml"]["kind"] == "not_bounce"
    assert by_name["broken.eml"]["kind"] == "not_bounce" and by_name["broken.eml"]["recipients"] == []
    assert by_name["many.eml"]["kind"] == "hard" and len(by_name["many.eml"]["recipients"]) == 1000
    assert by_name["many.eml"]["job"] == {"broadcast_id": 1, "job_id": 2}
    assert by_name["words.eml"]["kind"] == "not_bounce"
    assert by_name["nested.eml"] == {"source": str(nested), "kind": "not_bounce", "recipients": [], "status": None,
                                     "reason": "unreadable: RecursionError", "job": None}


def test_a_mailbox_url_with_a_bad_port_is_a_config_error(parse, tmp_path, capsys):
    config = tmp_path / "mailbox.yaml"
    config.write_text('bounces: {mailbox: {url: "imap://u@h:99999/INBOX", password: "${PW}"}}\n', encoding="utf-8")
    import os
    os.environ["PW"] = "x"
    try:
        code = main(["bounces", "fetch", "-c", str(config)])
    finally:
        structlog.reset_defaults()
        del os.environ["PW"]
    err = capsys.readouterr().err
    assert code == 2 and "bounces.mailbox.url: 'h:99999' is no host:port" in err and "Traceback" not in err


def test_a_forged_token_names_no_job_and_the_table_says_forged(parse, tmp_path):
    (tmp_path / "forged.eml").write_bytes(dsn(["a@example.org"], verp.make_token("an-attackers-secret-00", 1, 2)))
    code, lines, _ = parse(tmp_path / "forged.eml")
    assert code == 0 and lines[0]["kind"] == "hard" and lines[0]["job"] is None
    code, table, _ = parse(tmp_path / "forged.eml", json_mode=False)
    assert "FORGED" in table and "1 message read" in table


def test_an_unreadable_path_is_named_and_exits_1(parse, tmp_path):
    (tmp_path / "ok.eml").write_bytes(dsn(["a@example.org"]))
    code, lines, err = parse(tmp_path / "nope.eml", tmp_path / "ok.eml")
    assert code == 1 and len(lines) == 1
    assert f"{tmp_path / 'nope.eml'}: no such file or folder" in err


def test_a_server_that_gave_up_on_the_host_is_no_dead_address(parse, tmp_path):
    """Netscape's report of a host that did not answer for two days names the recipient but
    no status: soft (like a DSN's 4.4.7), while the same report of an unknown address is hard."""
    unknown = (Path(__file__).parents[1] / "bounce_samples" / "netscape_report_no_recipient_block.eml").read_text()
    unreachable = unknown.replace(
        "The following destination addresses were unknown (please check\nthe addresses and re-mail the message):",
        "Your message was not delivered because the destination computer was\nnot reachable within the "
        "allowed queue period.\n\nThe following recipients did not receive your message:")
    assert unreachable != unknown
    (tmp_path / "unknown.eml").write_text(unknown)
    (tmp_path / "unreachable.eml").write_text(unreachable)
    _, lines, _ = parse(tmp_path / "unknown.eml", tmp_path / "unreachable.eml")
    assert [(line["kind"], line["recipients"]) for line in lines] == [
        ("hard", ["pat.lee@mail.example.ca"]), ("soft", ["pat.lee@mail.example.ca"])]


@pytest.mark.parametrize("status, expected", [
    ("5.1.1", ("hard", "5.1.1")),
    ("5.1.1 (user unknown)", ("hard", "5.1.1")),
    ("550 No such user", ("hard", "5.0.0")),
    ("452 Too many recipients", ("soft", "4.0.0")),
    ("553 Exceeded maximum inbound message size", ("soft", "5.0.0")),
])
def test_a_status_field_holding_an_smtp_reply_counts_by_its_class(parse, tmp_path, status, expected):
    (tmp_path / "dsn.eml").write_bytes(dsn(["someone@example.org"], status=status).replace(
        b"Diagnostic-Code: smtp; 550 " + status.encode() + b" user unknown\n", b""))
    _, [line], _ = parse(tmp_path / "dsn.eml")
    assert (line["kind"], line["status"]) == expected
