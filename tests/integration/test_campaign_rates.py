"""A campaign's own rate: `campaign create --rate`, `campaign edit --rate`, `campaign set-rate`,
carried by `campaign clone`, shown by `campaign status` and `ls`, read by the claimer."""

from __future__ import annotations

from dataclasses import replace

import uuid
from pathlib import Path

import psycopg
import pytest
from structlog.testing import capture_logs

from senddock.api import Senddock
from senddock.store.node_identity import NodeIdentity
from senddock.store.jobs import JobQueue
from senddock.errors import InvalidState, UsageError
from senddock.testing import drain, fast_settings
from tests_support import make_broadcast

GRAMMAR = "write N/s, N/min, N/h or N/day, e.g. 20/s"


@pytest.fixture
def create(cli, config_file: Path, tmp_path: Path):
    """`campaign create` to a list of three, with extra options; the CLI's result."""
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0
    csv = tmp_path / "people.csv"
    csv.write_text("email,name\n" + "".join(f"p{i}@example.com,P{i}\n" for i in range(3)), encoding="utf-8")
    assert cli("subscribers", "import", csv, "--list", "news", "-c", config_file).exit_code == 0
    body = tmp_path / "body.txt"
    body.write_text("Hello {{ subscriber.name }}", encoding="utf-8")

    def run(*options: str):
        return cli("campaign", "create", "--name", "Launch", "--list", "news", "--subject", "Hi",
                   "--from", "news@example.com", "--text", body, *options, "-c", config_file, "--json")

    return run


def stored_rate(dsn: str, campaign_id: int) -> str | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT send_rate FROM campaigns WHERE id = %s", (campaign_id,)).fetchone()[0]


def test_create_with_a_rate_stores_it_normalised_and_shows_it(cli, config_file, create, database_dsn):
    created = create("--rate", "0100.0/min")
    assert created.exit_code == 0, created.stderr
    cid = created.json["id"]
    assert stored_rate(database_dsn, cid) == "100/min"  # one spelling per rate

    status = cli("campaign", "status", cid, "-c", config_file, "--json")
    assert status.json["rate"] == {"rate": "100/min", "burst": 1}  # the default burst, filled in
    assert "rate: 100/min (burst 1), all nodes together" in cli("campaign", "status", cid, "-c", config_file).stdout

    listed = cli("campaign", "ls", "-c", config_file, "--json").json["campaigns"]
    assert [(c["id"], c["rate"]) for c in listed] == [(cid, {"rate": "100/min", "burst": 1})]
    assert "send_rate" not in listed[0]
    table = cli("campaign", "ls", "-c", config_file).stdout.splitlines()
    assert "RATE" in table[0].split() and "100/min" in table[1].split()


def test_a_burst_goes_beside_its_rate(cli, config_file, create, database_dsn):
    cid = create("--rate", "20/s", "--burst", "50").json["id"]
    assert stored_rate(database_dsn, cid) == "20/s burst 50"
    assert cli("campaign", "status", cid, "-c", config_file, "--json").json["rate"] == {"rate": "20/s", "burst": 50}


def test_without_a_rate_a_campaign_has_none_of_its_own(cli, config_file, create, database_dsn):
    cid = create().json["id"]
    assert stored_rate(database_dsn, cid) is None
    assert cli("campaign", "status", cid, "-c", config_file, "--json").json["rate"] is None
    assert "rate" not in cli("campaign", "status", cid, "-c", config_file).stdout


@pytest.mark.parametrize("options, message", [
    (["--rate", "20 per second"], f"argument --rate: '20 per second' is not a rate: {GRAMMAR}"),
    (["--rate", "100/minute"], f"argument --rate: '100/minute' is not a rate: {GRAMMAR}"),
    (["--rate", "200"], f"argument --rate: '200' is not a rate: {GRAMMAR}"),
    (["--rate", "0/s"], "argument --rate: '0/s' is not a rate: N must be more than 0"),
    (["--rate", "1/week"], "argument --rate: '1/week' is not a rate"),
    (["--rate", "0.5/day"], "argument --rate: '0.5/day' is too slow a rate: at least 1/day"),
    (["--rate", "10/s", "--burst", "0"], "argument --burst: '0' is not a burst (a whole number of sends, 1 or more)"),
    (["--burst", "5"], "--burst 5: a burst needs a rate beside it (give --rate too)"),
])
def test_a_bad_rate_is_refused_naming_the_option_and_nothing_is_created(cli, config_file, create, options, message):
    result = create(*options)
    assert result.exit_code == 2, result
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.json["ok"] is False and message in result.json["error"]
    assert cli("campaign", "ls", "-c", config_file, "--json").json == {"campaigns": []}


def test_the_api_refuses_a_bad_rate_as_the_cli_does_naming_its_own_parameters(make_config):
    # The same checks as the CLI's; the message names the value as the Python API calls it (the
    # CLI words it as its flag: --rate, --burst, set-rate's RATE).
    app = Senddock(make_config())
    app.create_list("news")
    for rate, burst, message in (("fast", None, "^rate: 'fast' is not a rate"), ("10/s", 0, "^burst 0: not a burst"),
                                 ("10/s", True, "^burst True: not a burst"),
                                 (None, 3, r"^burst 3: a burst needs a rate beside it \(give rate too\)")):
        with pytest.raises(UsageError, match=message):
            app.create_campaign(name="x", lists=["news"], subject="s", from_addr="a@example.com", text_body="hi",
                                rate=rate, burst=burst)
    assert app.campaigns() == []
    with pytest.raises(UsageError, match="^rate: '5 a minute' is not a rate"):
        app.set_campaign_rate(1, "5 a minute")
    app.close()


def test_set_rate_on_a_draft_a_sending_and_a_paused_campaign(cli, config_file, create, database_dsn):
    cid = create().json["id"]
    draft = cli("campaign", "set-rate", cid, "100/min", "-c", config_file, "--json")
    assert draft.exit_code == 0, draft.stderr
    assert draft.json == {"campaign_id": cid, "status": "draft", "rate": {"rate": "100/min", "burst": 1},
                          "previous_rate": None}
    assert cli("campaign", "send", cid, "--no-unsubscribe", "-c", config_file).exit_code == 0

    sending = cli("campaign", "set-rate", cid, "5/s", "--burst", "10", "-c", config_file)
    assert (sending.exit_code, sending.stdout) == (0, f"campaign {cid} (sending): rate 5/s (burst 10), was 100/min "
                                                      "(burst 1); every node applies it from its next claim\n")
    assert stored_rate(database_dsn, cid) == "5/s burst 10"
    assert cli("campaign", "status", cid, "-c", config_file, "--json").json["rate"] == {"rate": "5/s", "burst": 10}

    assert cli("campaign", "pause", cid, "-c", config_file).exit_code == 0
    paused = cli("campaign", "set-rate", cid, "1/h", "-c", config_file, "--json")
    assert paused.json == {"campaign_id": cid, "status": "paused", "rate": {"rate": "1/h", "burst": 1},
                           "previous_rate": {"rate": "5/s", "burst": 10}}
    assert "it applies once resumed" in cli("campaign", "set-rate", cid, "2/h", "-c", config_file).stdout

    # `none` removes it: only the config's pacing holds.
    removed = cli("campaign", "set-rate", cid, "none", "-c", config_file, "--json")
    assert removed.json == {"campaign_id": cid, "status": "paused", "rate": None,
                            "previous_rate": {"rate": "2/h", "burst": 1}}
    assert stored_rate(database_dsn, cid) is None
    again = cli("campaign", "set-rate", cid, "none", "-c", config_file)
    assert again.stdout == (f"campaign {cid} (paused): no rate of its own (the config's pacing still holds), "
                            "was none of its own; it applies once resumed\n")
    # Not a status change: the history has the send and the pause, nothing of the rates.
    history = cli("campaign", "history", cid, "-c", config_file, "--json").json["changes"]
    assert [c["to_status"] for c in history] == ["paused", "sending"]


def test_set_rate_on_a_scheduled_campaign(cli, config_file, create):
    cid = create().json["id"]
    assert cli("campaign", "send", cid, "--no-unsubscribe", "--at", "2099-01-01T00:00:00Z", "-c", config_file).exit_code == 0
    result = cli("campaign", "set-rate", cid, "10/s", "-c", config_file)
    assert result.stdout.startswith(f"campaign {cid} (scheduled): rate 10/s (burst 10), was none of its own; "
                                    "it applies from its send time")


@pytest.mark.parametrize("argv, message", [
    (["1", "fast"], f"argument RATE: 'fast' is not a rate: {GRAMMAR}"),
    (["1", "0/min"], "argument RATE: '0/min' is not a rate: N must be more than 0"),
    (["1", "10/s", "--burst", "-1"], "argument --burst: '-1' is not a burst"),
    (["1", "none", "--burst", "3"], "--burst 3: a burst needs a rate beside it (give RATE too)"),
    (["x", "10/s"], "argument ID: 'x' is not an id"),
])
def test_set_rate_usage_errors_exit_2(cli, config_file, create, database_dsn, argv, message):
    cid = create("--rate", "7/s").json["id"]
    assert cid == 1
    result = cli("campaign", "set-rate", *argv, "-c", config_file)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert stored_rate(database_dsn, cid) == "7/s"


def test_set_rate_on_a_finished_or_cancelled_campaign_is_refused(make_config, smtp_sink, cli, tmp_path):
    settings = fast_settings(smtp_sink.port)
    config = make_config(settings)
    app = Senddock(config)
    finished = make_broadcast(app, ["a@example.com", "b@example.com"])
    drain(config)
    cancelled = make_broadcast(app, ["c@example.com"], list_name="other", name="Other")
    app.cancel_campaign(cancelled)
    config_file = tmp_path / "senddock.yaml"
    for cid, status in ((finished, "finished"), (cancelled, "cancelled")):
        # As `campaign pause` refuses a campaign in the wrong state: exit 1, the state and the way out.
        result = cli("campaign", "set-rate", cid, "10/s", "-c", config_file)
        assert result.exit_code == 1, result
        assert result.stderr == (f"senddock: error: campaign {cid} is {status}: nothing more of it is sent, so its "
                                 "rate cannot change (only a draft, scheduled, sending or paused campaign's can); "
                                 f"`senddock campaign clone {cid}` makes a draft with its rate\n")
        with pytest.raises(InvalidState, match=f"campaign {cid} is {status}"):
            app.set_campaign_rate(cid, "10/s")
        assert app.campaign(cid).send_rate is None
    unknown = cli("campaign", "set-rate", 99, "10/s", "-c", config_file, "--json")
    assert (unknown.exit_code, unknown.json["error"]) == (1, "no campaign with id 99")
    app.close()


def test_edit_sets_changes_and_removes_a_drafts_rate(cli, config_file, create, database_dsn):
    cid = create().json["id"]
    edited = cli("campaign", "edit", cid, "--rate", "30/min", "--burst", "3", "-c", config_file)
    assert edited.stdout == f"campaign {cid}: changed rate\n  rate: none -> 30/min burst 3\n"
    assert stored_rate(database_dsn, cid) == "30/min burst 3"
    same = cli("campaign", "edit", cid, "--rate", "030/min", "--burst", "3", "-c", config_file, "--json")
    assert same.json == {"id": cid, "changed": []}
    removed = cli("campaign", "edit", cid, "--rate", "none", "-c", config_file, "--json")
    assert removed.json == {"id": cid, "changed": ["rate"]}
    assert stored_rate(database_dsn, cid) is None

    bad = cli("campaign", "edit", cid, "--rate", "lots", "--subject", "New", "-c", config_file)
    assert bad.exit_code == 2 and "argument --rate: 'lots' is not a rate" in bad.stderr
    burst_alone = cli("campaign", "edit", cid, "--burst", "4", "-c", config_file)
    assert burst_alone.exit_code == 2 and "--burst 4: a burst needs a rate beside it" in burst_alone.stderr
    assert cli("campaign", "status", cid, "-c", config_file, "--json").json["rate"] is None

    # A sent campaign is no draft: its rate changes with set-rate, never edit.
    assert cli("campaign", "send", cid, "--no-unsubscribe", "-c", config_file).exit_code == 0
    sent = cli("campaign", "edit", cid, "--rate", "1/s", "-c", config_file)
    assert sent.exit_code == 1 and "only a draft can be edited" in sent.stderr


def test_clone_carries_the_rate(cli, config_file, create, database_dsn):
    cid = create("--rate", "2.50/s", "--burst", "4").json["id"]
    assert cli("campaign", "send", cid, "--no-unsubscribe", "-c", config_file).exit_code == 0
    copy = cli("campaign", "clone", cid, "-c", config_file, "--json").json["id"]
    assert stored_rate(database_dsn, copy) == "2.5/s burst 4"
    assert cli("campaign", "status", copy, "-c", config_file, "--json").json["rate"] == {"rate": "2.5/s", "burst": 4}


def test_the_claim_reads_each_campaigns_rate_afresh(make_config, database_dsn):
    """The claim returns the campaign's rate with each job (never cached on a node): a job of a
    campaign with a rate is not marked begun by the claim (the pacing gate takes its limit first);
    a set-rate from another session applies to the next claim; a rate written by hand that cannot
    be read is logged and leaves only the config's limits."""
    from senddock.core.pacing_gate import PacingGate
    from senddock.pacing.limits import PacingSettings

    app = Senddock(make_config())
    without = make_broadcast(app, ["b@example.com"], list_name="other", name="Other")
    with_rate = make_broadcast(app, ["a@example.com", "a2@example.com"])
    app.set_campaign_rate(with_rate, "100/min")
    node = NodeIdentity(uuid.uuid4(), "reader", "h", 1)
    gate = PacingGate(PacingSettings(), "smtp")
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO nodes (id, name, host, pid) VALUES (%s, 'reader', 'h', 1)", (node.id,))
        queue = JobQueue(conn, node)
        other, first = sorted(queue.claim(2, begun=True), key=lambda j: j.campaign_id)
        assert (first.campaign_id, first.send_rate, first.send_begun) == (with_rate, "100/min", False)
        assert (other.campaign_id, other.send_rate, other.send_begun) == (without, None, True)
        assert [(limit.key, limit.rate.per_second) for limit in gate.limits(first)] == [
            (f"campaign:{with_rate}", pytest.approx(100 / 60))]
        assert gate.limits(other) == ()

        app.set_campaign_rate(with_rate, "5/s", burst=20)  # another session, as on another node
        [second] = queue.claim(1, begun=True)
        assert (second.send_rate, gate.limits(second)[0].rate.burst) == ("5/s burst 20", 20)

        # Written by hand into the table: the node logs it and keeps going under the config's limits.
        conn.execute("UPDATE campaigns SET send_rate = 'fast' WHERE id = %s", (without,))
        with capture_logs() as logs:
            assert gate.limits(replace(other, send_rate="fast")) == ()
        assert [e["event"] for e in logs] == ["campaign_rate_unreadable"]
    assert app.campaign_status(without).rate == {"rate": "fast", "burst": None}
    app.close()
