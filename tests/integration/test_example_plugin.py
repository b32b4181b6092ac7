"""The example third-party plugin package (examples/senddock-maildir), installed with pip from its
own pyproject into a folder of its own (nothing leaks into this environment), then driven end
to end by `senddock run`, and its own test suite run with senddock.testing's fixtures."""

from __future__ import annotations

import json
import mailbox
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml

from senddock.api import Senddock
from tests_support import make_broadcast, senddock_executable

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "senddock-maildir"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that has the example installed (its --target on PYTHONPATH)."""
    target = tmp_path_factory.mktemp("site")
    # Built from a copy: pip builds in the source folder, and test processes that run this module
    # at the same time would write one build/ folder together.
    source = tmp_path_factory.mktemp("source") / EXAMPLE.name
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), str(source)], check=True, capture_output=True)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}


def test_senddock_finds_the_installed_plugins_through_their_entry_points(installed, tmp_path):
    # In an empty folder: the repository's own config/senddock.yaml (which needs a secret) is not read.
    result = subprocess.run([senddock_executable(), "plugins", "--json"], env=installed, capture_output=True,
                            text=True, check=True, cwd=tmp_path)
    plugins = json.loads(result.stdout)
    names = {p["name"]: p for p in plugins["plugins"]}
    assert names["maildir"]["origin"] == "entry point (senddock-maildir)" and "send_message" in names["maildir"]["hooks"]
    assert names["steady_backoff"]["hooks"] == ["compute_backoff", "config_schema"]
    assert names["maildir"]["transports"] == ["maildir"]


def test_senddock_run_delivers_one_message_per_recipient_into_the_maildir(installed, database_dsn, tmp_path):
    path = tmp_path / "senddock.yaml"
    path.write_text(yaml.safe_dump({"transport": "maildir", "maildir": {"path": str(tmp_path / "staging")},
                                    "logging": {"level": "info"}}), encoding="utf-8")  # shown if it fails
    env = {**installed, "SENDDOCK_DATABASE_URL": database_dsn}
    # The config names a transport only the installed package provides: load it in that environment.
    subprocess.run([senddock_executable(), "check-config", "-c", str(path)], env=env, check=True, capture_output=True)
    # This process has not installed the package: it sets the broadcast up with a config of its own.
    setup = tmp_path / "setup.yaml"
    setup.write_text("logging:\n  level: warning\n", encoding="utf-8")
    app = Senddock.open(setup, environ=env)
    emails = [f"reader{i}@example.com" for i in range(40)]
    campaign_id = make_broadcast(app, emails)
    app.close()
    run = subprocess.run([senddock_executable(), "run", "--exit-when-idle", "-c", str(path)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    delivered = sorted(message["To"] for message in mailbox.Maildir(tmp_path / "staging", create=False))
    if delivered != sorted(emails):  # say why: which jobs, in which state, and what the node logged
        with psycopg.connect(database_dsn) as conn:
            jobs = conn.execute("SELECT email, status, attempts, failure_reason, last_result FROM broadcast_jobs "
                                "WHERE email <> ALL(%s) ORDER BY email", (delivered,)).fetchall()
        raise AssertionError(f"not delivered: {jobs}\nnode stderr: {run.stderr[-3000:]}")
    app = Senddock.open(setup, environ=env)
    assert app.campaign_status(campaign_id).status == "finished"
    app.close()


def test_the_examples_own_tests_pass_with_senddock_testing(installed):
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=EXAMPLE,
                            env=installed, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "3 passed" in result.stdout
