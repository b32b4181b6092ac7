"""The zero-setup default: no database configured, an embedded Postgres shared by every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests_support import senddock_executable


def test_two_processes_share_one_embedded_server_which_stops_after_the_last(tmp_path: Path):
    config = tmp_path / "senddock.yaml"
    config.write_text("database:\n  embedded:\n    path: state/pgdata\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("SENDDOCK_DATABASE_URL", "SENDDOCK_CONFIG")}
    holder_code = (
        "import sys\nfrom senddock.api import Senddock\n"
        f"sd = Senddock.open({str(config)!r})\nsd.create_list('from-holder')\n"
        "print('ready', flush=True)\nsys.stdin.readline()\nsd.close()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", holder_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        # Unconfigured structlog (an embedding application's choice) may print log lines first.
        lines = iter(holder.stdout.readline, "")
        assert any(line.strip() == "ready" for line in lines)
        pgdata = tmp_path / "state" / "pgdata"
        assert (pgdata / "PG_VERSION").exists()
        other = subprocess.run([senddock_executable(), "lists", "create", "from-cli", "-c", config, "--json"],
                               capture_output=True, text=True, env=env, timeout=60)
        assert other.returncode == 0, other.stderr
        listed = subprocess.run([senddock_executable(), "lists", "ls", "-c", config, "--json"],
                                capture_output=True, text=True, env=env, timeout=60)
        assert sorted(x["name"] for x in json.loads(listed.stdout)["lists"]) == ["from-cli", "from-holder"]
        # The CLI processes have exited; the holder still uses the server.
        assert (pgdata / "postmaster.pid").exists()
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    deadline = time.monotonic() + 20
    while (pgdata / "postmaster.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (pgdata / "postmaster.pid").exists(), "the last process to leave stops the embedded server"


def test_the_first_command_says_it_made_a_new_embedded_database_and_where(tmp_path: Path):
    config = tmp_path / "senddock.yaml"
    config.write_text("database:\n  embedded:\n    path: state/pgdata\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("SENDDOCK_DATABASE_URL", "SENDDOCK_CONFIG")}

    def created_lines() -> list[dict]:
        proc = subprocess.run([senddock_executable(), "lists", "ls", "-c", config], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stderr.splitlines()
                if line.startswith("{") and json.loads(line)["event"] == "embedded_database_created"]

    [created] = created_lines()
    assert created["path"] == str((tmp_path / "state" / "pgdata").resolve())
    assert created_lines() == []  # the second command uses it: nothing to say
