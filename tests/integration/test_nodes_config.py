"""Which config a node runs with: its digest in `senddock nodes`, and its warning when the file changes."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import psycopg
import yaml
from tests_support import register, start_node, still_true, wait_for, write_config

from senddock.loading import load_config
from senddock.config.digest import config_digest, short_digest
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


class _Lines:
    """A running node's stderr, its JSON log lines gathered as they come."""

    def __init__(self, node) -> None:
        self.events: list[dict] = []
        self._thread = threading.Thread(target=self._read, args=(node.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode().strip()
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def named(self, event: str) -> list[dict]:
        return [e for e in self.events if e["event"] == event]

    def join(self) -> None:
        self._thread.join(10)


def test_a_running_node_warns_once_per_change_of_its_config_file(database_dsn, smtp_sink, tmp_path: Path):
    settings = fast_settings(smtp_sink.port)
    config_path = write_config(tmp_path, settings)
    started = _digest(config_path, database_dsn)
    node = start_node(config_path, database_dsn, "watcher")
    lines = _Lines(node)
    try:
        wait_for(lambda: _registered(database_dsn, "watcher"), 30, "the node to register")
        # Nothing changed: nothing said, over many rounds of chores (poll_interval 100ms).
        assert still_true(lambda: not lines.named("config_changed"), 1.0)

        edited = fast_settings(smtp_sink.port, retry={"schedule": ["5s", "1m"]}, concurrency=7)
        _save(config_path, yaml.safe_dump(edited))
        wait_for(lambda: lines.named("config_changed"), 30, "the node to see its config changed")
        changed = lines.named("config_changed")[0]
        assert changed["level"] == "warning" and changed["valid"] is True
        assert changed["restart_needed"] == ["concurrency", "retry.schedule"]
        assert "restart the node to apply it" in changed["meaning"]
        assert changed["running_digest"] == short_digest(started)
        # Said once: rounds of chores later, and a save that changes no setting, say nothing more.
        _save(config_path, yaml.safe_dump(edited) + "# saved again\n")
        assert still_true(lambda: len(lines.named("config_changed")) == 1, 1.0)

        _save(config_path, "retry:\n  schedule: [soon]\n")
        wait_for(lambda: len(lines.named("config_changed")) == 2, 30, "the node to see its config is invalid")
        invalid = lines.named("config_changed")[1]
        assert invalid["valid"] is False and "keeps running with the config it started with" in invalid["meaning"]
        assert any("$.retry.schedule[0]" in e and "'soon' is not a duration" in e for e in invalid["errors"])
        assert still_true(lambda: len(lines.named("config_changed")) == 2, 1.0)
        assert node.poll() is None  # still running, on the config it started with
    finally:
        node.terminate()
        node.wait(60)
        lines.join()
    assert node.returncode == 0


def _digest(path: Path, dsn: str) -> str:
    """The digest of ``path`` as a node started by start_node loads it (its DSN from the environment)."""
    return config_digest(load_config(path, environ={**os.environ, "SENDDOCK_DATABASE_URL": dsn}))


def _save(path: Path, text: str) -> None:
    """As an editor saves: whole, by renaming (a node never reads it half written)."""
    part = path.with_suffix(".part")
    part.write_text(text, encoding="utf-8")
    part.replace(path)
