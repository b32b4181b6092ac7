from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "senddock.yaml"
    path.write_text("workers: 2\n", encoding="utf-8")
    return path


def make_campaign(cli, config_file: Path, tmp_path: Path, rows: int = 3) -> int:
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0
    csv = tmp_path / "people.csv"
    csv.write_text("email,name\n" + "".join(f"p{i}@example.com,P{i}\n" for i in range(rows)), encoding="utf-8")
    assert cli("subscribers", "import", csv, "--list", "news", "-c", config_file).exit_code == 0
    body = tmp_path / "body.txt"
    body.write_text("Hello {{ subscriber.name }}", encoding="utf-8")
    created = cli("campaign", "create", "--name", "Launch", "--list", "news", "--subject", "Hi",
                  "--from", "news@example.com", "--text", body, "-c", config_file, "--json")
    assert created.exit_code == 0, created.stderr
    return created.json["id"]


def test_check_config_ok_and_errors(cli, tmp_path: Path, config_file: Path, monkeypatch):
    ok = cli("check-config", "-c", config_file)
    assert (ok.exit_code, ok.stdout.splitlines()[0]) == (0, "config OK")
    bad = tmp_path / "bad.yaml"
    bad.write_text("workrs: 5\nretry:\n  schedule: [30s, 2m, soon]\nsmtp:\n  host: ${SMTP_HOST}\n", encoding="utf-8")
    monkeypatch.delenv("SMTP_HOST", raising=False)
    result = cli("check-config", "-c", bad)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"{bad}::$.retry.schedule[2]: 'soon' is not a duration (e.g. 30s, 2m, 1h30m)",
        f"{bad}::$.smtp.host: environment variable SMTP_HOST is not set",
        f"{bad}::$.workrs: unknown key 'workrs' (did you mean 'workers'?)",
    ]
    as_json = cli("check-config", "-c", bad, "--json")
    assert as_json.exit_code == 2
    assert as_json.json["ok"] is False and len(as_json.json["errors"]) == 3


def test_check_config_show_masks_secrets(cli, tmp_path: Path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("database:\n  dsn: postgresql://app:${DB_PW}@db.internal/mail\n", encoding="utf-8")
    monkeypatch.setenv("DB_PW", "hunter2")
    monkeypatch.delenv("SENDDOCK_DATABASE_URL")
    shown = cli("check-config", "-c", path, "--show", "--json")
    assert shown.exit_code == 0
    assert shown.json["config"]["database"]["dsn"] == "postgresql://app:***@db.internal/mail"
    assert "hunter2" not in shown.stdout + shown.stderr


def test_the_whole_flow_in_json(cli, config_file: Path, tmp_path: Path):
    campaign_id = make_campaign(cli, config_file, tmp_path, rows=4)
    sent = cli("campaign", "send", campaign_id, "--no-unsubscribe", "-c", config_file, "--json")
    assert sent.exit_code == 0
    assert set(sent.json) >= {"campaign_id", "broadcast_id", "enqueued", "skipped"}
    assert (sent.json["campaign_id"], sent.json["enqueued"], sent.json["skipped"]) == (campaign_id, 4, 0)
    status = cli("campaign", "status", campaign_id, "-c", config_file, "--json")
    assert status.exit_code == 0
    assert set(status.json) == {"campaign_id", "status", "paused_reason", "broadcast_id", "rate", "total", "pending",
                                "sending", "retry", "sent", "failed", "bounced", "skipped", "failed_by_reason",
                                "auto_resume", "next_probe_at", "probes_failed", "last_probe", "paused_at",
                                "warning", "bounces", "pacing", "pruned_at"}
    assert (status.json["status"], status.json["total"], status.json["pending"]) == ("sending", 4, 4)
    assert status.json["pacing"] == []  # no limit configured: always there, empty
    listed = cli("campaign", "ls", "-c", config_file, "--json")
    assert [c["id"] for c in listed.json["campaigns"]] == [campaign_id]


def test_human_output(cli, config_file: Path, tmp_path: Path):
    campaign_id = make_campaign(cli, config_file, tmp_path)
    sent = cli("campaign", "send", campaign_id, "--no-unsubscribe", "-c", config_file)
    assert sent.stdout.startswith(f"campaign {campaign_id}: broadcast ")
    assert "enqueued 3 recipients, skipped 0" in sent.stdout
    status = cli("campaign", "status", campaign_id, "-c", config_file)
    assert f"campaign {campaign_id}: sending" in status.stdout
    assert "PENDING" in status.stdout
    assert "news" in cli("lists", "ls", "-c", config_file).stdout


def test_import_with_rejected_rows_exits_1_and_reports_lines(cli, config_file: Path, tmp_path: Path):
    cli("lists", "create", "news", "-c", config_file)
    csv = tmp_path / "people.csv"
    csv.write_text("email,name\nok@example.com,Ok\nbad-address,Bad\nok@example.com,Twice\n", encoding="utf-8")
    result = cli("subscribers", "import", csv, "--list", "news", "-c", config_file, "--json")
    assert result.exit_code == 1
    assert result.json == {"imported": 1, "updated": 0, "unchanged": 0, "rejected": 2, "normalised": 0}
    assert f"{csv}:3: invalid address 'bad-address'" in result.stderr
    assert f"{csv}:4: duplicate of line 2 (ok@example.com)" in result.stderr


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["campaign", "status", "42"], 1, "senddock: error: no campaign with id 42"),
        (["campaign", "send", "abc"], 2, "'abc' is not an id"),
        (["campaign", "send", "-5"], 2, "is not an id"),
        (["subscribers", "import", "missing.csv", "--list", "news"], 1, "missing.csv: cannot read"),
        (["lists", "create", "news"], 1, "a list named 'news' already exists"),
        (["campaign", "create", "--name", "x", "--list", "news", "--subject", "s", "--from", "bad",
          "--text", "nope.txt"], 1, "--text nope.txt: cannot read"),
        (["frobnicate"], 2, "invalid choice"),
    ],
)
def test_bad_input_gets_one_clear_line(cli, config_file: Path, argv, code, message):
    cli("lists", "create", "news", "-c", config_file)
    result = cli(*argv, "-c", config_file)
    assert result.exit_code == code, result
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    as_json = cli(*argv, "-c", config_file, "--json")
    assert as_json.json["ok"] is False and as_json.json["exit_code"] == code


def test_real_console_script_speaks_json(run_senddock, tmp_path: Path, config_file: Path):
    assert run_senddock("migrate", "-c", config_file).exit_code == 0
    created = run_senddock("lists", "create", "news", "-c", config_file, "--json")
    assert created.exit_code == 0, created.stderr
    assert created.json["name"] == "news"
    unreachable = run_senddock("lists", "ls", "-c", config_file, db=False,
                               env={"SENDDOCK_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"})
    assert unreachable.exit_code == 2
    assert "cannot connect to the database" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr


def test_plugins_command(cli, config_file: Path):
    result = cli("plugins", "-c", config_file, "--json")
    assert result.json["active_transport"] == "smtp"
    # A third-party plugin installed beside senddock is listed too (an entry point).
    assert {p["name"]: p["origin"] for p in result.json["plugins"] if p["origin"] == "built-in"} == {
        "senddock.defaults": "built-in", "smtp": "built-in", "ses_like": "built-in"}
    assert "active transport: smtp" in cli("plugins", "-c", config_file).stdout


def test_check_config_says_which_database_it_resolves_to(run_senddock, tmp_path: Path, database_dsn: str):
    # A config in another folder means another embedded database: said in full, never a surprise.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = elsewhere / "senddock.yaml"
    config.write_text("database:\n  embedded:\n    path: data/pg\n", encoding="utf-8")
    shown = run_senddock("check-config", "-c", config, db=False)
    assert shown.stdout == f"config OK\ndatabase: embedded Postgres in {(elsewhere / 'data' / 'pg').resolve()}\n"
    password = run_senddock("check-config", "-c", config, "--json", db=False,
                            env={"SENDDOCK_DATABASE_URL": "postgresql://mailer:hunter2@db.internal/mail"})
    assert password.json["database"] == "postgresql://mailer:***@db.internal/mail"
