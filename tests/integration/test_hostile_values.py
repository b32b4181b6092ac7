"""Values an attacker chooses (issue 33 §4): cells a spreadsheet would run, a webhook's token in a
URL shown by check-config, a NUL in the dashboard's search, templates that render for ever or
without end, unsubscribe tokens spelt another way."""

from __future__ import annotations

import csv
import io
import time

import pytest
from dashboard_support import Client, serving
from tests_support import make_broadcast, write_config

from senddock.api import Senddock
from senddock.errors import InvalidInput
from senddock.mail.unsubscribe import BadToken, make_token, read_token
from senddock.testing import fast_settings


def test_exported_suppressions_cannot_carry_a_formula(cli, make_config, tmp_path):
    app = Senddock(make_config({}))
    app.ensure_schema()
    with app.db.connection() as conn:
        conn.execute("INSERT INTO suppressions (email, reason, diagnostic) VALUES "
                     "('=cmd|calc!A1@example.com', 'bounced', 'smtp; =HYPERLINK(\"http://evil.example\")'), "
                     "('+1@example.com', 'bounced', '-2+3'), ('@sum@example.com', 'bounced', "
                     "'\tx'), ('ada@example.com', 'bounced', 'fine')")
    result = cli("suppressions", "export", "-c", app.config.path, "-")
    rows = {row["email"]: row for row in csv.DictReader(io.StringIO(result.stdout))}
    assert set(rows) == {"'=cmd|calc!A1@example.com", "'+1@example.com", "'@sum@example.com", "ada@example.com"}
    assert rows["'=cmd|calc!A1@example.com"]["diagnostic"] == "smtp; =HYPERLINK(\"http://evil.example\")"
    assert rows["'+1@example.com"]["diagnostic"] == "'-2+3" and rows["'@sum@example.com"]["diagnostic"] == "'\tx"
    assert not any(cell.startswith(("=", "+", "-", "@", "\t", "\r")) for row in rows.values() for cell in row.values())
    app.close()


def test_check_config_show_masks_a_webhook_urls_query_string(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HOOK_SECRET", "whsec_" + "A" * 32)
    config = write_config(tmp_path, {"webhooks": [{"url": "https://hooks.example.com/in?sig=TOPSECRET&x=1",
                                                   "secret": "${HOOK_SECRET}", "events": ["sent"]}]})
    result = cli("check-config", "-c", config, "--show")
    assert result.exit_code == 0, result.stderr
    assert "TOPSECRET" not in result.stdout and "https://hooks.example.com/in?***" in result.stdout


def test_a_nul_in_the_dashboards_search_is_a_400_not_a_500(make_config, database_dsn, tmp_path):
    settings = fast_settings(2525)
    app = Senddock(make_config(settings))
    campaign_id = make_broadcast(app, ["ada@example.com"])
    with serving(settings, database_dsn, tmp_path) as served:
        client = Client(served.url)
        assert client.login().status == 303
        answer = client.get(f"/dashboard/campaigns/{campaign_id}?email=%00")
        assert answer.status == 400 and "Bad request" in answer.body
        assert client.get(f"/dashboard/campaigns/{campaign_id}?email=ada").status == 200
        assert "Traceback" not in served.log() and "dashboard_error" not in served.log()
    app.close()


@pytest.mark.parametrize(("template", "says"), [
    ("{{ 'a' * 100000000 }}", "templates.max_size"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "templates.max_render_time"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "templates.max_"),
])
def test_a_template_past_its_limits_is_refused_at_create_and_preview(make_config, tmp_path, template, says):
    app = Senddock(make_config({"templates": {"max_size": "1MiB", "max_render_time": "500ms"}}))
    app.create_list("news")
    app.add_subscriber("ada@example.com", lists=["news"])
    started = time.monotonic()
    with pytest.raises(InvalidInput, match=f"^text_body: template error, .*{says}"):
        app.create_campaign(name="Bomb", lists=["news"], subject="Hi", from_addr="news@example.com",
                            text_body=template)
    assert time.monotonic() - started < 5
    # Created before the limit was lowered (or edited in the database): preview refuses it too.
    campaign_id = app.create_campaign(name="Ok", lists=["news"], subject="Hi", from_addr="news@example.com",
                                      text_body="Hello")
    with app.db.connection() as conn:
        conn.execute("UPDATE campaigns SET text_body = %s WHERE id = %s", (template, campaign_id))
    with pytest.raises(Exception, match=says):
        app.preview(campaign_id, email="ada@example.com")
    app.close()


def test_an_unsubscribe_token_has_one_spelling():
    token = make_token("secret", 1234, 7)
    assert read_token("secret", token).subscriber_id == 1234
    payload, mac = token.split(".")
    # The same bytes with the unused bits of the last base64 character set, or with padding kept.
    last = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    flipped = mac[:-1] + last[last.index(mac[-1]) + 1]
    for spelling in (f"{payload}.{flipped}", f"{payload}.{mac}==", f"{payload}==.{mac}"):
        with pytest.raises(BadToken):
            read_token("secret", spelling)
