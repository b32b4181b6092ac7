"""A config given the ways a shell gives one: a pipe on /dev/stdin, a file with a key written twice,
an embedded data folder that cannot be made. Run as the real console script, since a pipe can be
read only once per process."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psycopg

from tests_support import senddock_executable


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("SENDDOCK_DATABASE_URL", "SENDDOCK_CONFIG")}


def senddock(*argv: str, stdin: str | None = None, cwd: Path, input_file: Path | None = None
             ) -> subprocess.CompletedProcess[str]:
    """``stdin`` goes through a pipe; ``input_file`` is redirected as ``< FILE`` would."""
    if input_file is not None:
        with open(input_file, encoding="utf-8") as redirected:
            return subprocess.run([senddock_executable(), *argv], stdin=redirected, capture_output=True, text=True,
                                  env=_env(), cwd=cwd, timeout=120)
    return subprocess.run([senddock_executable(), *argv], input=stdin or "", capture_output=True, text=True,
                          env=_env(), cwd=cwd, timeout=120)


def test_a_typo_in_a_piped_config_is_reported(tmp_path: Path):
    piped = senddock("check-config", "-c", "/dev/stdin", stdin="transprt: smtp\n", cwd=tmp_path)
    assert piped.returncode == 2
    assert piped.stderr == "/dev/stdin::$.transprt: unknown key 'transprt' (did you mean 'transport'?)\n"
    assert piped.stdout == ""
    config = tmp_path / "typo.yaml"
    config.write_text("transprt: smtp\n", encoding="utf-8")
    redirected = senddock("check-config", "-c", "/dev/stdin", input_file=config, cwd=tmp_path)
    assert (redirected.returncode, redirected.stderr) == (2, piped.stderr)


def test_a_dsn_given_through_a_pipe_is_used(tmp_path: Path, database_dsn: str):
    text = f"database:\n  dsn: {database_dsn}\n"
    shown = senddock("check-config", "--show", "-c", "/dev/stdin", "--json", stdin=text, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["config"]["database"]["dsn"] == database_dsn
    made = senddock("lists", "create", "piped", "-c", "/dev/stdin", "--json", stdin=text, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    with psycopg.connect(database_dsn) as conn:
        assert conn.execute("SELECT name FROM lists").fetchall() == [("piped",)]
    assert not (tmp_path / ".senddock").exists(), "no embedded Postgres was started"


def test_a_duplicated_key_fails_every_command_that_loads_the_config(tmp_path: Path):
    config = tmp_path / "senddock.yaml"
    config.write_text("smtp:\n  host: 127.0.0.1\nworkers: 2\nsmtp:\n  port: 2525\n", encoding="utf-8")
    for argv in (["check-config"], ["lists", "ls"], ["plugins"]):
        result = senddock(*argv, "-c", str(config), cwd=tmp_path)
        assert result.returncode == 2, argv
        assert result.stderr == f"{config}:4: duplicate key 'smtp' (first at line 1)\n", argv
    as_json = senddock("check-config", "-c", str(config), "--json", cwd=tmp_path)
    assert json.loads(as_json.stdout)["errors"] == [f"{config}:4: duplicate key 'smtp' (first at line 1)"]


def test_an_embedded_data_folder_that_cannot_be_made_is_one_clear_line(tmp_path: Path):
    (tmp_path / "state").write_text("a file, not a folder", encoding="utf-8")
    config = tmp_path / "senddock.yaml"
    config.write_text("database:\n  embedded:\n    path: state/pgdata\n", encoding="utf-8")
    result = senddock("lists", "ls", "-c", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"senddock: error: cannot create the embedded Postgres data folder {tmp_path / 'state' / 'pgdata'}: ")
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


def test_check_config_words_a_bare_number_a_bad_url_and_an_unclosed_reference(tmp_path: Path):
    config = tmp_path / "senddock.yaml"
    config.write_text("recovery:\n  lease: 30\nunsubscribe:\n  url: 127.0.0.1:8025\n"
                      "  secret: ${SENDDOCK_UNSUBSCRIBE_SECRET\n", encoding="utf-8")
    checked = senddock("check-config", "-c", str(config), cwd=tmp_path)
    assert (checked.returncode, checked.stdout) == (2, "")
    assert checked.stderr.splitlines() == [
        f"{config}::$.recovery.lease: 30 is not a duration: add a unit, e.g. 30s",
        f"{config}::$.unsubscribe.secret: unterminated ${{...}}: write ${{NAME}}",
        f"{config}::$.unsubscribe.url: '127.0.0.1:8025' is not an http:// or https:// URL",
    ]
    as_json = senddock("check-config", "-c", str(config), "--json", cwd=tmp_path)
    assert as_json.returncode == 2 and "Traceback" not in as_json.stderr
    assert f"{config}::$.recovery.lease: 30 is not a duration: add a unit, e.g. 30s" in json.loads(as_json.stdout)["errors"]
