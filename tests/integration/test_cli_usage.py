"""Bad option values are usage errors (exit 2, one line naming the option), never a silent
default or a traceback; a file that cannot be written is one line too."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv, message", [
    (["run", "--workers", "0"], "argument --workers: '0' is not a number of workers"),
    (["run", "--workers", "-3"], "argument --workers: '-3' is not a number of workers"),
    (["run", "--node", ""], "argument --node: a node name cannot be empty"),
    (["sink", "--port", "99999"], "argument --port: '99999' is not a TCP port"),
    (["serve", "--port", "-1"], "argument --port: '-1' is not a TCP port"),
    (["campaign", "status", "1", "--watch", "--interval", "0"], "argument --interval: '0' is not a refresh interval"),
])
def test_a_bad_option_value_is_a_usage_error(run_senddock, argv, message):
    result = run_senddock(*argv, db=False)
    assert result.exit_code == 2, result
    assert message in result.stderr and "Traceback" not in result.stderr


def test_exporting_suppressions_where_nothing_can_be_written_is_one_line(run_senddock, tmp_path):
    result = run_senddock("suppressions", "export", tmp_path / "missing" / "out.csv")
    assert result.exit_code == 1, result
    assert result.stderr.strip().endswith(f"{tmp_path / 'missing' / 'out.csv'}: cannot write: No such file or directory")
    assert "Traceback" not in result.stderr


def test_an_operators_suppressions_are_told_by_the_command_not_one_log_line_each(run_senddock):
    result = run_senddock("suppressions", "add", "a@example.com", "b@example.com", "c@example.com")
    assert result.exit_code == 0, result
    assert "address_suppressed" not in result.stderr
    assert result.stdout == "3 suppressed, 0 already were\n"
