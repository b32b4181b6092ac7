"""Starting a server epoch warns only when jobs were being sent (they are now in doubt): a new
database, the first thing a newcomer runs, must not greet them with "lost the end of its WAL"."""

from __future__ import annotations

from unittest.mock import patch

import psycopg
import structlog
from structlog.testing import capture_logs

from senddock.core import epoch
from senddock.core.epoch import ensure_epoch
from tests_support import make_broadcast


def _fresh_epoch(dsn: str) -> list[dict]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM server_epoch")  # what a crash-restart or a new database leaves
        # A fresh logger: the module's own may have been bound (and cached, as the CLI configures
        # structlog) by an earlier test that ran the CLI in this process.
        with capture_logs() as logs, patch.object(epoch, "log", structlog.get_logger(epoch.__name__)):
            assert ensure_epoch(conn).new
    return [entry for entry in logs if entry["event"] == "server_epoch_started"]


def test_a_new_epoch_with_nothing_in_flight_is_information(database_dsn):
    assert [entry["log_level"] for entry in _fresh_epoch(database_dsn)] == ["info"]


def test_a_new_epoch_while_jobs_were_being_sent_is_a_warning(senddock_app, database_dsn):
    campaign_id = make_broadcast(senddock_app, ["a@example.com"])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE broadcast_jobs SET status = 'sending' WHERE broadcast_id = "
                     "(SELECT broadcast_id FROM campaigns WHERE id = %s)", (campaign_id,))
    [entry] = _fresh_epoch(database_dsn)
    assert entry["log_level"] == "warning" and "in doubt" in entry["meaning"]
