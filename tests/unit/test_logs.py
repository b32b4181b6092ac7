"""Log lines: one JSON object per line on stderr, libraries' standard-library records included."""

from __future__ import annotations

import json
import logging

import structlog

from senddock.cli.logs import configure_logging, flush_logs


def test_a_librarys_stdlib_warning_is_a_json_line_with_the_password_masked(capsys):
    configure_logging("info", "json")
    try:
        logging.getLogger("psycopg.pool").warning(
            "error connecting in %r: connection to postgresql://mailer:s3cret@db/senddock failed", "senddock")
        logging.getLogger("psycopg.pool").info("a library's chatter stays out")
        structlog.get_logger("senddock.test").info("ours", n=1)
        flush_logs()
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers = []
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert [(r["event"].split(":")[0], r["level"]) for r in records] == [
        ("error connecting in 'senddock'", "warning"), ("ours", "info")]
    assert records[0]["logger"] == "psycopg.pool"
    assert "s3cret" not in lines[0]
