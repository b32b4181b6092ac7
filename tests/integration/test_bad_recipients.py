"""A line break in a subscriber's name: made one line at import, and if one reaches the database
another way, that one job fails as bad_address; the relay never sees it, nothing pauses."""

from __future__ import annotations

from pathlib import Path

from tests_support import jobs_by_email, suppressed, write_config

from senddock.api import Senddock
from senddock.testing import drain, fast_settings

GOOD = [f"user{i}@example.com" for i in range(6)]
# Written into the database directly, as an older senddock, a script or a hand edit could.
LEFTOVERS = {
    "crlf@example.com": ("crlf@example.com", "Eve\r\nBcc: victim@example.com"),
    "bell@example.com": ("bell@example.com", "Bell\x07"),
    "lf-in-address": ("lf@example.com\nBcc: victim@example.com", "Lf"),
    "cr-in-address": ("cr@example.com\r", "Cr"),
}


def _add_leftovers(app: Senddock, list_name: str = "news") -> None:
    with app.db.connection() as conn:
        list_id = conn.execute("SELECT id FROM lists WHERE name = %s", (list_name,)).fetchone()[0]
        for email, name in LEFTOVERS.values():
            subscriber_id = conn.execute("INSERT INTO subscribers (email, name) VALUES (%s, %s) RETURNING id",
                                         (email, name)).fetchone()[0]
            conn.execute("INSERT INTO list_members (list_id, subscriber_id) VALUES (%s, %s)", (list_id, subscriber_id))


def test_a_bad_name_fails_its_job_as_bad_address_and_the_broadcast_goes_on(make_config, smtp_sink):
    # One failure in a row not caused by a recipient would pause the campaign: bad addresses must not count.
    app = Senddock(make_config(fast_settings(smtp_sink.port, transport={"name": "smtp", "max_consecutive_failures": 1})))
    app.create_list("news")
    for i, email in enumerate(GOOD):
        app.add_subscriber(email, name=f"User {i}", lists=["news"])
    _add_leftovers(app)
    campaign_id = app.create_campaign(name="c", lists=["news"], subject="Hi {{ subscriber.name }}",
                                      from_addr="news@example.com", text_body="Hello {{ subscriber.name }}")
    app.send_campaign(campaign_id)  # the sample check renders every recipient here: the bad ones do not stop it
    drain(app.config)

    jobs = jobs_by_email(app, campaign_id)
    for email, _ in LEFTOVERS.values():
        assert jobs.pop(email) == ("failed", "bad_address", 1)
    assert jobs == {email: ("sent", None, 1) for email in GOOD}
    status = app.campaign_status(campaign_id)
    assert (status.status, status.paused_reason, status.sent, status.failed) == ("finished", None, 6, 4)
    assert status.failed_by_reason == {"bad_address": 4}
    assert suppressed(app) == {}
    assert sorted(m.recipients[0] for m in smtp_sink.received) == sorted(GOOD)
    with app.db.connection() as conn:
        last = dict(conn.execute("SELECT email, last_result FROM broadcast_jobs WHERE status = 'failed'").fetchall())
        attempts = conn.execute("SELECT count(*) FROM delivery_attempts").fetchone()[0]
    assert last["crlf@example.com"] == (
        r"subscriber crlf@example.com: name 'Eve\r\nBcc: victim@example.com' contains a line break")
    assert last["bell@example.com"] == r"subscriber bell@example.com: name 'Bell\x07' contains a control character"
    assert last["lf@example.com\nBcc: victim@example.com"] == (
        r"address 'lf@example.com\nBcc: victim@example.com' contains a line break")
    assert attempts == 10  # every job's attempt is in the delivery log, the refused ones too
    app.close()


def test_import_reports_each_normalised_name_and_exits_1(cli, tmp_path: Path):
    config = write_config(tmp_path, {"workers": 1})
    assert cli("lists", "create", "news", "-c", config).exit_code == 0
    csv = tmp_path / "people.csv"
    csv.write_bytes(b'email,name\nada@example.com,"Ada\r\nLovelace"\nbob@example.com,Bob\nnul@example.com,"N\x00ul"\n')
    result = cli("subscribers", "import", csv, "--list", "news", "-c", config)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"{csv}:2: name contained a line break; stored as 'Ada Lovelace'",
        f"{csv}:5: name contained a control character; stored as 'N ul'",
    ]
    assert result.stdout == "imported 3, updated 0, unchanged 0, rejected 0, normalised 2\n"
    again = cli("subscribers", "import", csv, "--list", "news", "-c", config, "--json")
    assert again.exit_code == 1
    assert again.json == {"imported": 0, "updated": 0, "unchanged": 3, "rejected": 0, "normalised": 2}
    clean = tmp_path / "clean.csv"
    clean.write_text("email,name\nada@example.com,Ada Lovelace\n")
    assert cli("subscribers", "import", clean, "--list", "news", "-c", config, "--json").json == {
        "imported": 0, "updated": 0, "unchanged": 1, "rejected": 0, "normalised": 0}


def test_preview_of_a_bad_subscriber_is_one_clear_line(cli, make_config, tmp_path: Path):
    app = Senddock(make_config())
    app.create_list("news")
    _add_leftovers(app)
    app.add_subscriber("ada@example.com", name="Ada", lists=["news"])
    campaign_id = app.create_campaign(name="c", lists=["news"], subject="Hi", from_addr="news@example.com",
                                      text_body="Hello")
    app.close()
    config = app.config.path
    bad = cli("campaign", "preview", campaign_id, "--email", "crlf@example.com", "-c", config)
    assert bad.exit_code == 1
    assert bad.stderr == (
        "senddock: error: subscriber crlf@example.com: name 'Eve\\r\\nBcc: victim@example.com' contains a line break\n")
    as_json = cli("campaign", "preview", campaign_id, "--email", "crlf@example.com", "-c", config, "--json")
    assert as_json.exit_code == 1 and as_json.json["ok"] is False and "contains a line break" in as_json.json["error"]
    assert cli("campaign", "preview", campaign_id, "--email", "ada@example.com", "-c", config).exit_code == 0
    test = cli("send-test", "--campaign", campaign_id, "--to", "x@example.com\r\nBcc: victim@example.com",
               "--email", "ada@example.com", "-c", config)
    assert test.exit_code == 2 and test.stderr.startswith("senddock: error: --to: invalid address")
