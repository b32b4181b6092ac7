"""Shared by the benchmarks: a scratch database, a filled list, a loaded config."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg
import yaml

from senddock.api import Senddock
from senddock.config import Config, load_config
from senddock.core.db import Database, embedded_server, stop_embedded
from senddock.testing import create_database, drop_database, migrate_database

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))  # senddock_bench_plugins


@contextmanager
def scratch_database(admin_dsn: str | None) -> Iterator[str]:
    """A fresh, migrated database on ``admin_dsn``'s server, or on a throw-away embedded Postgres."""
    with tempfile.TemporaryDirectory(prefix="senddock-bench-") as folder:
        server = None
        if admin_dsn is None:
            server = embedded_server(Path(folder) / "pgdata")
            admin_dsn = server.get_uri()
        name = f"senddock_bench_{uuid.uuid4().hex[:8]}"
        dsn = create_database(admin_dsn, name)
        try:
            migrate_database(dsn)
            yield dsn
        finally:
            drop_database(admin_dsn, name)
            if server is not None:
                stop_embedded(server)


def bench_config(dsn: str, folder: Path, settings: dict[str, Any]) -> Config:
    path = folder / "senddock.yaml"
    path.write_text(yaml.safe_dump({"logging": {"level": "warning"}, **settings}), encoding="utf-8")
    return load_config(path, environ={**os.environ, "SENDDOCK_DATABASE_URL": dsn})


def open_app(config: Config, dsn: str) -> Senddock:
    return Senddock(config, database=Database(config.database, dsn=dsn))


def fill_list(dsn: str, size: int, list_name: str = "bench") -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE broadcast_jobs, delivery_attempts, list_members, campaign_lists, lists, subscribers, "
                     "suppressions, broadcasts, campaigns RESTART IDENTITY CASCADE")
        list_id = conn.execute("INSERT INTO lists (name) VALUES (%s) RETURNING id", (list_name,)).fetchone()[0]
        conn.execute("INSERT INTO subscribers (email, name, attributes) "
                     "SELECT 'user' || i || '@example' || (i %% 50) || '.com', 'User ' || i, "
                     "jsonb_build_object('city', 'Zürich', 'uid', i) FROM generate_series(1, %s) i", (size,))
        conn.execute("INSERT INTO list_members (list_id, subscriber_id) SELECT %s, id FROM subscribers", (list_id,))
        conn.execute("VACUUM ANALYZE subscribers")


def enqueue(app: Senddock, list_name: str = "bench", *, html: str | None = None,
            subject: str = "Hi") -> tuple[int, int]:
    """A new campaign on the list (a one-word text, or ``html``), sent: (campaign id, broadcast id)."""
    campaign_id = app.create_campaign(name=f"bench {uuid.uuid4().hex[:6]}", lists=[list_name], subject=subject,
                                      from_addr="bench@example.com", text_body=None if html else "Hello",
                                      html_body=html)
    return campaign_id, app.send_campaign(campaign_id).broadcast_id


def reset_jobs(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The claim floors too: broadcast ids start again at 1, and an old floor would hide new jobs.
        conn.execute("TRUNCATE broadcast_jobs, delivery_attempts, broadcasts, campaign_lists, campaigns, pending_bounces, "
                     "nodes, claim_floors, claim_putbacks RESTART IDENTITY CASCADE")
        conn.execute("VACUUM ANALYZE")


def machine_cpu() -> float:
    """Busy CPU seconds of the whole machine (Postgres and any in-process server included)."""
    times = psutil.cpu_times()
    return times.user + times.system + getattr(times, "softirq", 0) + getattr(times, "irq", 0)


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every benchmark shares: where its scratch database goes."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="administrative DSN of the server to create the scratch database on")
    parser.add_argument("--embedded", action="store_true", help="use a throw-away embedded Postgres instead")
    return parser


def admin_dsn(args: argparse.Namespace) -> str | None:
    """--dsn, or None for a throw-away embedded Postgres (what scratch_database expects)."""
    return None if args.embedded else args.dsn
