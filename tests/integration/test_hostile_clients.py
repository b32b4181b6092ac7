"""Hostile clients against `senddock serve` and `senddock bounces receive` (issue 33 §2, §3): logins
raced or sent at once, forwarded headers from anyone, one client holding every connection."""

from __future__ import annotations

import concurrent.futures
import http.client
import os
import smtplib
import socket
import subprocess
import time
from pathlib import Path

import pytest
from dashboard_support import PASSWORD, USER, Client, csrf_of, serving
from tests_support import senddock_executable, wait_for

from senddock.bounces.receiver import BounceReceiver, ReceiveSettings
from senddock.testing import fast_settings

OTHER_CLIENT = "127.0.0.2"  # loopback too: another client address for the servers under test


def peak_memory_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_forty_wrong_passwords_at_once_are_checked_five_times_at_most_two_at_a_time(database_dsn, tmp_path):
    with serving(fast_settings(2525), database_dsn, tmp_path) as served:
        clients = [Client(served.url) for _ in range(40)]
        forms = [(client, csrf_of(client.get("/dashboard/login").body)) for client in clients]
        before = peak_memory_kib(served.process.pid)

        def attempt(pair) -> int:
            client, token = pair
            return client.post("/dashboard/login", {"csrf_token": token, "username": USER,
                                                    "password": "wrong password"}).status

        with concurrent.futures.ThreadPoolExecutor(max_workers=40) as pool:
            statuses = list(pool.map(attempt, forms))
        grown_mib = (peak_memory_kib(served.process.pid) - before) / 1024
        # At most five were checked (401), two at a time; the others refused before any check:
        # beyond the two checks running, told to try again in a moment (503), and past the five
        # failures counted ahead of their checks, throttled (429). All forty were, before.
        checked = statuses.count(401)
        assert 1 <= checked <= 5 and checked + statuses.count(429) + statuses.count(503) == 40, statuses
        served.logged("dashboard_login_failed", checked)
        # argon2 takes 64 MiB a check: two at once, never forty (it grew 2.1-2.6 GiB before).
        assert grown_mib < 300, grown_mib


def test_forwarded_headers_are_believed_from_the_configured_proxies_only(database_dsn, tmp_path):
    def five_failures_then(client_ips: list[str], settings: dict) -> int:
        """The status of a right password after five wrong ones, each claiming another address."""
        with serving(settings, database_dsn, tmp_path) as served:
            for ip in client_ips:
                client = Client(served.url)
                token = csrf_of(client.get("/dashboard/login").body)
                client.post("/dashboard/login", {"csrf_token": token, "username": USER, "password": "wrong"},
                            {"X-Forwarded-For": ip})
            client = Client(served.url)
            token = csrf_of(client.get("/dashboard/login").body)
            return client.post("/dashboard/login", {"csrf_token": token, "username": USER, "password": PASSWORD},
                               {"X-Forwarded-For": "192.0.2.200"}).status

    addresses = [f"192.0.2.{i}" for i in range(1, 6)]
    # No proxy configured: every client is the address it connects from, whatever it claims.
    assert five_failures_then(addresses, fast_settings(2525)) == 429
    # Behind a proxy on 127.0.0.1 that says who its clients are: five other addresses failed.
    assert five_failures_then(addresses, fast_settings(2525, serve={"trusted_proxies": ["127.0.0.1/32"]})) == 303


def get_from(port: int, source: str, path: str = "/healthz") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def test_one_client_holding_its_connections_closes_the_door_to_nobody_else(database_dsn, tmp_path):
    settings = fast_settings(2525, serve={"max_connections": 30, "max_connections_per_client": 10,
                                          "header_timeout": "30s"})
    with serving(settings, database_dsn, tmp_path, admin=False) as served:
        silent = []
        try:
            for _ in range(40):  # silent connections, as a client holding the door would open them
                silent.append(socket.create_connection(("127.0.0.1", served.port)))
            time.sleep(0.3)
            # Its own next request is refused; another client is answered, /healthz included.
            assert get_from(served.port, "127.0.0.1") == 503
            assert [get_from(served.port, OTHER_CLIENT) for _ in range(5)] == [200] * 5
            answered = sum(1 for s in silent if _closed_at_once(s))
            assert answered == 30  # everything past its ten was refused at once
        finally:
            for s in silent:
                s.close()
        served.logged("connection_refused", 31)


def _closed_at_once(sock: socket.socket) -> bool:
    sock.settimeout(0.5)
    try:
        return sock.recv(64).startswith(b"HTTP/1.1 503")
    except TimeoutError:
        return False  # held open, as the ten it was allowed


def _smtp_from(port: int, source: str) -> smtplib.SMTP:
    return smtplib.SMTP("127.0.0.1", port, timeout=10, source_address=(source, 0))


def test_one_smtp_client_cannot_hold_every_session_nor_send_unbounded_recipients_nor_stay_for_ever():
    settings = ReceiveSettings("127.0.0.1", 0, ("bounces+*@example.com",), 1 << 20, max_connections=5,
                               max_sessions_per_client=2, session_lifetime=1.5, max_recipients=3)
    server = BounceReceiver(settings, lambda raw, origin, recipients: None).start()
    try:
        held = [_smtp_from(server.port, "127.0.0.1") for _ in range(2)]
        with pytest.raises(smtplib.SMTPConnectError) as refused:
            _smtp_from(server.port, "127.0.0.1")
        assert refused.value.smtp_code == 421
        with _smtp_from(server.port, OTHER_CLIENT) as other:  # another client gets in
            assert other.noop()[0] == 250
        # RCPTs a session may give: three, then 452.
        client = held[0]
        client.ehlo()
        client.mail("")
        codes = [client.rcpt(f"bounces+{i}@example.com")[0] for i in range(5)]
        assert codes == [250, 250, 250, 452, 452]
        # However busy it keeps itself, a session ends at its lifetime.
        deadline = time.monotonic() + 10
        with pytest.raises(smtplib.SMTPServerDisconnected):
            while time.monotonic() < deadline:
                held[1].noop()
                time.sleep(0.2)
    finally:
        server.stop()


def test_a_bounces_receive_process_takes_the_limits_from_its_config(make_config, database_dsn):
    """The same limits from bounces.receive in a real `senddock bounces receive`."""
    from senddock.sink import free_port

    port = free_port("127.0.0.1")
    config = make_config(fast_settings(2525, bounces={"receive": {
        "listen": f"127.0.0.1:{port}", "addresses": ["bounces+*@example.com"], "max_sessions_per_client": 1}}))
    env = {**os.environ, "SENDDOCK_DATABASE_URL": database_dsn}
    process = subprocess.Popen([senddock_executable(), "bounces", "receive", "-c", str(config.path)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _listening(port), 30, "bounces receive")
        first: list[smtplib.SMTP] = []
        # Its one session, once the probe above has been let go (the server counts its end).
        wait_for(lambda: _took(first, port), 10, "a session of this client's")
        with first[0]:
            with pytest.raises(smtplib.SMTPConnectError):
                _smtp_from(port, "127.0.0.1")
            with _smtp_from(port, OTHER_CLIENT) as other:
                assert other.noop()[0] == 250
    finally:
        process.terminate()
        process.communicate(timeout=30)


def _took(sessions: list, port: int) -> bool:
    try:
        sessions.append(_smtp_from(port, "127.0.0.1"))
        return True
    except smtplib.SMTPConnectError:
        return False


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False
