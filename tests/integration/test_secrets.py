"""No password of a DSN shows in what a failed connection prints, whichever connection failed."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests_support import write_config

from senddock.core.runner import Runner
from senddock.errors import DatabaseError


@pytest.mark.parametrize(("dsn", "leaks"), [
    # libpq ends the password at the first "@" and reports "ss@127.0.0.1" as the host it cannot resolve
    ("postgresql://u:p@ss@127.0.0.1:1/none", ["p@ss", "ss@"]),
    # psycopg's ProgrammingError quotes the bad token back
    ("postgresql://u:sec%zzret@127.0.0.1:1/none", ["zzret"]),
])
def test_the_cli_never_shows_the_password_of_a_dsn_that_fails(cli, tmp_path: Path, monkeypatch, dsn, leaks):
    config = write_config(tmp_path, {"workers": 1})
    monkeypatch.setenv("SENDDOCK_DATABASE_URL", dsn)
    for argv in (["lists", "ls"], ["lists", "ls", "--json"]):
        result = cli(*argv, "-c", config)
        assert result.exit_code == 2, result
        assert "cannot connect to the database postgresql://u:***@127.0.0.1:1/none" in result.stderr
        assert not [leak for leak in leaks if leak in result.stderr + result.stdout], result


def test_a_direct_dsn_that_does_not_parse_stops_the_node_without_showing_its_password(make_config, monkeypatch):
    monkeypatch.setenv("DIRECT_DSN", "postgresql://u:sec%zzret@127.0.0.1:1/none")
    config = make_config({"database": {"direct_dsn": "${DIRECT_DSN}"}})
    with pytest.raises(DatabaseError, match="cannot register the node") as caught:
        Runner(config, concurrency=1).run()
    assert "zzret" not in str(caught.value)


def test_the_lifeline_log_never_shows_the_password_of_a_direct_dsn(run_senddock, tmp_path: Path):
    # A short lease: the node gives up registering after connect_timeout + lease + 5 s.
    config = write_config(tmp_path, {"database": {"direct_dsn": "${DIRECT_DSN}", "connect_timeout": "1s"},
                                     "recovery": {"heartbeat": "500ms", "lease": "2s"},
                                     "logging": {"format": "json"}})
    result = run_senddock("run", "-c", config, "--exit-when-idle",
                          env={"DIRECT_DSN": "postgresql://u:p@ss@127.0.0.1:1/none"})
    assert result.exit_code == 2, result
    assert "lifeline_lost" in result.stderr and "***@127.0.0.1" in result.stderr
    assert "ss@" not in result.stderr, result.stderr


def test_a_password_written_in_direct_dsn_is_refused_like_one_in_dsn(cli, tmp_path: Path):
    config = write_config(tmp_path, {"database": {"direct_dsn": "postgresql://app:hunter2@db.internal/mail"}})
    result = cli("check-config", "-c", config)
    assert result.exit_code == 2
    assert "$.database.direct_dsn: the DSN holds a password" in result.stderr
    assert "hunter2" not in result.stderr
