"""A template error is ours, not the recipient's: every recipient's data is checked at `campaign
send`, and what still fails at render pauses the campaign instead of finishing it with failures."""

from __future__ import annotations

import pytest

from senddock.api import Senddock
from senddock.errors import InvalidInput
from senddock.testing import drain, fast_settings
from tests_support import jobs_by_email, make_broadcast, running_node, wait_for


def _campaign(app, campaign_id: int) -> tuple:
    with app.db.connection() as conn:
        return conn.execute("SELECT status, paused_reason FROM campaigns WHERE id = %s", (campaign_id,)).fetchone()


def _jobs(app) -> int:
    with app.db.connection() as conn:
        return conn.execute("SELECT count(*) FROM broadcast_jobs").fetchone()[0]


def test_send_refuses_when_some_recipients_lack_an_attribute_the_template_needs(make_config, smtp_sink):
    app = Senddock(make_config(fast_settings(smtp_sink.port)))
    app.create_list("news")
    # 30 of 90 lack `city`, none of them among the 20 oldest and 20 newest the sample render sees.
    for i in range(90):
        attributes = {"zip": "1000"} if 30 <= i < 60 else {"city": f"City {i}", "zip": "1000"}
        app.add_subscriber(f"user{i}@example.com", attributes=attributes, lists=["news"])
    app.suppress("user31@example.com")  # not enqueued: not counted, not shown
    body = "Greetings to\n{{ subscriber.attributes.city }}\n{{ subscriber.attributes.zip }}\n"
    campaign_id = app.create_campaign(name="c", lists=["news"], subject="Hi", from_addr="news@example.com",
                                      text_body=body)
    with pytest.raises(InvalidInput) as refused:
        app.send_campaign(campaign_id)
    assert str(refused.value) == (
        f"campaign {campaign_id} not sent, nothing enqueued: 29 recipients lack the attribute 'city' read at text, "
        "line 2 (e.g. user30@example.com, user32@example.com, user33@example.com, user34@example.com, "
        "user35@example.com, ...); give it a default in the template "
        "({{ subscriber.attributes.city | default(\"...\") }}) or import a CSV with a 'city' column for them, "
        "then send again")
    assert _campaign(app, campaign_id) == ("draft", None) and _jobs(app) == 0

    # A guarded use needs nothing: the same data sends.
    guarded = app.create_campaign(name="c2", lists=["news"], subject="Hi", from_addr="news@example.com",
                                  text_body="Greetings to {{ subscriber.attributes.city | default('you') }}\n")
    assert app.send_campaign(guarded).enqueued == 89
    drain(app.config)
    assert app.campaign_status(guarded).sent == 89
    app.close()


def test_the_attribute_check_names_each_missing_key_and_sees_only_who_would_be_enqueued(make_config, smtp_sink):
    app = Senddock(make_config(fast_settings(smtp_sink.port)))
    app.create_list("news")
    app.create_list("other")
    app.add_subscriber("a@example.com", attributes={"plan": "pro"}, lists=["news"])
    app.add_subscriber("b@example.com", attributes={}, lists=["news"])
    app.add_subscriber("gone@example.com", attributes={}, lists=["news"])
    app.unsubscribe("gone@example.com")
    app.add_subscriber("elsewhere@example.com", attributes={}, lists=["other"])
    campaign_id = app.create_campaign(name="c", lists=["news"], subject="{{ subscriber.attributes.plan }}",
                                      from_addr="news@example.com",
                                      html_body='<p>{{ subscriber.attributes["first name"] }}</p>')
    with pytest.raises(InvalidInput) as refused:
        app.send_campaign(campaign_id)
    message = str(refused.value)
    assert "1 recipient lacks the attribute 'plan' read at subject, line 1 (e.g. b@example.com)" in message
    assert ("2 recipients lack the attribute 'first name' read at html, line 1 (e.g. a@example.com, b@example.com)"
            in message)
    assert "gone@" not in message and "elsewhere@" not in message
    assert _jobs(app) == 0
    app.close()


def test_send_says_how_many_would_get_an_empty_value_written_out(make_config, cli, smtp_sink):
    """`{{ subscriber.name }}` with some names empty rendered subjects ending in "for " at create,
    preview, send-test and send, with no word: the send now says who, where and what fills it."""
    config = make_config(fast_settings(smtp_sink.port))
    app = Senddock(config)
    app.create_list("news")
    for i in range(30):
        name = "" if i % 10 == 3 else ("  " if i == 7 else f"Reader {i}")
        city = "" if i == 5 else "Lyon"
        app.add_subscriber(f"user{i}@example.com", name=name, attributes={"city": city}, lists=["news"])
    app.suppress("user13@example.com")  # not enqueued: not counted
    campaign_id = app.create_campaign(
        name="c", lists=["news"], subject="News for {{ subscriber.name }}", from_addr="news@example.com",
        text_body="{{ subscriber.attributes.city | default('your city') }}\n"  # misses "": no `true`
                  "{{ subscriber.name | default('friend', true) }}\n"  # covers ""
                  "{% if subscriber.name %}{{ subscriber.name }}{% endif %}\n")  # only when there is one
    sent = cli("campaign", "send", campaign_id, "--no-unsubscribe", "-c", config.path, "--json")
    assert sent.exit_code == 0, sent.stderr
    assert sent.json["enqueued"] == 29
    assert sent.json["warnings"] == [
        "3 recipients have an empty subscriber.name, written out at subject, line 1 with nothing in its place "
        "(e.g. user3@example.com, user7@example.com, user23@example.com): give it a default that covers empty "
        "values, {{ subscriber.name | default(\"...\", true) }}",
        "1 recipient has an empty subscriber.attributes.city, written out at text, line 1 with nothing in its "
        "place (e.g. user5@example.com): give it a default that covers empty values, "
        "{{ subscriber.attributes.city | default(\"...\", true) }}"]
    assert f"warning: campaign {campaign_id}: 3 recipients have an empty subscriber.name" in sent.stderr
    app.close()


@pytest.mark.parametrize("fix", ["data", "template"])
def test_a_template_error_at_send_time_pauses_the_campaign_and_a_fix_resumes_it(make_config, smtp_sink, fix):
    """Data that passes the send-time check (everyone has `n`) but does not render for one recipient
    (`n` is a string there): that job goes back in line and the campaign pauses with the reason; once
    the data or the template is fixed, `campaign resume` sends everyone exactly once."""
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=1)))
    app.create_list("news")
    emails = [f"user{i}@example.com" for i in range(50)]
    for i, email in enumerate(emails):  # #25 is outside the sample of the 20 oldest and 20 newest
        app.add_subscriber(email, attributes={"n": "twenty-five" if i == 25 else i}, lists=["news"])
    campaign_id = app.create_campaign(name="c", lists=["news"], subject="Hi", from_addr="news@example.com",
                                      text_body="Hello\nyour number: {{ subscriber.attributes.n + 1 }}\n")
    app.send_campaign(campaign_id)
    with running_node(app.config):
        wait_for(lambda: _campaign(app, campaign_id)[0] != "sending", 60, "the campaign to pause")
        status, reason = _campaign(app, campaign_id)
        # The reason names who it failed for, and where the log lists them: status shows only the reason.
        assert (status, reason) == (
            "paused", 'template_error: text, line 2: TypeError: can only concatenate str (not "int") to str; '
                      f"first at user25@example.com (senddock campaign log {campaign_id} --outcome pause)")
        assert [e["email"] for e in app.delivery_log(campaign_id, outcome="pause")] == ["user25@example.com"]
        jobs = jobs_by_email(app, campaign_id)
        assert jobs["user25@example.com"] == ("pending", None, 0)  # back in line, no attempt used up
        assert not [e for e, (s, _, _) in jobs.items() if s == "failed"]
        warning = app.campaign_status(campaign_id).warning  # loud, with what to do
        assert warning.startswith("senddock paused this campaign: template_error: text, line 2")
        assert "\n" not in warning and "first at user25@example.com" in warning
        assert "does not render" in warning and f"senddock campaign resume {campaign_id}" in warning
        if fix == "data":
            app.add_subscriber("user25@example.com", attributes={"n": 25}, lists=["news"])
        else:  # no command edits a paused campaign (drafts only), but a worker must never render a stale
            # cached copy of a template changed in the database: the node has the old one cached
            with app.db.connection() as conn:
                conn.execute("UPDATE campaigns SET text_body = %s WHERE id = %s",
                             ("Hello\nyour number: {{ subscriber.attributes.n }}\n", campaign_id))
        app.resume_campaign(campaign_id)
        wait_for(lambda: _campaign(app, campaign_id)[0] == "finished", 60, "the campaign to finish")
    status = app.campaign_status(campaign_id)
    assert (status.sent, status.failed, status.failed_by_reason) == (50, 0, {})
    received = {m.recipients[0]: m for m in smtp_sink.received}
    assert len(smtp_sink.received) == 50 and set(received) == set(emails)
    expected = "your number: 26" if fix == "data" else "your number: twenty-five"
    assert expected in received["user25@example.com"].data.decode()
    app.close()


@pytest.mark.parametrize(("column", "field", "header"), [("from_addr", "from", "From"),
                                                           ("reply_to", "reply_to", "Reply-To")])
def test_a_from_stored_before_it_was_checked_strictly_pauses_the_campaign_instead_of_crashing(
        make_config, smtp_sink, column, field, header):
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=1)))
    campaign_id = make_broadcast(app, ["a@example.com", "b@example.com"])
    with app.db.connection() as conn:  # what an older senddock let `campaign create` store
        conn.execute(f"UPDATE campaigns SET {column} = 'news@example.com, other@example.com' WHERE id = %s",
                     (campaign_id,))
    with running_node(app.config):
        wait_for(lambda: _campaign(app, campaign_id)[0] != "sending", 60, "the campaign to pause")
    status, reason = _campaign(app, campaign_id)
    assert status == "paused" and reason.startswith(
        f"template_error: {field}: the campaign's {header} 'news@example.com, other@example.com' is not usable: ")
    assert smtp_sink.received == []
    assert {s for s, _, _ in jobs_by_email(app, campaign_id).values()} == {"pending"}
    warning = app.campaign_status(campaign_id).warning
    option = "--from" if field == "from" else "--reply-to"
    assert f"`senddock campaign clone {campaign_id}`" in warning and f"edit NEW_ID {option} ADDR" in warning
    app.close()
