from __future__ import annotations

import json
import signal
import smtplib
import subprocess
import time
from pathlib import Path

from senddock.sink import _free_port
from tests_support import senddock_executable


def test_sink_command_accepts_saves_and_fails_chosen_recipients(tmp_path: Path):
    port = _free_port("127.0.0.1")
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
    assert "ok@example.com  <m1@example.com>  hi" in stdout
    assert "received 1 message\n" in stdout
    saved = list((tmp_path / "mail").glob("*.eml"))
    assert len(saved) == 1 and b"hello" in saved[0].read_bytes()


def test_sink_refuses_a_malformed_rule():
    result = subprocess.run([senddock_executable(), "sink", "--fail", "nonsense"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2
    assert "expected PATTERN=REPLY" in result.stderr


def test_demo_and_demo_crash_send_everything_once_or_accounted_for():
    for argv in (["demo", "--json"], ["demo", "--crash", "--json"]):
        result = subprocess.run([senddock_executable(), *argv], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        summary = json.loads(result.stdout)
        assert (summary["status"], summary["sent"], summary["bounced"], summary["suppressed"]) == ("finished", 995, 5, 5)
        assert summary["retried"] == 10
        assert summary["duplicates"] == summary["duplicates_explained_by_in_doubt"]
        assert summary["received_by_smtp_server"] == 995 + summary["duplicates"]
