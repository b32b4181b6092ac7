"""The message commands: template errors at create and send, campaign preview, send-test."""

from __future__ import annotations

from pathlib import Path

import pytest

from senddock.sink import FailRule
from test_cli import make_campaign


@pytest.fixture
def config_file(tmp_path: Path, smtp_sink) -> Path:
    path = tmp_path / "senddock.yaml"
    path.write_text(f"smtp:\n  host: 127.0.0.1\n  port: {smtp_sink.port}\n  security: none\n", encoding="utf-8")
    return path


def test_a_template_syntax_error_is_refused_at_create_with_its_line(cli, config_file, tmp_path):
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0
    html = tmp_path / "body.html"
    html.write_text("<p>Hello</p>\n<p>{{ subscriber.name }</p>\n", encoding="utf-8")
    result = cli("campaign", "create", "--name", "x", "--list", "news", "--subject", "Hi", "--from", "a@example.com",
                 "--html", html, "-c", config_file)
    assert result.exit_code == 1
    assert result.stderr.strip() == "senddock: error: --html: template error, line 2: unexpected '}'"
    assert cli("campaign", "ls", "-c", config_file, "--json").json["campaigns"] == []


def test_send_refuses_a_campaign_whose_template_fails_for_its_recipients(cli, config_file, tmp_path):
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0
    csv = tmp_path / "people.csv"
    csv.write_text("email,name\nada@example.com,Ada\n", encoding="utf-8")
    assert cli("subscribers", "import", csv, "--list", "news", "-c", config_file).exit_code == 0
    body = tmp_path / "body.txt"
    body.write_text("Your plan: {{ subscriber.attributes.plan }}", encoding="utf-8")
    campaign = cli("campaign", "create", "--name", "x", "--list", "news", "--subject", "Hi",
                   "--from", "a@example.com", "--text", body, "-c", config_file, "--json").json["id"]
    result = cli("campaign", "send", str(campaign), "--no-unsubscribe", "-c", config_file, "--json")
    assert result.exit_code == 1
    assert "does not render for subscriber 1 (ada@example.com): text, line 1" in result.json["error"]
    assert cli("campaign", "status", str(campaign), "-c", config_file, "--json").json["status"] == "draft"


def test_preview_prints_the_rendered_message(cli, config_file, tmp_path):
    campaign = make_campaign(cli, config_file, tmp_path)
    result = cli("campaign", "preview", str(campaign), "--email", "p1@example.com", "-c", config_file, "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json["recipient"] == "p1@example.com"
    assert result.json["headers"]["To"] == "P1 <p1@example.com>"
    assert result.json["parts"] == [{"content_type": "text/plain", "body": "Hello P1\n"}]
    human = cli("campaign", "preview", str(campaign), "-c", config_file).stdout
    assert "Subject: Hi" in human and "--- text/plain ---\nHello P0" in human
    assert cli("campaign", "preview", str(campaign), "--email", "nobody@example.com", "-c", config_file).exit_code == 1


def test_send_test_sends_now_and_reports_the_classification(cli, config_file, tmp_path, smtp_sink):
    campaign = make_campaign(cli, config_file, tmp_path)
    result = cli("send-test", "--campaign", str(campaign), "--to", "me@example.com", "-c", config_file, "--json")
    assert result.exit_code == 0, result.stderr
    assert (result.json["sent"], result.json["outcome"], result.json["code"]) == (True, "sent", 250)
    [received] = smtp_sink.received
    assert received.recipients == ("me@example.com",) and received.message_id == result.json["message_id"]

    smtp_sink.handler.rules = [FailRule.parse("nobody@*=550 5.1.1 no such user")]
    refused = cli("send-test", "--campaign", str(campaign), "--to", "nobody@example.com", "-c", config_file)
    assert refused.exit_code == 1
    assert "550 5.1.1 no such user" in refused.stdout and "classified: bounce (bounced)" in refused.stdout
    # Nothing queued, nothing suppressed: a test send is no broadcast.
    assert cli("campaign", "status", str(campaign), "-c", config_file, "--json").json["status"] == "draft"
