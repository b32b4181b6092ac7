"""Database.pool: created once however many threads ask for it first, and never left half open."""

from __future__ import annotations

import threading

import pytest

from senddock.store import db as db_module
from senddock.store.db import Database, _PromptPool
from senddock.errors import DatabaseError
from senddock.testing import with_database

THREADS = 8


class _CountingPool(_PromptPool):
    """senddock's real pool that records every pool made, opened and closed."""

    made: list[_CountingPool] = []
    lock = threading.Lock()

    def __init__(self, *args, **kwargs):
        with self.lock:
            self.made.append(self)
        self.opened = self.closed_by_us = False
        super().__init__(*args, **kwargs)

    def open(self, *args, **kwargs):
        super().open(*args, **kwargs)
        self.opened = True

    def close(self, *args, **kwargs):
        self.closed_by_us = True
        super().close(*args, **kwargs)


@pytest.fixture
def counting_pool(monkeypatch):
    monkeypatch.setattr(_CountingPool, "made", [])
    monkeypatch.setattr(db_module, "_PromptPool", _CountingPool)
    return _CountingPool


def _all_at_once(target) -> list:
    """Run ``target`` in THREADS threads released together; what each returned or raised."""
    barrier = threading.Barrier(THREADS)
    results: list = [None] * THREADS

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _select_one(db: Database):
    with db.connection() as conn:
        return conn.execute("SELECT 1").fetchone()


def test_concurrent_first_requests_make_one_pool(make_config, counting_pool):
    db = Database(make_config().database)
    try:
        pools = _all_at_once(lambda: db.pool)
        assert all(isinstance(p, _PromptPool) for p in pools), pools
        assert len({id(p) for p in pools}) == 1
        assert len(counting_pool.made) == 1 and counting_pool.made[0].opened
        # ...and each thread can use it at once (it was open before any thread got it).
        assert _all_at_once(lambda: _select_one(db)) == [(1,)] * THREADS
    finally:
        db.close()
    assert counting_pool.made[0].closed


def test_a_failed_creation_reports_the_servers_reason_and_leaves_no_pool(make_config, database_dsn, counting_pool):
    db = Database(make_config().database, dsn=with_database(database_dsn, "no_such_database"))
    failures = _all_at_once(lambda: db.pool)
    assert all(isinstance(f, DatabaseError) for f in failures), failures
    assert all('database "no_such_database" does not exist' in str(f) for f in failures)
    assert db._pool is None
    assert all(p.closed for p in counting_pool.made)


def test_a_pool_that_cannot_open_is_closed_and_the_next_request_tries_again(make_config, counting_pool, monkeypatch):
    db = Database(make_config({"database": {"connect_timeout": "1s"}}).database)

    def never_opens(self, *args, **kwargs):
        raise TimeoutError("pool initialization incomplete after 1.0 sec")

    with monkeypatch.context() as m:
        m.setattr(_CountingPool, "open", never_opens)
        with pytest.raises(DatabaseError, match="cannot connect to the database .*pool initialization incomplete"):
            db.pool
    assert db._pool is None and counting_pool.made[0].closed
    try:
        assert db.pool is counting_pool.made[1] and _select_one(db) == (1,)
    finally:
        db.close()
