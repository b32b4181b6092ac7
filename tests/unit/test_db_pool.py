"""The pool's attempts to reconnect: prompt, and on the psycopg_pool method they override."""

from __future__ import annotations

import inspect

from psycopg_pool import ConnectionPool

from senddock.store.db import _PromptAttempt, _PromptPool


def test_the_pool_tries_again_after_a_tenth_of_a_second_doubling_to_one():
    attempt = _PromptAttempt(timeout=300)
    delays = []
    for _ in range(7):
        attempt.update_delay(now=0.0)
        delays.append(attempt.delay)
    assert 0.09 <= delays[0] <= 0.11  # psycopg_pool's own jitter of 10%
    assert delays[1:4] == [delays[0] * 2 ** n for n in range(1, 4)]
    assert delays[4:] == [1.0, 1.0, 1.0]


def test_the_overridden_method_is_still_psycopg_pools():
    """_PromptPool overrides a private method of psycopg_pool: an upgrade that renames it must fail here."""
    assert list(inspect.signature(ConnectionPool._add_connection).parameters) == ["self", "attempt", "growing"]
    assert _PromptPool._add_connection is not ConnectionPool._add_connection
