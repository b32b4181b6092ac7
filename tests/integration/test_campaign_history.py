"""A pause senddock makes itself is loud: a warning in `campaign status`, and a recorded event
(`campaign history`, the rows outgoing webhooks will deliver) written in the pause's transaction."""

from __future__ import annotations

import socket

from senddock.api import Senddock
from senddock.sink import FailRule
from senddock.testing import drain, fast_settings
from tests_support import make_broadcast, write_config


def _relay_refusing_everyone(make_config, smtp_sink, tmp_path, reply="554 5.3.0 relay misconfigured"):
    # A relay outage that is not the recipients' fault: 5 failures in a row pause the campaign.
    smtp_sink.handler.rules = [FailRule.parse(f"*={reply}")]
    settings = fast_settings(smtp_sink.port, transport={"name": "smtp", "max_consecutive_failures": 5}, concurrency=1)
    app = Senddock(make_config(settings))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(20)])
    drain(app.config)
    return app, campaign_id, write_config(tmp_path, settings)


def test_a_pause_for_relay_trouble_is_a_warning_in_status_and_an_event(make_config, smtp_sink, tmp_path, cli):
    app, campaign_id, config_path = _relay_refusing_everyone(make_config, smtp_sink, tmp_path)
    try:
        status = cli("campaign", "status", campaign_id, "-c", config_path)
        assert status.exit_code == 0
        warning = [line for line in status.stdout.splitlines() if line.startswith("warning")]
        assert len(warning) == 1, status.stdout
        assert "senddock paused this campaign: relay_unavailable: 5 consecutive failures" in warning[0]
        assert "resumes by itself" in warning[0] and " ago)" in warning[0]

        as_json = cli("campaign", "status", campaign_id, "-c", config_path, "--json").json
        assert as_json["status"] == "paused" and as_json["paused_at"] is not None
        assert as_json["warning"].startswith("senddock paused this campaign: relay_unavailable")

        history = cli("campaign", "history", campaign_id, "-c", config_path, "--json").json
        latest = history["changes"][0]
        assert (latest["from_status"], latest["to_status"], latest["auto_resume"]) == ("sending", "paused", True)
        assert latest["actor"] == f"senddock-run {socket.gethostname()}"  # the node, by its name
        assert latest["reason"].startswith("relay_unavailable: 5 consecutive failures")
        # Every change is there, oldest last: the send started it, a node paused it.
        assert [(c["from_status"], c["to_status"]) for c in history["changes"]] == \
            [("sending", "paused"), ("draft", "sending")]
    finally:
        app.close()


def test_a_pause_a_person_must_judge_says_what_to_do_and_ends_the_watch(make_config, smtp_sink, tmp_path, cli):
    # RFC 5321's generic 550 proves nothing about the recipient: 5 in a row pause, for a person to judge.
    app, campaign_id, config_path = _relay_refusing_everyone(make_config, smtp_sink, tmp_path,
                                                             "550 Requested action not taken: mailbox unavailable")
    try:
        status = cli("campaign", "status", campaign_id, "-c", config_path)
        warning = [line for line in status.stdout.splitlines() if line.startswith("warning")]
        assert len(warning) == 1, status.stdout
        assert "5 consecutive failures: rejected" in warning[0]
        assert f"senddock campaign requeue {campaign_id} --reason" in warning[0]
        assert f"senddock campaign resume {campaign_id}" in warning[0]
        watched = cli("campaign", "status", campaign_id, "--watch", "-c", config_path)  # piped: plain lines
        last = watched.stdout.splitlines()[-1]
        assert watched.exit_code == 0 and last.startswith("warning (since ")
        assert last.split(" ago): ", 1)[1] == warning[0].split(" ago): ", 1)[1]
    finally:
        app.close()


def test_the_operators_own_pause_is_no_warning_and_resume_and_finish_are_recorded(
        make_config, smtp_sink, tmp_path, cli):
    settings = fast_settings(smtp_sink.port, concurrency=1)
    app = Senddock(make_config(settings))
    config_path = write_config(tmp_path, settings)
    try:
        campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(5)])
        assert cli("campaign", "pause", campaign_id, "-c", config_path).exit_code == 0
        status = cli("campaign", "status", campaign_id, "-c", config_path)
        assert "paused by the operator" in status.stdout and "warning" not in status.stdout
        assert cli("campaign", "status", campaign_id, "-c", config_path, "--json").json["warning"] is None

        assert cli("campaign", "resume", campaign_id, "-c", config_path).exit_code == 0
        drain(app.config, node_name="test-node")
        history = cli("campaign", "history", campaign_id, "-c", config_path, "--json").json["changes"]
        assert [(c["from_status"], c["to_status"], c["actor"]) for c in history] == [
            ("sending", "finished", "senddock-run test-node"),
            ("paused", "sending", "senddock"),
            ("sending", "paused", "senddock"),
            ("draft", "sending", "senddock"),
        ]
        assert history[2]["reason"] == "paused by the operator"
        readable = cli("campaign", "history", campaign_id, "-c", config_path)
        assert readable.exit_code == 0 and "node test-node" in readable.stdout and "CLI or API" in readable.stdout
    finally:
        app.close()


def test_history_of_an_unknown_campaign_is_one_clear_line(cli, make_config):
    # -c: without it the CLI would read the repository's config/senddock.yaml (the cwd's), which
    # needs SENDDOCK_UNSUBSCRIBE_SECRET; this test is about the unknown id.
    result = cli("campaign", "history", 999, "-c", make_config().path)
    assert result.exit_code == 1
    assert "no campaign with id 999" in result.stderr and "Traceback" not in result.stderr
