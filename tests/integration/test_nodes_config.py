"""Which config a node runs with: its digest in `senddock nodes`."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import yaml
from tests_support import register, start_node, wait_for, write_config

from senddock.config import load_config
from senddock.config_digest import config_digest, short_digest
from senddock.testing import fast_settings


def _registered(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM nodes WHERE name = %s AND stopped_at IS NULL",
                            (name,)).fetchone()[0] == 1


def _stop(node) -> str:
    node.terminate()
    _, stderr = node.communicate(timeout=60)
    assert node.returncode == 0, stderr.decode()[-2000:]
    return stderr.decode()


def test_nodes_shows_each_nodes_config_digest_and_whether_it_is_the_files(cli, database_dsn, smtp_sink,
                                                                          tmp_path: Path):
    settings = fast_settings(smtp_sink.port)
    config_path = write_config(tmp_path, settings)
    other_path = tmp_path / "other.yaml"
    other_path.write_text(yaml.safe_dump(fast_settings(smtp_sink.port, retry={"schedule": ["1m"]})), encoding="utf-8")
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        register(conn, "before")  # a node of a senddock that recorded no digest
    node = start_node(config_path, database_dsn, "east")
    try:
        wait_for(lambda: _registered(database_dsn, "east"), 30, "the node to register")
        digest = _digest(config_path, database_dsn)
        assert _digest(other_path, database_dsn) != digest

        same = {r["name"]: r for r in cli("nodes", "-c", config_path, "--json").json["nodes"]}
        assert (same["east"]["config_digest"], same["east"]["config_matches"]) == (digest, True)
        assert (same["before"]["config_digest"], same["before"]["config_matches"]) == (None, None)
        table = cli("nodes", "-c", config_path).stdout
        assert table.splitlines()[0].split()[-1] == "CONFIG"
        assert short_digest(digest) in table and digest not in table and "differs" not in table

        other = {r["name"]: r for r in cli("nodes", "-c", other_path, "--json").json["nodes"]}
        assert (other["east"]["config_digest"], other["east"]["config_matches"]) == (digest, False)
        assert other["before"]["config_matches"] is None
        east_line = next(line for line in cli("nodes", "-c", other_path).stdout.splitlines() if "east" in line)
        assert f"{short_digest(digest)} (differs)" in east_line
    finally:
        _stop(node)


def _digest(path: Path, dsn: str) -> str:
    """The digest of ``path`` as a node started by start_node loads it (its DSN from the environment)."""
    return config_digest(load_config(path, environ={**os.environ, "SENDDOCK_DATABASE_URL": dsn}))
