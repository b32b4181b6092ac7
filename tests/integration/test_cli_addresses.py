"""Addresses from the CLI: suppressions, subscribers' status, the delivery log, nodes."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from senddock.sink import FailRule
from senddock.testing import drain
from test_cli import make_campaign


@pytest.fixture
def config_file(tmp_path: Path, smtp_sink) -> Path:
    path = tmp_path / "senddock.yaml"
    path.write_text(f"smtp:\n  host: 127.0.0.1\n  port: {smtp_sink.port}\n  security: none\n"
                    "retry:\n  schedule: [1s]\n  max_retries: 1\n  jitter: 0\n"
                    "recovery:\n  heartbeat: 200ms\n  lease: 1s\npoll_interval: 100ms\nlogging:\n  level: warning\n",
                    encoding="utf-8")
    return path


def test_suppressions_add_ls_remove_import_export(cli, config_file, tmp_path):
    assert cli("suppressions", "add", "a@example.com", "b@example.com", "-c", config_file).exit_code == 0
    again = cli("suppressions", "add", "A@example.com", "-c", config_file, "--json")
    assert again.json == {"added": [], "already": ["A@example.com"]}
    bad = cli("suppressions", "add", "ok@example.com", "not-an-address", "-c", config_file)
    assert bad.exit_code == 1 and "not-an-address" in bad.stderr
    listed = cli("suppressions", "ls", "-c", config_file, "--json").json["suppressions"]
    assert [r["email"] for r in listed] == ["a@example.com", "b@example.com"]  # nothing half-applied

    csv_file = tmp_path / "supp.csv"
    csv_file.write_text("email,reason\nc@example.com,complained\nbroken,manual\nd@example.com,bogus\n"
                        "e@example.com,\n", encoding="utf-8")
    imported = cli("suppressions", "import", csv_file, "-c", config_file, "--json")
    assert imported.exit_code == 1
    assert imported.json == {"added": 2, "already": 0, "rejected": 2}
    assert f"{csv_file}:3: invalid address 'broken'" in imported.stderr
    assert f"{csv_file}:4: reason 'bogus' is not one of" in imported.stderr
    found = cli("suppressions", "ls", "--reason", "complained", "-c", config_file, "--json").json["suppressions"]
    assert [r["email"] for r in found] == ["c@example.com"]
    assert [r["email"] for r in cli("suppressions", "ls", "--search", "e@ex", "-c", config_file,
                                    "--json").json["suppressions"]] == ["e@example.com"]

    removed = cli("suppressions", "remove", "b@example.com", "zz@example.com", "-c", config_file, "--json")
    assert removed.exit_code == 1 and removed.json["removed"] == ["b@example.com"]
    out = tmp_path / "out.csv"
    assert cli("suppressions", "export", out, "-c", config_file).exit_code == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "email,reason,code,diagnostic,source_broadcast_id,created_at"
    assert sorted(line.split(",")[0] for line in lines[1:]) == ["a@example.com", "c@example.com", "e@example.com"]


def test_unsubscribe_blocklist_and_show(cli, config_file, tmp_path):
    campaign = make_campaign(cli, config_file, tmp_path, rows=3)
    assert cli("subscribers", "unsubscribe", "p0@example.com", "-c", config_file).exit_code == 0
    assert cli("subscribers", "blocklist", "p1@example.com", "-c", config_file).exit_code == 0
    kept = cli("subscribers", "unsubscribe", "p1@example.com", "-c", config_file, "--json")
    assert kept.json["status"] == "blocklisted"  # never downgraded to merely unsubscribed
    missing = cli("subscribers", "unsubscribe", "nobody@example.com", "-c", config_file)
    assert missing.exit_code == 1 and "no subscriber nobody@example.com" in missing.stderr
    shown = cli("subscribers", "show", "p0@example.com", "-c", config_file, "--json").json
    assert (shown["status"], shown["lists"], shown["suppressed_reason"]) == ("unsubscribed", ["news"], "unsubscribed")
    human = cli("subscribers", "show", "p1@example.com", "-c", config_file).stdout
    assert "p1@example.com (P1): blocklisted" in human and "suppressed since" in human
    statuses = {r["email"]: r["status"] for r in cli("subscribers", "ls", "--list", "news", "-c", config_file,
                                                      "--json").json["subscribers"]}
    assert statuses == {"p0@example.com": "unsubscribed", "p1@example.com": "blocklisted", "p2@example.com": "active"}
    sent = cli("campaign", "send", str(campaign), "--no-unsubscribe", "-c", config_file, "--json").json
    assert (sent["enqueued"], sent["skipped"]) == (1, 2)
    assert cli("subscribers", "ls", "--list", "nope", "-c", config_file).exit_code == 1


def test_campaign_log_and_nodes(cli, config_file, tmp_path, smtp_sink, database_dsn):
    smtp_sink.handler.rules = [FailRule.parse("p1@*=550 5.1.1 no such user")]
    campaign = make_campaign(cli, config_file, tmp_path, rows=3)
    assert cli("campaign", "send", str(campaign), "--no-unsubscribe", "-c", config_file).exit_code == 0
    assert cli("run", "--exit-when-idle", "-c", config_file).exit_code == 0
    log = cli("campaign", "log", str(campaign), "-c", config_file, "--json").json["attempts"]
    assert sorted((r["email"], r["outcome"], r["code"]) for r in log) == [
        ("p0@example.com", "sent", 250), ("p1@example.com", "bounce", 550), ("p2@example.com", "sent", 250)]
    only = cli("campaign", "log", str(campaign), "--email", "p1@example.com", "-c", config_file, "--json").json
    assert [r["enhanced_code"] for r in only["attempts"]] == ["5.1.1"]
    assert "p1@example.com" in cli("campaign", "log", str(campaign), "--outcome", "bounce", "-c", config_file).stdout

    # A recovered job whose send may have begun is logged as an in-doubt attempt by the engine;
    # here one is written as recovery writes it, to check what --in-doubt lists.
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, outcome, in_doubt, message) "
                     "SELECT id, broadcast_id, 1, 'in_doubt', true, 'in doubt: its node died while sending' "
                     "FROM broadcast_jobs WHERE email = 'p2@example.com'")
    doubt = cli("campaign", "log", str(campaign), "--in-doubt", "-c", config_file, "--json").json
    assert doubt["in_doubt"] == ["p2@example.com"]
    assert cli("campaign", "log", str(campaign), "--in-doubt", "-c", config_file).stdout.strip() == "p2@example.com"

    # A job in flight at two crashes (in doubt twice) that failed in the end, as crashed_repeatedly
    # does, may have gone out twice all the same; in doubt once and failed, at most once.
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE broadcast_jobs SET status = 'failed', failure_reason = 'crashed_repeatedly' "
                     "WHERE email IN ('p0@example.com', 'p1@example.com')")
        for email, times in (("p0@example.com", 2), ("p1@example.com", 1)):
            for attempt in range(times):
                conn.execute("INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, outcome, in_doubt, message) "
                             "SELECT id, broadcast_id, %s, 'in_doubt', true, 'in doubt: its node died while sending' "
                             "FROM broadcast_jobs WHERE email = %s", (attempt + 2, email))
    doubt = cli("campaign", "log", str(campaign), "--in-doubt", "-c", config_file, "--json").json
    assert doubt["in_doubt"] == ["p0@example.com", "p2@example.com"]

    listed = cli("nodes", "-c", config_file, "--json").json["nodes"]
    assert len(listed) == 1 and listed[0]["stopped_at"] is not None and listed[0]["in_flight"] == 0
    assert "stopped" in cli("nodes", "-c", config_file).stdout
    assert cli("campaign", "log", "999", "-c", config_file).exit_code == 1
