"""`campaign status --watch` on a pseudo-terminal (pexpect) and in pipe mode, while a node sends."""

from __future__ import annotations

import json
import os
import subprocess

import pexpect

from senddock.api import Senddock
from senddock.testing import fast_settings
from tests_support import make_broadcast, senddock_executable, start_node, write_config


def setup(make_config, database_dsn, smtp_sink, tmp_path, recipients=400, **overrides):
    settings = fast_settings(smtp_sink.port, concurrency=2, **overrides)
    app = Senddock(make_config(settings))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(recipients)])
    config_path = write_config(tmp_path, settings)
    env = {**os.environ, "SENDDOCK_DATABASE_URL": database_dsn}
    return app, campaign_id, config_path, env


def test_watch_on_a_terminal_shows_progress_and_exits_when_finished(make_config, database_dsn, smtp_sink, tmp_path):
    # With a pacing limit configured, the view shows it (configured, effective, last minute).
    app, campaign_id, config_path, env = setup(make_config, database_dsn, smtp_sink, tmp_path,
                                               pacing={"global": "100000/s"})
    node = start_node(config_path, database_dsn, "solo")
    try:
        child = pexpect.spawn(senddock_executable(), ["campaign", "status", str(campaign_id), "--watch",
                                                      "--interval", "0.2", "-c", str(config_path)],
                              env=env, encoding="utf-8", dimensions=(30, 120), timeout=60)
        child.expect(f"campaign {campaign_id} sending")  # the live view while it sends
        child.expect("rate")
        child.expect(r"global\s+100000/s\s+100000/s")
        child.expect(f"campaign {campaign_id} finished")
        child.expect(f"400/400")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
    finally:
        node.terminate()
        node.wait(60)
    app.close()


def test_watch_piped_prints_plain_lines_and_json_prints_one_object(make_config, database_dsn, smtp_sink, tmp_path):
    app, campaign_id, config_path, env = setup(make_config, database_dsn, smtp_sink, tmp_path)
    node = start_node(config_path, database_dsn, "solo")
    try:
        piped = subprocess.run([senddock_executable(), "campaign", "status", str(campaign_id), "--watch",
                                "--interval", "0.2", "-c", str(config_path)], env=env, capture_output=True,
                               text=True, timeout=120)
        as_json = subprocess.run([senddock_executable(), "campaign", "status", str(campaign_id), "--watch",
                                  "--json", "-c", str(config_path)], env=env, capture_output=True, text=True,
                                 timeout=60)
    finally:
        node.terminate()
        node.wait(60)
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.splitlines()
    assert lines[-1].startswith(f"campaign {campaign_id}: finished 400/400 (sent 400, failed 0")
    assert "\x1b[" not in piped.stdout  # no terminal escapes in a pipe
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout)["status"] == "finished"
    paused = cli_status_of_paused(app, config_path, env)
    assert paused.returncode == 0 and "paused" in paused.stdout.splitlines()[-1]
    missing = subprocess.run([senddock_executable(), "campaign", "status", "999", "--watch", "-c", str(config_path)],
                             env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no campaign with id 999" in missing.stderr
    app.close()


def cli_status_of_paused(app, config_path, env):
    """--watch on a paused campaign ends at once: there is nothing to wait for."""
    campaign_id = make_broadcast(app, ["late@example.com"], list_name="other", name="Later")
    app.pause_campaign(campaign_id)
    return subprocess.run([senddock_executable(), "campaign", "status", str(campaign_id), "--watch",
                           "-c", str(config_path)], env=env, capture_output=True, text=True, timeout=60)
