"""`campaign edit`, `clone` and `delete`: fixing a campaign instead of burning its id.

Through the real console script (a subprocess) on a real Postgres; the state around it is made
through the Python API on the same database.
"""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pytest

from senddock.domain import campaigns as core_campaigns
from senddock.errors import InvalidInput
from senddock.sink import FailRule, Sink
from senddock.testing import drain, fast_settings
from tests_support import senddock_executable, wait_for

pytestmark = pytest.mark.usefixtures("in_test_folder")  # the in-process commands' relative paths

# Every table that holds rows of a campaign or its broadcast (the schema's migrations).
BROADCAST_TABLES = ("broadcast_jobs", "delivery_attempts", "delivery_events", "claim_floors", "claim_putbacks",
                    "pending_bounces")


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "senddock.yaml"
    path.write_text("logging:\n  level: warning\n", encoding="utf-8")
    return path


@pytest.fixture
def app(make_config, config_path):
    from senddock.api import Senddock

    sd = Senddock(make_config({"logging": {"level": "warning"}}))
    sd.create_list("news")
    sd.create_list("vip")
    for email in ("ada@example.com", "bob@example.com"):
        sd.add_subscriber(email, name=email.split("@")[0].title(), lists=["news"])
    try:
        yield sd
    finally:
        sd.close()


def draft(app, **overrides) -> int:
    fields = {"name": "Launch", "lists": ["news"], "subject": "Helo", "from_addr": "News <news@example.com>",
              "text_body": "Hello {{ subscriber.name }}"}
    return app.create_campaign(**{**fields, **overrides})


def rows(dsn: str, sql: str, *params):
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchall()


def test_edit_changes_a_draft_and_says_what_changed(app, cli, config_path, tmp_path):
    cid = draft(app)
    body = tmp_path / "body.txt"
    body.write_text("Hello {{ subscriber.name }},\nthe launch is today.\n", encoding="utf-8")
    edited = cli("campaign", "edit", cid, "--subject", "Hello", "--text", body, "--list", "news",
                          "--list", "vip", "--reply-to", "Help <help@example.com>", "-c", config_path, "--json")
    assert edited.exit_code == 0, edited.stderr
    assert edited.json == {"id": cid, "changed": ["subject", "reply_to", "text", "lists"]}
    campaign = app.campaign(cid)
    assert (campaign.subject, campaign.text_body, campaign.lists, campaign.reply_to, campaign.status) == (
        "Hello", body.read_text(), ["news", "vip"], "Help <help@example.com>", "draft")

    human = cli("campaign", "edit", cid, "--name", "Launch day", "--reply-to", "", "--subject", "Hello",
                         "-c", config_path)
    assert human.exit_code == 0, human.stderr
    assert human.stdout.splitlines() == [
        f"campaign {cid}: changed name, reply_to",
        "  name: 'Launch' -> 'Launch day'",
        "  reply-to: 'Help <help@example.com>' -> none",
    ]
    same = cli("campaign", "edit", cid, "--subject", "Hello", "-c", config_path)
    assert (same.exit_code, same.stdout) == (0, f"campaign {cid}: nothing changed (it already had that content)\n")
    # The edited campaign is what is sent.
    assert app.send_campaign(cid).enqueued == 2


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--text", "bad.txt", "--text: template error, line 2: unexpected '}'"),
    ("--from", "not an address", "--from 'not an address': not an address"),
    ("--list", "nope", "no list named 'nope'"),
    ("--subject", " ", "--subject: a campaign needs a subject"),
])
def test_edit_checks_the_new_content_as_create_does(app, cli, config_path, tmp_path, option, value, message):
    cid = draft(app)
    (tmp_path / "bad.txt").write_text("Hello\n{{ subscriber.name }\n", encoding="utf-8")
    (tmp_path / "good.txt").write_text("Hello {{ subscriber.name }}\n", encoding="utf-8")
    before = app.campaign(cid)
    refused = cli("campaign", "edit", cid, option, value, "-c", config_path)
    assert refused.exit_code == 1
    assert message in refused.stderr and "Traceback" not in refused.stderr
    assert app.campaign(cid) == before  # nothing half-changed
    create = {"--name": "x", "--list": "news", "--subject": "Hi", "--from": "a@example.com", "--text": "good.txt",
              option: value}
    created = cli("campaign", "create", *[a for item in create.items() for a in item], "-c", config_path)
    assert created.exit_code == 1 and message in created.stderr


def test_create_and_edit_share_one_check(app, cli, config_path, tmp_path):
    """The template-variable check of create holds for edit too: one function, check_draft."""
    cid = draft(app)
    body = tmp_path / "guess.txt"
    body.write_text("Hello {{ name }}\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"'name' is not a variable \(did you mean subscriber.name\?\)"):
        draft(app, text_body=body.read_text(encoding="utf-8"))
    refused = cli("campaign", "edit", cid, "--text", body, "-c", config_path)
    assert refused.exit_code == 1, refused
    assert "--text, line 1: 'name' is not a variable (did you mean subscriber.name?)" in refused.stderr
    assert app.campaign(cid).text_body != body.read_text(encoding="utf-8")  # nothing changed


def test_edit_without_options_is_a_usage_error(app, cli, config_path):
    cid = draft(app)
    result = cli("campaign", "edit", cid, "-c", config_path, "--json")
    assert result.exit_code == 2
    assert result.json["error"].startswith("campaign edit: nothing to change: give at least one of --name")


def test_a_sent_or_scheduled_campaign_cannot_be_edited_but_can_be_cloned(app, cli, config_path):
    sent = draft(app, lists=["news", "vip"], reply_to="help@example.com", html_body="<p>Hi</p>")
    app.send_campaign(sent)
    refused = cli("campaign", "edit", sent, "--subject", "Hello", "-c", config_path)
    assert refused.exit_code == 1
    assert refused.stderr.strip() == (
        f"senddock: error: campaign {sent} is sending and was sent (broadcast {app.campaign(sent).broadcast_id}): "
        f"only a draft can be edited; to send a fixed version, make a draft copy with "
        f"`senddock campaign clone {sent}` and edit that")

    scheduled = draft(app)
    app.send_campaign(scheduled, send_at=datetime(2099, 1, 1, tzinfo=timezone.utc))
    later = cli("campaign", "edit", scheduled, "--subject", "Hello", "-c", config_path)
    assert later.exit_code == 1
    assert f"campaign {scheduled} is scheduled for 2099-01-01T00:00:00+00:00" in later.stderr
    assert f"`senddock campaign cancel {scheduled}`" in later.stderr
    assert f"`senddock campaign clone {scheduled}`" in later.stderr

    cloned = cli("campaign", "clone", sent, "-c", config_path, "--json")
    assert cloned.exit_code == 0, cloned.stderr
    copy_id = cloned.json["id"]
    assert cloned.json == {"id": copy_id, "cloned_from": sent} and copy_id not in (sent, scheduled)
    original, copy = app.campaign(sent), app.campaign(copy_id)
    assert copy.status == "draft" and copy.broadcast_id is None
    assert copy.name == "Launch (copy)"
    content = ("subject", "from_addr", "reply_to", "text_body", "html_body", "lists")
    assert [getattr(copy, f) for f in content] == [getattr(original, f) for f in content]
    named = cli("campaign", "clone", sent, "--name", "Launch, fixed", "-c", config_path)
    assert named.exit_code == 0 and app.campaign(int(named.stdout)).name == "Launch, fixed"
    assert cli("campaign", "edit", copy_id, "--subject", "Fixed", "-c", config_path).exit_code == 0
    assert app.send_campaign(copy_id).enqueued == 2  # ada and bob: news and vip reach the same two

    missing = cli("campaign", "clone", 999, "-c", config_path)
    assert (missing.exit_code, missing.stderr.strip()) == (1, "senddock: error: no campaign with id 999")


def test_delete_a_draft_and_a_scheduled_campaign(app, cli, config_path, database_dsn):
    cid = draft(app, lists=["news", "vip"])
    deleted = cli("campaign", "delete", cid, "-c", config_path)
    assert (deleted.exit_code, deleted.stdout) == (0, f"deleted campaign {cid} (draft)\n")
    assert rows(database_dsn, "SELECT count(*) FROM campaign_lists") == [(0,)]

    scheduled = draft(app)
    broadcast = app.send_campaign(scheduled, send_at=datetime(2099, 1, 1, tzinfo=timezone.utc)).broadcast_id
    result = cli("campaign", "delete", scheduled, "-c", config_path, "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json == {"id": scheduled, "status": "scheduled", "broadcast_id": broadcast, "lists": 1, "jobs": 2,
                           "delivery_attempts": 0, "delivery_events": 0, "claim_floors": 0, "campaign_events": 1,
                           "suppressions_kept": 0}
    assert rows(database_dsn, "SELECT count(*) FROM broadcasts") == [(0,)]
    assert rows(database_dsn, "SELECT count(*) FROM broadcast_jobs") == [(0,)]
    gone = cli("campaign", "delete", scheduled, "-c", config_path)
    assert (gone.exit_code, gone.stderr.strip()) == (1, f"senddock: error: no campaign with id {scheduled}")


def test_delete_a_sent_campaign_needs_force_and_keeps_its_suppressions(make_config, cli, database_dsn,
                                                                         tmp_path):
    from senddock.api import Senddock

    with Sink("127.0.0.1", 0, rules=[FailRule.parse("bounce*@*=550 5.1.1 no such user")]) as sink:
        settings = fast_settings(sink.port)
        config = make_config(settings)
        with Senddock(config) as app:
            app.create_list("news")
            for email in ("ada@example.com", "bob@example.com", "bounce@example.com"):
                app.add_subscriber(email, lists=["news"])
            doomed = draft(app)
            kept = draft(app, name="Kept")  # another campaign's rows must stay
            broadcast = app.send_campaign(doomed).broadcast_id
            drain(config)
            assert app.send_campaign(kept).skipped_suppressed == 1  # the bounce of `doomed` protects the list
            drain(config)
    with psycopg.connect(database_dsn) as conn:  # a provider's notification about one of its messages
        conn.execute("INSERT INTO delivery_events (event_key, job_id, broadcast_id, email, kind, suppresses, "
                     "hooks_done) SELECT 'delivery-1', id, broadcast_id, email, 'delivery', false, true "
                     "FROM broadcast_jobs WHERE broadcast_id = %s AND email = 'ada@example.com'", (broadcast,))
    before = {t: rows(database_dsn, f"SELECT count(*) FROM {t} WHERE broadcast_id <> %s", broadcast) for t in BROADCAST_TABLES}
    config_path = config.path

    refused = cli("campaign", "delete", doomed, "-c", config_path)
    assert refused.exit_code == 1
    attempts = rows(database_dsn, "SELECT count(*) FROM delivery_attempts WHERE broadcast_id = %s", broadcast)[0][0]
    assert refused.stderr.strip() == (
        f"senddock: error: campaign {doomed} is finished: deleting it removes its delivery history (broadcast "
        f"{broadcast}: 3 jobs, 2 sent, {attempts} delivery attempts, 1 provider event); add --force to "
        "delete it anyway (the 1 suppression its bounces made is kept)")

    forced = cli("campaign", "delete", doomed, "--force", "-c", config_path, "--json")
    assert forced.exit_code == 0, forced.stderr
    removed = forced.json
    assert removed.pop("claim_floors") >= 1  # the poll raised the broadcast's claim floor while it drained
    assert removed.pop("campaign_events") == 2  # draft -> sending -> finished
    assert removed == {"id": doomed, "status": "finished", "broadcast_id": broadcast, "lists": 1, "jobs": 3,
                       "delivery_attempts": attempts, "delivery_events": 1, "suppressions_kept": 1}
    for table in BROADCAST_TABLES:
        assert rows(database_dsn, f"SELECT count(*) FROM {table} WHERE broadcast_id = %s", broadcast) == [(0,)], table
        assert rows(database_dsn, f"SELECT count(*) FROM {table} WHERE broadcast_id <> %s", broadcast) == before[table]
    assert rows(database_dsn, "SELECT id FROM campaigns") == [(kept,)]
    assert rows(database_dsn, "SELECT count(*) FROM pg_class WHERE relname IN (%s, %s)",
                f"broadcast_jobs_b{broadcast}", f"delivery_attempts_b{broadcast}") == [(0,)]  # its partitions gone too
    assert rows(database_dsn, "SELECT DISTINCT campaign_id FROM campaign_events") == [(kept,)]
    # The bounce's suppression protects the list still: the next campaign skips the address.
    assert rows(database_dsn, "SELECT email, reason FROM suppressions") == [("bounce@example.com", "bounced")]


def test_delete_refuses_a_live_campaign_in_flight_sends_and_unapplied_bounces(app, cli, config_path,
                                                                              database_dsn):
    cid = draft(app)
    broadcast = app.send_campaign(cid).broadcast_id
    for force in ([], ["--force"]):
        live = cli("campaign", "delete", cid, *force, "-c", config_path)
        assert live.exit_code == 1
        assert live.stderr.strip() == (
            f"senddock: error: campaign {cid} is sending: its jobs may be in flight on any node; cancel it first "
            f"(`senddock campaign cancel {cid}`), then delete it with --force")
    app.pause_campaign(cid)
    assert "is paused: its jobs may be in flight" in cli("campaign", "delete", cid, "--force",
                                                                  "-c", config_path).stderr
    with psycopg.connect(database_dsn) as conn:
        # A send that began before the cancel: a node claimed it and is talking to the relay.
        conn.execute("UPDATE broadcast_jobs SET status = 'sending', claimed_by = gen_random_uuid() "
                     "WHERE broadcast_id = %s AND email = 'ada@example.com'", (broadcast,))
    app.cancel_campaign(cid)
    in_flight = cli("campaign", "delete", cid, "--force", "-c", config_path)
    assert in_flight.exit_code == 1
    assert "1 of its sends are still in flight: wait for them to finish" in in_flight.stderr
    with psycopg.connect(database_dsn) as conn:
        # It bounced; its node died before the on_bounced hooks suppressed the address.
        conn.execute("UPDATE broadcast_jobs SET status = 'failed', failure_reason = 'bounced' "
                     "WHERE broadcast_id = %s AND status = 'sending'", (broadcast,))
        conn.execute("INSERT INTO pending_bounces (job_id, broadcast_id, campaign_id, email, code) "
                     "SELECT id, broadcast_id, %s, email, 550 FROM broadcast_jobs WHERE broadcast_id = %s "
                     "AND email = 'ada@example.com'", (cid, broadcast))
    unapplied = cli("campaign", "delete", cid, "--force", "-c", config_path)
    assert unapplied.exit_code == 1
    assert f"campaign {cid}: 1 of its bounces are not yet applied to the suppression list" in unapplied.stderr
    assert rows(database_dsn, "SELECT count(*) FROM broadcast_jobs WHERE broadcast_id = %s", broadcast) == [(2,)]
    with psycopg.connect(database_dsn) as conn:
        conn.execute("DELETE FROM pending_bounces")  # the hooks ran
    assert cli("campaign", "delete", cid, "--force", "-c", config_path).exit_code == 0


@pytest.mark.parametrize("command", [["edit", "--subject", "Changed"], ["delete"]])
def test_edit_or_delete_racing_a_send_waits_for_it_and_refuses(app, config_path, database_dsn, command):
    """Two nodes: `campaign send` is enqueueing (its transaction open) when an edit or a delete arrives."""
    cid = draft(app)
    with psycopg.connect(database_dsn) as sending:
        with sending.transaction():
            core_campaigns.send_campaign(sending, cid)  # the row is locked until this commits
            racer = subprocess.Popen([senddock_executable(), "campaign", command[0], str(cid), *command[1:],
                                      "-c", str(config_path)], env={**os.environ, "SENDDOCK_DATABASE_URL": database_dsn},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

            def waiting_for_the_lock() -> bool:
                return bool(rows(database_dsn, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                               "AND datname = current_database()"))

            # It acts on nothing while the send is undecided (or it finishes first: the test fails below).
            wait_for(lambda: waiting_for_the_lock() or racer.poll() is not None, 30,
                     f"`campaign {command[0]}` to wait for the campaign's row")
        stdout, stderr = racer.communicate(timeout=30)
    assert racer.returncode == 1, stderr
    assert f"campaign {cid} is sending" in stderr
    campaign = app.campaign(cid)
    assert (campaign.subject, campaign.status) == ("Helo", "sending")
    assert rows(database_dsn, "SELECT count(*) FROM broadcast_jobs WHERE broadcast_id = %s",
                campaign.broadcast_id) == [(2,)]


def test_delete_knows_every_table_that_refers_to_a_campaign_or_a_broadcast(database_dsn):
    """A migration that adds a table keyed by campaign or broadcast must decide what delete does with it."""
    found = rows(database_dsn, "SELECT c.table_name, c.column_name FROM information_schema.columns c "
                               "JOIN information_schema.tables t USING (table_schema, table_name) "
                               "WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE' "
                               "AND c.column_name IN ('campaign_id', 'broadcast_id', 'source_broadcast_id')")
    handled = {(table, "broadcast_id") for table in BROADCAST_TABLES} | {
        ("campaign_lists", "campaign_id"),  # deleted with the campaign
        ("campaign_events", "campaign_id"),  # its status history: deleted with it
        ("broadcasts", "campaign_id"),  # deleted with it, in the same statement (the FKs point both ways)
        ("campaigns", "broadcast_id"),
        ("pending_bounces", "campaign_id"),  # a delete waits until none is left
        ("suppressions", "source_broadcast_id"),  # kept: they protect the list
        ("inbound_mail", "broadcast_id"),  # kept: what came back by mail was read; read again, a replay
    }
    assert set(found) == handled
