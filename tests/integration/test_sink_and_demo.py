from __future__ import annotations

import json
import signal
import smtplib
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from senddock.sink import free_port
from tests_support import senddock_executable


def test_sink_command_accepts_saves_and_fails_chosen_recipients(tmp_path: Path):
    port = free_port("127.0.0.1")
    sink = subprocess.Popen(
        [senddock_executable(), "sink", "--port", str(port), "--save", str(tmp_path / "mail"),
         "--fail", "bounce*@*=550 5.1.1 no such user", "--fail", "later*@*=451 4.7.1 try again"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client = smtplib.SMTP("127.0.0.1", port, timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "the sink did not start"
                time.sleep(0.1)
        with client:
            client.sendmail("me@example.com", ["ok@example.com"],
                            b"Subject: hi\r\nMessage-ID: <m1@example.com>\r\n\r\nhello\r\n")
            refused = None
            try:
                client.sendmail("me@example.com", ["bounce1@example.com"], b"Subject: x\r\n\r\nx\r\n")
            except smtplib.SMTPRecipientsRefused as exc:
                refused = exc.recipients
            assert refused == {"bounce1@example.com": (550, b"5.1.1 no such user")}
            code, _ = client.mail("me@example.com")
            assert client.rcpt("later2@example.com")[0] == 451
            client.rset()
    finally:
        sink.send_signal(signal.SIGTERM)
        stdout, stderr = sink.communicate(timeout=30)
    assert sink.returncode == 0, stderr
    # Each line starts with the time the message was accepted (UTC, ms): bench/paced_nodes.py reads rates from it.
    line = next(line for line in stdout.splitlines() if "ok@example.com" in line)
    at, rest = line.split("  ", 1)
    assert rest == "ok@example.com  <m1@example.com>  hi"
    assert abs(datetime.fromisoformat(at).timestamp() - time.time()) < 60 and at.endswith("+00:00"), at
    assert "received 1 message\n" in stdout
    saved = list((tmp_path / "mail").glob("*.eml"))
    assert len(saved) == 1 and b"hello" in saved[0].read_bytes()


@pytest.mark.parametrize("rule, message", [
    ("nonsense", "--fail 'nonsense': expected PATTERN=REPLY, e.g. 'bounce*@*=550 5.1.1 no such user'"),
    # The form is right: say what is wrong with the part that is not.
    ("x=abc", "--fail 'x=abc': 'abc' is not an SMTP reply: start with a 3-digit code, e.g. 550 5.1.1 no such user"),
    ("x=550no", "--fail 'x=550no': '550no' is not an SMTP reply: start with a 3-digit code, e.g. 550 5.1.1 no such user"),
    ("x=650 no", "--fail 'x=650 no': '650 no' is not an SMTP reply: its code 650 must start with 2 (accept), "
                 "4 (try later) or 5 (refuse), e.g. 550 5.1.1 no such user"),
    ("x=", "--fail 'x=': the REPLY after '=' is empty: start with a 3-digit code, e.g. 550 5.1.1 no such user"),
    ("=550 gone", "--fail '=550 gone': the PATTERN before '=' is empty: name the recipients it is for, "
                  "e.g. 'bounce*@*=550 5.1.1 no such user' ('*' for everyone)"),
])
def test_sink_refuses_a_malformed_rule_saying_what_is_wrong(rule, message):
    result = subprocess.run([senddock_executable(), "sink", "--fail", rule], capture_output=True, text=True,
                            timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"senddock: error: {message}\n")
    as_json = subprocess.run([senddock_executable(), "sink", "--fail", rule, "--json"], capture_output=True,
                             text=True, timeout=30)
    assert as_json.returncode == 2 and "Traceback" not in as_json.stderr
    assert json.loads(as_json.stdout) == {"ok": False, "error": message, "exit_code": 2}


def test_demo_and_demo_crash_send_everything_once_or_accounted_for():
    for argv in (["demo", "--json"], ["demo", "--crash", "--json"]):
        result = subprocess.run([senddock_executable(), *argv], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        summary = json.loads(result.stdout)
        assert (summary["status"], summary["sent"], summary["bounced"], summary["suppressed"]) == ("finished", 995, 5, 5)
        assert summary["retried"] == 10
        assert summary["duplicates"] == summary["duplicates_explained_by_in_doubt"]
        assert summary["received_by_smtp_server"] == 995 + summary["duplicates"]
