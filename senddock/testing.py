"""pytest helpers for senddock and its plugin authors: a real Postgres, one fresh database per test.

Enable with ``pytest_plugins = ["senddock.testing"]`` in a ``conftest.py``. The server is the one in
``SENDDOCK_TEST_DSN`` when set; otherwise an embedded Postgres is started for the test session. Each
test gets its own database, created from a template that has senddock's schema already migrated
(``CREATE DATABASE ... TEMPLATE``: fast, and tests cannot see each other's rows).

Fixtures: ``postgres_server_dsn`` (session), ``database_dsn``, ``make_config``, ``senddock_app``.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
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
    from senddock.core.db import embedded_server

    with tempfile.TemporaryDirectory(prefix="senddock-test-pg-") as folder:
        server = embedded_server(Path(folder) / "pgdata")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


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

