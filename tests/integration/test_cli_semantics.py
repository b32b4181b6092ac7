"""What a newcomer found the CLI doing wrong with well-meant input: a list or trailing words taken
as a From, a schedule lost on resume, a past --at sending at once, a typo'd requeue reason taken as
"0 jobs", a cancelled draft needing --force, a send to nobody using up the campaign.

In-process CLI (the ``cli`` fixture) on a real Postgres; state around it made through the API.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest


@pytest.fixture
def body(tmp_path: Path) -> Path:
    path = tmp_path / "body.txt"
    path.write_text("Hello {{ subscriber.name }}", encoding="utf-8")
    return path


@pytest.fixture
def news(cli, config_file: Path, tmp_path: Path) -> str:
    """A list 'news' of three subscribers."""
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0
    csv = tmp_path / "people.csv"
    csv.write_text("email,name\nada@example.com,Ada\nbob@example.com,Bob\ncy@example.com,Cy\n", encoding="utf-8")
    assert cli("subscribers", "import", csv, "--list", "news", "-c", config_file).exit_code == 0
    return "news"


def create(cli, config_file: Path, body: Path, *extra: str, list_name: str = "news"):
    return cli("campaign", "create", "--name", "Launch", "--list", list_name, "--subject", "Hi",
               "--text", body, "-c", config_file, *extra)


def campaign(cli, config_file: Path, body: Path, list_name: str = "news") -> int:
    made = create(cli, config_file, body, "--from", "News <news@example.com>", "--json", list_name=list_name)
    assert made.exit_code == 0, made.stderr
    return made.json["id"]


def sql(dsn: str, statement: str, *params):
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


# -- 1. --from and --reply-to: exactly one mailbox ---------------------------------------------------

BAD_FROM = [
    ("a@b.com, c@d.com", "one address only, not a list"),
    ("A <a@example.com>, B <b@example.com>", "one address only, not a list"),
    ("news@example.com junk", "more than an address: a display name goes first, the address in angle "
                              "brackets ('Name <addr@domain>')"),
    ("News <news@example.com> junk", "more than an address: nothing may follow the closing '>'"),
    ("not an address", "not an address (write 'addr@domain' or 'Name <addr@domain>')"),
    ("News <news@example.com", "not an address: its angle brackets do not pair up (write 'Name <addr@domain>')"),
    ("Doe, John <j@example.com>", "a display name with ',' must be in double quotes: "
                                  "'\"Doe, John\" <j@example.com>'"),
    ("News <news@example>", "invalid address 'news@example': The part after the @-sign is not valid. It should "
                            "have a period."),
]


@pytest.mark.parametrize(("value", "reason"), BAD_FROM)
def test_create_refuses_a_from_that_is_not_exactly_one_mailbox(cli, config_file, body, news, value, reason):
    made = create(cli, config_file, body, "--from", value)
    assert (made.exit_code, made.stdout) == (1, "")
    assert made.stderr == f"senddock: error: --from {value!r}: {reason}\n"
    assert "Traceback" not in made.stderr
    replied = create(cli, config_file, body, "--from", "news@example.com", "--reply-to", value, "--json")
    assert replied.exit_code == 1
    assert replied.json["error"] == f"--reply-to {value!r}: {reason}"
    assert cli("campaign", "ls", "-c", config_file).stdout == "no campaigns yet\n"


@pytest.mark.parametrize("value", ["News <news@example.com>", "news@example.com", '"Doe, John" <news@example.com>',
                                   "J. Doe <news@example.com>", "Zoë Ångström <news@example.com>"])
def test_one_mailbox_is_taken_as_given_and_is_the_from_header(cli, config_file, body, news, value):
    made = create(cli, config_file, body, "--from", value, "--json")
    assert made.exit_code == 0, made.stderr
    preview = cli("campaign", "preview", made.json["id"], "-c", config_file, "--json")
    assert preview.exit_code == 0, preview.stderr
    assert preview.json["headers"]["From"].endswith("<news@example.com>") or \
        preview.json["headers"]["From"] == "news@example.com"
    assert "@example.com>" in preview.json["headers"]["Message-ID"]


def test_edit_refuses_a_list_as_from_and_as_reply_to(cli, config_file, body, news):
    cid = campaign(cli, config_file, body)
    for option in ("--from", "--reply-to"):
        edited = cli("campaign", "edit", cid, option, "a@b.com, c@d.com", "-c", config_file)
        assert (edited.exit_code, edited.stderr) == (
            1, f"senddock: error: {option} 'a@b.com, c@d.com': one address only, not a list\n")
    assert cli("campaign", "preview", cid, "-c", config_file, "--json").json["headers"]["From"] == \
        "News <news@example.com>"


@pytest.mark.parametrize(("column", "header", "option", "stored", "reason"), [
    ("from_addr", "From", "--from", "a@b.com, c@d.com", "one address only, not a list"),
    ("from_addr", "From", "--from", "news@example.com junk", "cannot be read as one address (write 'Name <addr@domain>')"),
    ("reply_to", "Reply-To", "--reply-to", "a@b.com, c@d.com", "one address only, not a list"),
])
def test_a_bad_from_stored_before_the_check_is_one_line_at_preview_send_test_and_send(
        cli, config_file, body, news, database_dsn, column, header, option, stored, reason):
    cid = campaign(cli, config_file, body)
    sql(database_dsn, f"UPDATE campaigns SET {column} = %s WHERE id = %s", stored, cid)
    line = f"its {header} {stored!r} is not usable: {reason}; edit the campaign with another {option}"
    for argv, prefix in ((("campaign", "preview", cid), f"campaign {cid}"),
                         (("send-test", "--campaign", cid, "--to", "me@example.com"), f"campaign {cid}"),
                         (("campaign", "send", cid, "--no-unsubscribe"), f"campaign {cid} not sent")):
        result = cli(*argv, "-c", config_file)
        assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"senddock: error: {prefix}: {line}\n")
    assert sql(database_dsn, "SELECT status, broadcast_id FROM campaigns WHERE id = %s", cid) == [("draft", None)]
    fixed = cli("campaign", "edit", cid, option, "news@example.com", "-c", config_file)
    assert fixed.exit_code == 0, fixed.stderr
    assert cli("campaign", "preview", cid, "-c", config_file).exit_code == 0


def test_a_stored_from_an_older_senddock_sent_keeps_working_after_the_upgrade(cli, config_file, body, news,
                                                                             database_dsn):
    # RFC 5322's comment form: `campaign create` now asks for `Name <addr>`, but a campaign stored
    # with it must not stop sending when senddock is upgraded under it.
    cid = campaign(cli, config_file, body)
    sql(database_dsn, "UPDATE campaigns SET from_addr = %s WHERE id = %s", "news@example.com (Example News)", cid)
    preview = cli("campaign", "preview", cid, "-c", config_file, "--json")
    assert preview.exit_code == 0, preview.stderr
    assert "news@example.com" in preview.json["headers"]["From"]


# -- 2. resuming a campaign paused before its time keeps its time --------------------------------------

def test_resuming_a_paused_scheduled_campaign_waits_for_its_time(cli, config_file, body, news, smtp_sink,
                                                                 database_dsn):
    import threading
    import time

    import yaml

    from senddock.loading import load_config
    from senddock.core.runner import Runner
    from senddock.testing import fast_settings
    from tests_support import wait_for

    config_file.write_text(yaml.safe_dump(fast_settings(smtp_sink.port)), encoding="utf-8")
    cid = campaign(cli, config_file, body)
    at = (datetime.now(timezone.utc) + timedelta(seconds=4)).replace(microsecond=0)
    runner = Runner(load_config(config_file))  # a node polling all along: it starts what is due
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        assert cli("campaign", "send", cid, "--at", at.isoformat(), "--no-unsubscribe", "-c", config_file
                   ).exit_code == 0
        assert cli("campaign", "pause", cid, "-c", config_file).exit_code == 0
        resumed = cli("campaign", "resume", cid, "-c", config_file)
        assert resumed.exit_code == 0, resumed.stderr
        assert resumed.stdout == (f"campaign {cid}: resumed; scheduled for {at.astimezone().isoformat()}: "
                                  "3 recipients enqueued, nothing is sent before then\n")
        as_json = cli("campaign", "status", cid, "-c", config_file, "--json").json
        assert (as_json["status"], as_json["pending"]) == ("scheduled", 3)
        while datetime.now(timezone.utc) < at - timedelta(milliseconds=300):
            assert smtp_sink.received == [], "the resumed campaign was sent before its time"
            time.sleep(0.1)
        wait_for(lambda: sql(database_dsn, "SELECT status FROM campaigns WHERE id = %s", cid) == [("finished",)],
                 30, "the resumed campaign to be sent at its time")
    finally:
        runner.request_stop()
        thread.join(30)
    assert sorted(m.recipients[0] for m in smtp_sink.received) == ["ada@example.com", "bob@example.com",
                                                                    "cy@example.com"]
    [(first, started)] = sql(database_dsn, "SELECT min(a.started_at), c.started_at FROM delivery_attempts a, "
                                           "campaigns c WHERE c.id = %s GROUP BY c.started_at", cid)
    assert first >= at and started >= at


def test_resuming_after_its_time_passed_while_paused_sends_now(cli, config_file, body, news, database_dsn):
    cid = campaign(cli, config_file, body)
    later = (datetime.now(timezone.utc) + timedelta(hours=2)).isoformat()
    assert cli("campaign", "send", cid, "--at", later, "--no-unsubscribe", "-c", config_file).exit_code == 0
    assert cli("campaign", "pause", cid, "-c", config_file).exit_code == 0
    sql(database_dsn, "UPDATE campaigns SET send_at = now() - interval '1 minute' WHERE id = %s", cid)
    resumed = cli("campaign", "resume", cid, "-c", config_file)
    assert resumed.stdout == f"campaign {cid}: resumed; now sending: 0 sent, 0 failed, 3 to go\n"
    [(status, started)] = sql(database_dsn, "SELECT status, started_at FROM campaigns WHERE id = %s", cid)
    assert status == "sending" and started is not None


# -- 3. --at in the past -------------------------------------------------------------------------------

def test_send_at_a_time_in_the_past_is_refused_and_changes_nothing(cli, config_file, body, news, database_dsn):
    cid = campaign(cli, config_file, body)
    then = datetime(2020, 1, 1, 9, tzinfo=timezone.utc)
    years = int((datetime.now(timezone.utc) - then).total_seconds() // (365 * 86400))
    refused = cli("campaign", "send", cid, "--at", "2020-01-01T09:00:00+00:00", "--no-unsubscribe", "-c", config_file)
    assert (refused.exit_code, refused.stdout) == (2, "")
    assert refused.stderr == (f"senddock: error: --at 2020-01-01T09:00:00+00:00 is in the past ({years} years ago): "
                              "leave --at out to send now\n")
    minutes = (datetime.now(timezone.utc) - timedelta(minutes=5)).isoformat(timespec="seconds")
    as_json = cli("campaign", "send", cid, "--at", minutes, "--no-unsubscribe", "-c", config_file, "--json")
    assert as_json.exit_code == 2
    assert as_json.json["error"] == f"--at {minutes} is in the past (5 minutes ago): leave --at out to send now"
    assert sql(database_dsn, "SELECT status, broadcast_id FROM campaigns WHERE id = %s", cid) == [("draft", None)]


def test_send_at_a_few_seconds_ago_is_clock_skew_and_sends_now(cli, config_file, body, news, database_dsn):
    cid = campaign(cli, config_file, body)
    just_now = (datetime.now(timezone.utc) - timedelta(seconds=5)).isoformat()
    sent = cli("campaign", "send", cid, "--at", just_now, "--no-unsubscribe", "-c", config_file)
    assert sent.exit_code == 0, sent.stderr
    assert "scheduled" not in sent.stdout and "enqueued 3 recipients" in sent.stdout
    assert sql(database_dsn, "SELECT status FROM campaigns WHERE id = %s", cid) == [("sending",)]


# -- 4. requeue of a reason nothing failed for ---------------------------------------------------------

def test_requeue_of_a_reason_nothing_failed_for_is_refused_listing_the_reasons_there_are(
        cli, config_file, body, news, database_dsn):
    cid = campaign(cli, config_file, body)
    assert cli("campaign", "send", cid, "--no-unsubscribe", "-c", config_file).exit_code == 0
    nothing = cli("campaign", "requeue", cid, "--reason", "foo", "-c", config_file)
    assert (nothing.exit_code, nothing.stdout) == (1, "")
    assert nothing.stderr == (f"senddock: error: --reason foo: campaign {cid} has no jobs that failed as foo; "
                              "it has no failed jobs at all\n")
    for email, reason in (("ada@example.com", "rejected"), ("bob@example.com", "bounced")):
        sql(database_dsn, "UPDATE broadcast_jobs SET status = 'failed', failure_reason = %s WHERE email = %s",
            reason, email)
    typo = cli("campaign", "requeue", cid, "--reason", "rejectd", "-c", config_file, "--json")
    assert typo.exit_code == 1
    assert typo.json["error"] == (f"--reason rejectd: campaign {cid} has no jobs that failed as rejectd; its failed "
                                  "jobs by reason: rejected 1; never requeued (about the address itself): bounced 1")
    assert sql(database_dsn, "SELECT email, status FROM broadcast_jobs WHERE status <> 'pending' ORDER BY email") == [
        ("ada@example.com", "failed"), ("bob@example.com", "failed")]
    fixed = cli("campaign", "requeue", cid, "--reason", "rejected", "-c", config_file)
    assert (fixed.exit_code, fixed.stdout) == (
        0, f"campaign {cid}: requeued 1 job that failed as rejected; now sending: 0 sent, 1 failed, 2 to go\n")
    only_never = cli("campaign", "requeue", cid, "--reason", "rejected", "-c", config_file)
    assert only_never.stderr == (f"senddock: error: --reason rejected: campaign {cid} has no jobs that failed as "
                                 "rejected; its failed jobs by reason: none that can be requeued; never requeued "
                                 "(about the address itself): bounced 1\n")


# -- 5. delete: no --force when there is nothing to lose, no None, no internal tables ------------------

def test_a_draft_cancelled_before_it_was_sent_is_deleted_without_force(cli, config_file, body, news, database_dsn):
    cid = campaign(cli, config_file, body)
    assert cli("campaign", "cancel", cid, "-c", config_file).exit_code == 0
    deleted = cli("campaign", "delete", cid, "-c", config_file)
    assert (deleted.exit_code, deleted.stdout, deleted.stderr) == (0, f"deleted campaign {cid} (cancelled)\n", "")
    assert sql(database_dsn, "SELECT count(*) FROM campaigns") == [(0,)]


def test_delete_force_speaks_of_what_a_person_knows(cli, config_file, body, news, database_dsn):
    cid = campaign(cli, config_file, body)
    assert cli("campaign", "send", cid, "--no-unsubscribe", "-c", config_file).exit_code == 0
    assert cli("campaign", "cancel", cid, "-c", config_file).exit_code == 0
    [(broadcast,)] = sql(database_dsn, "SELECT broadcast_id FROM campaigns WHERE id = %s", cid)
    refused = cli("campaign", "delete", cid, "-c", config_file)
    assert (refused.exit_code, refused.stderr) == (1, (
        f"senddock: error: campaign {cid} is cancelled: deleting it removes its delivery history (broadcast "
        f"{broadcast}: 3 jobs, 0 sent, 0 delivery attempts, 0 provider events); add --force to delete it anyway\n"))
    forced = cli("campaign", "delete", cid, "--force", "-c", config_file)
    assert (forced.exit_code, forced.stdout) == (0, f"deleted campaign {cid} (cancelled): broadcast {broadcast}, "
                                                    "3 jobs, 0 delivery attempts, 0 provider events, 2 status "
                                                    "changes\n")
    for text in (refused.stderr, forced.stdout):
        assert "None" not in text and "claim floor" not in text


# -- 6. a send to nobody is refused, the campaign stays a draft ----------------------------------------

def test_a_send_with_nobody_to_enqueue_is_refused_and_leaves_a_draft(cli, config_file, body, news, database_dsn,
                                                                     tmp_path):
    assert cli("lists", "create", "empty", "-c", config_file).exit_code == 0
    cid = campaign(cli, config_file, body, list_name="empty")
    empty = cli("campaign", "send", cid, "--no-unsubscribe", "-c", config_file)
    assert (empty.exit_code, empty.stdout, empty.stderr) == (1, "", (
        f"senddock: error: campaign {cid} not sent: nobody to send to, its list empty has no subscribers; "
        "it is still a draft\n"))

    gone = campaign(cli, config_file, body)  # news: ada, bob, cy
    assert cli("suppressions", "add", "ada@example.com", "-c", config_file).exit_code == 0
    for email in ("bob@example.com", "cy@example.com"):
        assert cli("subscribers", "unsubscribe", email, "-c", config_file).exit_code == 0
    skipped = cli("campaign", "send", gone, "--no-unsubscribe", "-c", config_file, "--json")
    assert skipped.exit_code == 1
    assert skipped.json["error"] == (f"campaign {gone} not sent: nobody to send to, all 3 subscribers of its list "
                                     "news would be skipped (1 suppressed, 2 unsubscribed or blocklisted); it is "
                                     "still a draft")
    assert sql(database_dsn, "SELECT status, broadcast_id, finished_at FROM campaigns ORDER BY id") == [
        ("draft", None, None), ("draft", None, None)]
    assert sql(database_dsn, "SELECT count(*) FROM broadcasts") == [(0,)]

    csv = tmp_path / "more.csv"
    csv.write_text("email,name\ndee@example.com,Dee\n", encoding="utf-8")
    assert cli("subscribers", "import", csv, "--list", "empty", "-c", config_file).exit_code == 0
    sent = cli("campaign", "send", cid, "--no-unsubscribe", "-c", config_file)
    assert sent.exit_code == 0, sent.stderr
    assert sql(database_dsn, "SELECT status FROM campaigns WHERE id = %s", cid) == [("sending",)]
    assert sent.stdout.startswith(f"campaign {cid}: broadcast ") and " enqueued 1 recipient, skipped 0 " in sent.stdout


# -- 7. counts agree with their nouns; a draft is "a draft" ---------------------------------------------

def test_counts_of_one_and_a_draft_read_as_english(cli, config_file, body, news, tmp_path):
    supp = tmp_path / "supp.csv"
    supp.write_text("email\nzed@example.com\nbroken\n", encoding="utf-8")
    imported = cli("suppressions", "import", supp, "-c", config_file)
    assert (imported.exit_code, imported.stdout) == (1, "1 suppressed, 0 already were, 1 row rejected\n")
    exported = cli("suppressions", "export", tmp_path / "out.csv", "-c", config_file)
    assert exported.stdout == f"1 address written to {tmp_path / 'out.csv'}\n"

    cid = campaign(cli, config_file, body)
    for action in ("pause", "resume"):
        refused = cli("campaign", action, cid, "-c", config_file)
        assert refused.exit_code == 1 and f"campaign {cid} is a draft" in refused.stderr, refused.stderr
    requeue = cli("campaign", "requeue", cid, "--reason", "rejected", "-c", config_file)
    assert requeue.stderr == (f"senddock: error: campaign {cid} is a draft: only a sending, paused or finished "
                              "campaign can be requeued\n")
    assert cli("subscribers", "unsubscribe", "bob@example.com", "-c", config_file).exit_code == 0
    assert cli("subscribers", "unsubscribe", "cy@example.com", "-c", config_file).exit_code == 0
    assert cli("campaign", "send", cid, "--no-unsubscribe", "-c", config_file).exit_code == 0
    status = cli("campaign", "status", cid, "-c", config_file)
    assert status.stdout.splitlines()[1].endswith(": 1 recipient, 2 skipped")
    cancelled = cli("campaign", "cancel", cid, "-c", config_file)
    assert cancelled.stdout == (f"campaign {cid}: cancelled, 1 unsent job failed as cancelled; now cancelled: "
                                "0 sent, 1 failed, 0 to go\n")


def test_sending_a_draft_cancelled_before_it_was_sent_says_so_without_none(cli, config_file, body, news):
    cid = campaign(cli, config_file, body)
    assert cli("campaign", "cancel", cid, "-c", config_file).exit_code == 0
    refused = cli("campaign", "send", cid, "--no-unsubscribe", "-c", config_file)
    assert (refused.exit_code, refused.stderr) == (1, (
        f"senddock: error: campaign {cid} is cancelled (it was never sent): `senddock campaign clone {cid}` makes a "
        "draft of it to send\n"))
