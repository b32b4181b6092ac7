"""The dashboard's account: hash-password, the config check of the hash, session cookies and the
login throttle (no database, no server)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from senddock.loading import load_config
from senddock.errors import ConfigError
from senddock.passwords import is_password_hash, verify_password
from senddock.web.dashboard.sessions import SessionCookies, tokens_match
from senddock.web.dashboard.throttle import LoginThrottle
from tests_support import senddock_executable


def hash_password(stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run([senddock_executable(), "admin", "hash-password"], input=stdin, capture_output=True,
                          text=True, timeout=60)


def test_hash_password_prints_one_argon2id_line_that_verifies():
    proc = hash_password("correct horse\n")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("$argon2id$v=19$")
    assert is_password_hash(lines[0])
    assert verify_password(lines[0], "correct horse")  # the line end `echo` adds is not the password's
    assert not verify_password(lines[0], "correct horse\n") and not verify_password(lines[0], "wrong")


def test_hash_password_refuses_empty_input_with_exit_2():
    proc = hash_password("")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "no password on standard input" in proc.stderr


def write(tmp_path: Path, admin: str) -> Path:
    path = tmp_path / "senddock.yaml"
    path.write_text("logging: {level: warning}\nserve:\n  admin:\n" + admin, encoding="utf-8")
    return path


def test_a_password_hash_that_is_not_one_is_refused_by_path_without_showing_it(tmp_path: Path):
    path = write(tmp_path, "    username: admin\n    password_hash: ${HASH}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={"HASH": "hunter2-plain-text"})
    assert "$.serve.admin.password_hash: is not an argon2 password hash" in str(caught.value)
    assert "senddock admin hash-password" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_a_password_hash_written_in_the_file_is_refused_as_a_secret(tmp_path: Path):
    good = hash_password("pw\n").stdout.strip()
    path = write(tmp_path, f"    username: admin\n    password_hash: '{good}'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert ("$.serve.admin.password_hash: secrets must not be written in the file: use "
            "${SENDDOCK_ADMIN_PASSWORD_HASH}") in str(caught.value)
    assert good not in str(caught.value)


def test_a_good_hash_loads_with_defaults_and_is_masked(tmp_path: Path):
    good = hash_password("pw\n").stdout.strip()
    path = write(tmp_path, "    username: admin\n    password_hash: ${HASH}\n")
    config = load_config(path, environ={"HASH": good})
    admin = config.section("serve")["admin"]
    assert admin["password_hash"] == good and admin["session_lifetime"] == "8h"
    assert config.redacted()["serve"]["admin"]["password_hash"] == "***"
    assert good not in str(config.redacted())


def test_without_admin_there_is_no_account(tmp_path: Path):
    path = tmp_path / "senddock.yaml"
    path.write_text("logging: {level: warning}\n", encoding="utf-8")
    assert load_config(path, environ={}).section("serve")["admin"] is None


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_cookie_round_trips_and_refuses_tampering_expiry_and_logout():
    clock = Clock()
    cookies = SessionCookies(password_hash="$argon2id$h", secret=None, lifetime=60, clock=clock)
    session = cookies.new("admin")
    value = cookies.dumps(session)
    assert cookies.loads(value) == session
    payload, signature = value.split(".")
    forged = cookies.dumps(cookies.new("admin")).split(".")[0]
    assert cookies.loads(f"{forged}.{signature}") is None  # another payload under this signature
    assert cookies.loads(value[:-2] + ("AA" if not value.endswith("AA") else "BB")) is None
    assert cookies.loads("") is None and cookies.loads("x.y") is None and cookies.loads(None) is None
    other_key = SessionCookies(password_hash="$argon2id$h", secret=None, lifetime=60, clock=clock)
    assert other_key.loads(value) is None  # a random key per process without a secret
    clock.now += 61
    assert cookies.loads(value) is None  # expired
    clock.now -= 61
    cookies.revoke(session)
    assert cookies.loads(value) is None  # logged out


def test_a_shared_secret_lets_processes_share_sessions_until_the_password_changes():
    secret = "s" * 40
    one = SessionCookies(password_hash="$argon2id$h1", secret=secret, lifetime=60)
    two = SessionCookies(password_hash="$argon2id$h1", secret=secret, lifetime=60)
    changed = SessionCookies(password_hash="$argon2id$h2", secret=secret, lifetime=60)
    value = one.dumps(one.new("admin"))
    assert two.loads(value) is not None
    assert changed.loads(value) is None


def test_tokens_match_in_constant_time_and_refuse_missing_ones():
    assert tokens_match("abc", "abc")
    assert not tokens_match("abd", "abc") and not tokens_match(None, "abc") and not tokens_match("", "abc")


def test_the_throttle_refuses_after_five_failures_per_client_until_the_window_passes():
    clock = Clock()
    throttle = LoginThrottle(per_client=5, per_user=20, window=300, clock=clock)
    for _ in range(5):
        assert throttle.reserve("10.0.0.1", "admin")[0] == 0  # each attempt counted before its check
    assert throttle.reserve("10.0.0.1", "admin")[0] == pytest.approx(300)
    wait, mark = throttle.reserve("10.0.0.2", "admin")  # another address may still try...
    assert wait == 0
    throttle.succeeded("10.0.0.2", "admin", mark)  # ...and a right password is no failure
    clock.now += 301
    assert throttle.reserve("10.0.0.1", "admin")[0] == 0


def test_the_throttle_caps_one_user_name_across_addresses():
    clock = Clock()
    throttle = LoginThrottle(per_client=5, per_user=20, window=300, clock=clock)
    for i in range(20):
        throttle.reserve(f"10.0.0.{i}", "admin")
    assert throttle.reserve("10.9.9.9", "admin")[0] > 0
    assert throttle.reserve("10.9.9.9", "someone")[0] == 0


def test_attempts_arriving_at_once_are_counted_before_any_is_checked():
    """40 tries at once from one address against a limit of 5: 5 are checked, 35 refused."""
    import threading

    throttle = LoginThrottle(per_client=5, per_user=20, window=300)
    barrier, allowed = threading.Barrier(40), []

    def attempt() -> None:
        barrier.wait()
        wait, _ = throttle.reserve("10.0.0.1", "admin")
        allowed.append(wait == 0)

    threads = [threading.Thread(target=attempt) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert allowed.count(True) == 5


def test_on_a_terminal_the_password_is_asked_twice_and_never_echoed():
    import pexpect

    child = pexpect.spawn(senddock_executable(), ["admin", "hash-password"], encoding="utf-8", timeout=60)
    child.expect("password: ")
    child.sendline("typed secret")
    child.expect("again: ")
    child.sendline("typed secret")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "typed secret" not in child.before
    printed = child.before.strip().splitlines()[-1]
    assert verify_password(printed, "typed secret")


def test_on_a_terminal_two_different_passwords_print_nothing():
    import pexpect

    child = pexpect.spawn(senddock_executable(), ["admin", "hash-password"], encoding="utf-8", timeout=60)
    child.expect("password: ")
    child.sendline("one")
    child.expect("again: ")
    child.sendline("two")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2
    assert "the two passwords differ" in child.before and "$argon2" not in child.before
