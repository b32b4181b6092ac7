"""send-test sends to exactly one address, checked as `subscribers import` checks addresses."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_cli import make_campaign


@pytest.fixture
def config_file(tmp_path: Path, smtp_sink) -> Path:
    path = tmp_path / "senddock.yaml"
    path.write_text(f"smtp:\n  host: 127.0.0.1\n  port: {smtp_sink.port}\n  security: none\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(("to", "reason"), [
    ("bad addr", "invalid address 'bad addr': An email address must have an @-sign."),
    ("x@y.com, victim@z.com", "one recipient only, not a list: 'x@y.com, victim@z.com'"),
    ("x@y.com;victim@z.com", "one recipient only, not a list: 'x@y.com;victim@z.com'"),
    ("Me <me@example.com>", "invalid address 'Me <me@example.com>': A display name and angle brackets around "
                            "the email address are not permitted here."),
])
def test_send_test_refuses_anything_but_one_valid_address(cli, config_file, tmp_path, smtp_sink, to, reason):
    campaign = make_campaign(cli, config_file, tmp_path)
    result = cli("send-test", "--campaign", str(campaign), "--to", to, "-c", config_file)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"senddock: error: --to: {reason}\n"
    as_json = cli("send-test", "--campaign", str(campaign), "--to", to, "-c", config_file, "--json")
    assert as_json.exit_code == 2 and as_json.json == {"ok": False, "error": f"--to: {reason}", "exit_code": 2}
    assert smtp_sink.received == []


def test_send_test_checks_the_email_it_renders_for(cli, config_file, tmp_path, smtp_sink):
    campaign = make_campaign(cli, config_file, tmp_path)
    result = cli("send-test", "--campaign", str(campaign), "--to", "me@example.com", "--email", "p1 example.com",
                 "-c", config_file)
    assert result.exit_code == 2
    assert result.stderr == ("senddock: error: --email: invalid address 'p1 example.com': "
                             "An email address must have an @-sign.\n")
    assert smtp_sink.received == []
    sent = cli("send-test", "--campaign", str(campaign), "--to", " me@example.com ", "--email", "p1@example.com",
               "-c", config_file, "--json")
    assert sent.exit_code == 0, sent.stderr
    assert sent.json["to"] == "me@example.com"
    [received] = smtp_sink.received
    assert received.recipients == ("me@example.com",)
