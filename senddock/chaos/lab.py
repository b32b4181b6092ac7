"""The chaos suite's bench: a throw-away Postgres, a relay that can fail, nodes that can be killed.

Everything here runs on this machine and is started by the harness itself: an embedded Postgres
in a temporary folder (never a server the user configured), the in-process aiosmtpd sink, and
real ``senddock run`` processes pointed at the throw-away server by ``SENDDOCK_DATABASE_URL``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import yaml

from senddock.sink import FailRule, Received, Sink

# What an old Sendmail or a misconfigured relay says to everything: a 550 with no enhanced code,
# whose words ("mailbox unavailable") read like a dead recipient but say nothing about one.
GENERIC_550 = "550 Requested action not taken: mailbox unavailable"


def senddock_command(*argv: str) -> list[str]:
    """The real command line, run by this interpreter (the same install as the harness)."""
    return [sys.executable, "-m", "senddock", *argv]


def clean_environ(dsn: str) -> dict[str, str]:
    """This process's environment without any senddock setting of the user's, pointed at ``dsn``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDDOCK_")}
    env["SENDDOCK_DATABASE_URL"] = dsn
    return env


@dataclass(frozen=True)
class Arrival:
    """One message accepted by the relay, and when (monotonic clock of the harness)."""

    at: float
    recipient: str
    message_id: str


class Relay:
    """The sink as a relay that can go away and come back on the same port, or refuse everyone.

    Arrivals are kept here, not in the sink, so that they survive the sink's restarts.
    """

    def __init__(self, *, delay: float) -> None:
        self.delay = delay
        self._arrivals: list[Arrival] = []
        self._lock = threading.Lock()
        self._rules: tuple[FailRule, ...] = ()
        self._sink: Sink | None = None
        self.port = 0

    def _on_message(self, message: Received) -> None:
        arrival = Arrival(time.monotonic(), message.recipients[0].lower(), message.message_id)
        with self._lock:
            self._arrivals.append(arrival)

    def start(self) -> None:
        self._sink = Sink("127.0.0.1", self.port, rules=self._rules, delay=self.delay, on_message=self._on_message)
        self._sink.start()
        self.port = self._sink.port

    def stop(self) -> None:
        """Gone: connections in progress are cut, new ones are refused."""
        if self._sink is not None:
            self._sink.stop()
            self._sink = None

    def refuse_everyone(self, reply: str = GENERIC_550) -> None:
        self._set_rules((FailRule.parse(f"*={reply}"),))

    def accept_everyone(self) -> None:
        self._set_rules(())

    def _set_rules(self, rules: tuple[FailRule, ...]) -> None:
        self._rules = rules
        if self._sink is not None:
            self._sink.handler.rules = rules

    def arrivals(self) -> list[Arrival]:
        with self._lock:
            return list(self._arrivals)

    def first_arrival_after(self, moment: float, among: set[str] | None = None) -> float | None:
        return min((a.at for a in self.arrivals() if a.at > moment and (among is None or a.recipient in among)),
                   default=None)

    def counts(self) -> Counter:
        return Counter(a.recipient for a in self.arrivals())


class Node:
    """One ``senddock run --node NAME``; killed with SIGKILL, it restarts under the same name."""

    def __init__(self, name: str, config_path: Path, dsn: str, log_path: Path) -> None:
        self.name = name
        self._command = senddock_command("run", "-c", str(config_path), "--node", name)
        self._env = clean_environ(dsn)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0  # monotonic time of the current incarnation's Popen
        self.exit_codes: list[int] = []

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self._command, env=self._env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log)
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.exit_codes.append(self.proc.wait())

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (in-flight sends finish), SIGKILL after ``timeout``; the exit status, or None."""
        if self.proc is None or self.proc.returncode is not None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.exit_codes.append(code)
        return code

    def events(self) -> Counter:
        """How often each log event of every incarnation occurred (JSON lines on stderr)."""
        found: Counter = Counter()
        if not self.log_path.exists():
            return found
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                found[json.loads(line).get("event", "?")] += 1
            except ValueError:
                found["(not json)"] += 1
        return found

    def log_tail(self, lines: int = 15) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class Probe:
    """The harness's own look at the database; survives the server's crashes and restarts."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: psycopg.Connection | None = None

    def rows(self, sql: str, params: dict[str, Any] | None = None, *, retry_for: float = 60) -> list[tuple]:
        deadline = time.monotonic() + retry_for
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=2)
                return self._conn.execute(sql, params or {}).fetchall()
            except psycopg.OperationalError:
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def scalar(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        return self.rows(sql, params)[0][0]

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None


def cli_json(dsn: str, config_path: Path, *argv: str, timeout: float = 120) -> tuple[int, dict[str, Any]]:
    """Run a real ``senddock ... --json`` command; its exit status and its one JSON object."""
    proc = subprocess.run(senddock_command(*argv, "-c", str(config_path), "--json"), env=clean_environ(dsn),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        payload = json.loads(lines[-1]) if lines else {}
    except ValueError:
        payload = {}
    if proc.returncode != 0 and not payload:
        payload = {"error": proc.stderr.strip().splitlines()[-1:] or ["no output"]}
    return proc.returncode, payload


def engine_settings(concurrency: int, claim_batch: int | None = None) -> dict[str, int]:
    """The settings for ``concurrency`` sends in flight per node, claiming ``claim_batch`` at a time:
    ``concurrency`` where this install's config schema has it (issue 14's engine), else ``workers``
    (one thread per send before it); ``claim_batch`` only where the schema still has it. So the same
    harness and benchmarks measure before and after the engine changed."""
    from senddock.config import base_schema

    known = base_schema()["properties"]
    settings = {"concurrency" if "concurrency" in known else "workers": concurrency}
    if claim_batch is not None and "claim_batch" in known:
        settings["claim_batch"] = claim_batch
    return settings


def node_settings(smtp_port: int, *, workers: int, breaker: int, kills: int) -> dict[str, Any]:
    """Fast timings (as in senddock.testing.fast_settings) and retries generous enough that a
    relay outage of a few seconds cannot exhaust them: a job failing for that would be a loss the
    harness caused, not the engine.

    For the same reason ``max_rescues`` is above the number of kills. The poison guard fails a job
    in doubt at more than ``max_rescues`` deaths; at the suite's density (a kill per few hundred
    sends, ``concurrency`` in doubt at each) innocent jobs reach that by chance (docs/engine.md,
    "Repeated crashes"), and the suite measures recovery, not the guard
    (test_crash.py tests the guard)."""
    return {
        "smtp": {"host": "127.0.0.1", "port": smtp_port, "timeout": "5s", "security": "none"},
        "transport": {"name": "smtp", "max_consecutive_failures": breaker},
        **engine_settings(workers, claim_batch=5),
        "retry": {"schedule": ["1s", "2s", "4s"], "max_retries": 30, "jitter": 0.1},
        "recovery": {"heartbeat": "200ms", "lease": "3s", "max_rescues": kills + 1},
        "poll_interval": "100ms",
        "shutdown_timeout": "10s",
        "logging": {"level": "info", "format": "json"},
    }


def write_config(folder: Path, settings: dict[str, Any]) -> Path:
    path = folder / "senddock.yaml"
    path.write_text(yaml.safe_dump(settings), encoding="utf-8")
    return path


@contextmanager
def throwaway_postgres() -> Iterator[Any]:
    """A fresh embedded Postgres, stopped and deleted afterwards (an exception or Ctrl-C included)."""
    from senddock.testing import throwaway_server

    with throwaway_server(prefix="senddock-chaos-pg-") as server:
        yield server


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True
