from __future__ import annotations

import json
import signal
import smtplib
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pytest
import structlog

from senddock.cli import main
from senddock.sink import free_port
from tests_support import senddock_executable


@contextmanager
def sink_process(argv: list[str], port: int, **popen) -> Iterator[dict]:
    """`senddock sink ARGV` as a process of its own, once it answers on ``port``; stopped with
    SIGTERM at the end of the block (its exit code and output then in the dict yielded)."""
    sink = subprocess.Popen([senddock_executable(), "sink", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)
    ended: dict = {}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                smtplib.SMTP("127.0.0.1", port, timeout=5).quit()
                break
            except OSError:
                assert sink.poll() is None and time.monotonic() < deadline, "the sink did not start"
                time.sleep(0.1)
        yield ended
    finally:
        sink.send_signal(signal.SIGTERM)
        ended["stdout"], ended["stderr"] = sink.communicate(timeout=30)
        ended["code"] = sink.returncode


def test_sink_command_accepts_saves_and_fails_chosen_recipients(tmp_path: Path):
    port = free_port("127.0.0.1")
    argv = ["--port", str(port), "--save", str(tmp_path / "mail"),
            "--fail", "bounce*@*=550 5.1.1 no such user", "--fail", "later*@*=451 4.7.1 try again",
            "--fail", "busy*@* x2=450 4.2.0 mailbox busy"]
    with sink_process(argv, port) as ended, smtplib.SMTP("127.0.0.1", port, timeout=5) as client:
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
        # xN: each address its first N times, then accepted.
        assert [client.rcpt("busy1@example.com")[0] for _ in range(3)] == [450, 450, 250]
        assert client.rcpt("busy2@example.com")[0] == 450
        client.rset()
    stdout, stderr = ended["stdout"], ended["stderr"]
    assert ended["code"] == 0, stderr
    # Each line starts with the time the message was accepted (UTC, ms): bench/paced_nodes.py reads rates from it.
    line = next(line for line in stdout.splitlines() if "ok@example.com" in line)
    at, rest = line.split("  ", 1)
    assert rest == "ok@example.com  <m1@example.com>  hi"
    assert abs(datetime.fromisoformat(at).timestamp() - time.time()) < 60 and at.endswith("+00:00"), at
    assert "received 1 message\n" in stdout
    saved = list((tmp_path / "mail").glob("*.eml"))
    assert len(saved) == 1 and b"hello" in saved[0].read_bytes()


def test_the_sink_listens_where_the_configs_nodes_send(tmp_path: Path):
    """Without --port, the sink takes the config's smtp.port (it listened on 1025 whatever the
    config said, and the nodes' sends all failed)."""
    port = free_port("127.0.0.1")
    (tmp_path / "senddock.yaml").write_text(f"smtp: {{port: {port}}}\n", encoding="utf-8")
    with sink_process(["-c", str(tmp_path / "senddock.yaml")], port) as ended:
        pass
    assert ended["code"] == 0 and f"listening on 127.0.0.1:{port} " in ended["stderr"], ended["stderr"]
    taken = free_port("127.0.0.1")
    with socket.create_server(("127.0.0.1", taken)):
        (tmp_path / "taken.yaml").write_text(f"smtp: {{port: {taken}}}\n", encoding="utf-8")
        busy = subprocess.run([senddock_executable(), "sink", "-c", str(tmp_path / "taken.yaml")],
                              capture_output=True, text=True, timeout=30)
    assert busy.returncode == 2 and f"cannot listen on 127.0.0.1:{taken} (smtp.port): " in busy.stderr, busy.stderr


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
    ("a@b x0=450 busy", "--fail 'a@b x0=450 busy': 'x0' is not a count: write xN with N at least 1, "
                        "e.g. 'later*@* x2=450 4.2.0 mailbox busy'"),
])
def test_sink_refuses_a_malformed_rule_saying_what_is_wrong(rule, message, capsys):
    # In this process: the console script's own exit path is the next test's.
    for argv, expected in ((["sink", "--fail", rule], ("", f"senddock: error: {message}\n")),
                           (["sink", "--fail", rule, "--json"], None)):
        try:
            code = main(argv)
        finally:
            structlog.reset_defaults()
        out, err = capsys.readouterr()
        assert code == 2 and "Traceback" not in err
        if expected:
            assert (out, err) == expected
        else:
            assert json.loads(out) == {"ok": False, "error": message, "exit_code": 2}


def test_a_malformed_rule_is_refused_by_the_console_script_too():
    result = subprocess.run([senddock_executable(), "sink", "--fail", "x=abc"], capture_output=True, text=True,
                            timeout=30)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("senddock: error: --fail 'x=abc': 'abc' is not an SMTP reply: start with a 3-digit "
                             "code, e.g. 550 5.1.1 no such user\n")


def test_demo_and_demo_crash_send_everything_once_or_accounted_for():
    for argv in (["demo", "--json"], ["demo", "--crash", "--json"]):
        result = subprocess.run([senddock_executable(), *argv], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        summary = json.loads(result.stdout)
        assert (summary["status"], summary["sent"], summary["bounced"], summary["suppressed"]) == ("finished", 995, 5, 5)
        assert summary["retried"] == 10
        assert summary["duplicates"] == summary["duplicates_explained_by_in_doubt"]
        assert summary["received_by_smtp_server"] == 995 + summary["duplicates"]
