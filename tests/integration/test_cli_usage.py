"""Bad option values are usage errors (exit 2, one line naming the option), never a silent
default or a traceback; a file that cannot be written is one line too."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv, message", [
    (["run", "--workers", "0"], "argument --concurrency/--workers: '0' is not a number of sends in flight"),
    (["run", "--workers", "-3"], "argument --concurrency/--workers: '-3' is not a number of sends in flight"),
    (["run", "--node", ""], "argument --node: a node name cannot be empty"),
    (["sink", "--port", "99999"], "argument --port: '99999' is not a TCP port"),
    (["serve", "--port", "-1"], "argument --port: '-1' is not a TCP port"),
    (["campaign", "status", "1", "--watch", "--interval", "0"], "argument --interval: '0' is not a refresh interval"),
    (["campaign", "set-rate", "1", "20 per second"], "argument RATE: '20 per second' is not a rate: write N/s"),
    (["campaign", "create", "--name", "x", "--list", "l", "--subject", "s", "--from", "a@example.com",
      "--rate", "0/s"], "argument --rate: '0/s' is not a rate: N must be more than 0"),
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


@pytest.mark.parametrize("argv, line", [
    # The top level's own errors: the channel's `senddock: error:` is the only prefix.
    (["frobnicate"], "senddock: error: argument COMMAND: invalid choice: 'frobnicate' (choose from "),
    (["--josn"], "senddock: error: unrecognized arguments: --josn"),
    # A command's unknown argument is refused by that command, by name.
    (["lists", "create", "news", "--josn"],
     "senddock: error: senddock lists create: unrecognized arguments: --josn (did you mean --json?)"),
    (["campaign", "history", "1", "--limit", "0"],
     "senddock: error: senddock campaign history: argument --limit: '0' is not a count (a whole number, 1 or more)"),
    (["campaign", "history", "1", "--limit", "x"],
     "senddock: error: senddock campaign history: argument --limit: 'x' is not a count (a whole number, 1 or more)"),
])
def test_a_usage_error_is_one_line_with_one_prefix_naming_the_command(run_senddock, argv, line):
    result = run_senddock(*argv, db=False)
    assert (result.exit_code, result.stdout) == (2, ""), result
    assert result.stderr.startswith(line) and result.stderr.count("\n") == 1, result.stderr
    assert "senddock: error: senddock:" not in result.stderr and "Traceback" not in result.stderr
    as_json = run_senddock(*argv, "--json", db=False)
    assert as_json.exit_code == 2 and "Traceback" not in as_json.stderr
    assert as_json.stdout.count("\n") == 1  # exactly one JSON object, the same words
    assert as_json.json == {"ok": False, "error": result.stderr.strip().removeprefix("senddock: error: "),
                            "exit_code": 2}
