"""The message commands: template errors at create and send, campaign preview, send-test."""

from __future__ import annotations

from pathlib import Path

import psycopg
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
    """What reading the template cannot see (every attribute is there, but CSV values are text) is
    still caught by rendering a sample of recipients."""
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0
    csv = tmp_path / "people.csv"
    csv.write_text("email,name,seats\nada@example.com,Ada,3\n", encoding="utf-8")
    assert cli("subscribers", "import", csv, "--list", "news", "-c", config_file).exit_code == 0
    body = tmp_path / "body.txt"
    body.write_text("Seats with you: {{ subscriber.attributes.seats + 1 }}", encoding="utf-8")
    campaign = cli("campaign", "create", "--name", "x", "--list", "news", "--subject", "Hi",
                   "--from", "a@example.com", "--text", body, "-c", config_file, "--json").json["id"]
    result = cli("campaign", "send", str(campaign), "--no-unsubscribe", "-c", config_file, "--json")
    assert result.exit_code == 1
    assert ("does not render for subscriber 1 (ada@example.com): text, line 1: TypeError: can only concatenate str"
            in result.json["error"])
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


def _create(cli, config_file, tmp_path, text: str, *extra):
    body = tmp_path / "body.txt"
    body.write_text(text, encoding="utf-8")
    return cli("campaign", "create", "--name", "x", "--list", "news", "--subject", "Hi", "--from", "a@example.com",
               "--text", body, "-c", config_file, *extra)


def test_create_refuses_a_variable_that_never_exists_and_names_the_real_ones(cli, config_file, tmp_path):
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0
    result = _create(cli, config_file, tmp_path, "Hello {{ name }}\n")
    assert result.exit_code == 1
    assert result.stderr == (
        "senddock: error: --text, line 1: 'name' is not a variable (did you mean subscriber.name?); the variables "
        "are: subscriber.email, subscriber.name, subscriber.attributes.<column>, campaign.id, campaign.name, "
        "campaign.from, unsubscribe_url\n")
    typo = _create(cli, config_file, tmp_path, "Hello\n\n{{ subscriber.emial }}, from {{ city }}\n", "--json")
    assert typo.exit_code == 1
    assert typo.json["error"].startswith(
        "--text, line 3: 'subscriber.emial' is not a variable (did you mean subscriber.email?); --text, line 3: "
        "'city' is not a variable (did you mean subscriber.attributes.city?); the variables are: ")
    # What the template defines itself, and what a default or a test guards, is fine.
    fine = _create(cli, config_file, tmp_path, "{% set greeting = 'Hello' %}{{ greeting }} "
                   "{{ nickname | default(subscriber.name) }}{% if vip is defined %} {{ vip }}{% endif %}\n"
                   "{% for tag in subscriber.attributes.tags %}{{ loop.index }}: {{ tag }}{% endfor %}\n")
    assert fine.exit_code == 0, fine.stderr
    assert [c["id"] for c in cli("campaign", "ls", "-c", config_file, "--json").json["campaigns"]] == [1]


def test_create_refuses_unsubscribe_url_without_the_unsubscribe_section(cli, config_file, tmp_path, monkeypatch):
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0
    text = "Hello\n<{{ unsubscribe_url }}>\n"
    refused = _create(cli, config_file, tmp_path, text)
    assert refused.exit_code == 1
    assert refused.stderr.startswith(
        "senddock: error: --text, line 2: unsubscribe_url needs the unsubscribe section (set unsubscribe.url or "
        "unsubscribe.mailto, with unsubscribe.secret, in the config); the variables are: ")
    monkeypatch.setenv("UNSUB_SECRET", "s3cret-s3cret-s3cret-s3cret")
    with config_file.open("a", encoding="utf-8") as f:
        f.write("unsubscribe:\n  url: https://lists.example.com\n  secret: ${UNSUB_SECRET}\n")
    assert _create(cli, config_file, tmp_path, text).exit_code == 0


def test_create_help_lists_every_variable(run_senddock):
    from senddock.mail.template_variables import VARIABLES

    result = run_senddock("campaign", "create", "--help", db=False)
    assert result.exit_code == 0
    for name, meaning in VARIABLES:
        assert f"{name}  " in result.stdout and meaning in result.stdout
    # An empty CSV cell is stored as "": only default(..., true) replaces it.
    assert '{{ subscriber.attributes.city | default("your city", true) }}' in result.stdout
    assert 'default("")' not in result.stdout


def test_the_default_the_help_recommends_replaces_an_empty_csv_cell(cli, config_file, tmp_path, smtp_sink):
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0
    csv = tmp_path / "people.csv"
    csv.write_text("email,name,city\nada@example.com,Ada,\n", encoding="utf-8")
    assert cli("subscribers", "import", csv, "--list", "news", "-c", config_file).exit_code == 0
    created = _create(cli, config_file, tmp_path, 'See you in {{ subscriber.attributes.city | default("your city", true) }}\n',
                      "--json")
    preview = cli("campaign", "preview", created.json["id"], "--email", "ada@example.com", "-c", config_file)
    assert preview.exit_code == 0 and "See you in your city" in preview.stdout, preview


def _two_people(cli, config_file, tmp_path) -> None:
    """ada has a city, bob has none (a second import without that column)."""
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0
    for rows in ("email,name,city\nada@example.com,Ada,Paris\n", "email,name\nbob@example.com,Bob\n"):
        csv = tmp_path / "people.csv"
        csv.write_text(rows, encoding="utf-8")
        assert cli("subscribers", "import", csv, "--list", "news", "-c", config_file).exit_code == 0


def test_preview_and_send_test_say_in_one_line_why_a_subscriber_does_not_render(cli, run_senddock, config_file,
                                                                                tmp_path, smtp_sink):
    _two_people(cli, config_file, tmp_path)
    created = _create(cli, config_file, tmp_path, "Hello\nhow is {{ subscriber.attributes.city }}?\n", "--json")
    campaign = str(created.json["id"])
    assert run_senddock("campaign", "preview", campaign, "--email", "ada@example.com", "-c", config_file).exit_code == 0

    preview = run_senddock("campaign", "preview", campaign, "--email", "bob@example.com", "-c", config_file)
    expected = (f"campaign {campaign}: its template does not render for subscriber 2 (bob@example.com): text, line 2: "
                "this subscriber lacks the attribute 'city' (they have no attributes)")
    assert (preview.exit_code, preview.stdout, preview.stderr) == (1, "", f"senddock: error: {expected}\n")
    as_json = run_senddock("campaign", "preview", campaign, "--email", "bob@example.com", "-c", config_file, "--json")
    assert as_json.exit_code == 1 and "Traceback" not in as_json.stderr
    assert as_json.json == {"ok": False, "error": expected, "exit_code": 1}

    test_send = run_senddock("send-test", "--campaign", campaign, "--to", "me@example.com", "--email",
                             "bob@example.com", "-c", config_file)
    assert (test_send.exit_code, test_send.stderr) == (1, f"senddock: error: {expected}\n")
    assert smtp_sink.received == []


def test_preview_says_in_one_line_when_a_name_holds_a_line_break(cli, run_senddock, config_file, tmp_path,
                                                                 database_dsn):
    campaign = str(make_campaign(cli, config_file, tmp_path, rows=1))
    with psycopg.connect(database_dsn) as conn:  # imports make names one line: this came another way
        conn.execute("UPDATE subscribers SET name = E'P0\\r\\nBcc: victim@example.com'")
    preview = run_senddock("campaign", "preview", campaign, "-c", config_file)
    assert preview.exit_code == 1 and "Traceback" not in preview.stderr
    assert preview.stderr == ("senddock: error: subscriber p0@example.com: name 'P0\\r\\nBcc: victim@example.com' "
                              "contains a line break\n")


def test_preview_of_a_campaign_reaching_nobody_or_of_an_unknown_address(cli, run_senddock, config_file, tmp_path):
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0
    campaign = str(_create(cli, config_file, tmp_path, "Hello {{ subscriber.name }}\n", "--json").json["id"])
    for argv, message in [
        ((campaign,), f"campaign {campaign} reaches no active subscriber: give --email"),
        ((campaign, "--email", "nobody@example.com"), "no subscriber nobody@example.com"),
        (("99",), "no campaign with id 99"),
    ]:
        result = run_senddock("campaign", "preview", *argv, "-c", config_file)
        assert (result.exit_code, result.stderr) == (1, f"senddock: error: {message}\n"), argv
