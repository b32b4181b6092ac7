"""`senddock webhooks ls | replay | enable`, with --json and their exit codes."""

from __future__ import annotations

import pytest
import yaml

from senddock.api import Senddock
from senddock.testing import fast_settings
from tests_support import running_node, wait_for
from webhook_receiver import SECRET, Answer, Receiver


@pytest.fixture(autouse=True)
def webhook_secret(monkeypatch):
    monkeypatch.setenv("SENDDOCK_WEBHOOK_SECRET", SECRET)


def statuses(app) -> list[str]:
    with app.db.connection() as conn:
        return [row[0] for row in conn.execute("SELECT status FROM webhook_outbox ORDER BY id")]


def disabled(app) -> bool:
    with app.db.connection() as conn:
        return conn.execute("SELECT count(*) FROM webhook_endpoints WHERE disabled_at IS NOT NULL").fetchone()[0] == 1


def test_ls_replay_and_enable(make_config, cli, tmp_path):
    answers = {"status": 200}
    with Receiver(lambda n, body: Answer(answers["status"])) as receiver:
        def settings(max_age: str) -> dict:
            return fast_settings(webhooks=[{"url": receiver.url, "secret": "${SENDDOCK_WEBHOOK_SECRET}",
                                            "events": ["unsubscribed"], "retry": {"schedule": ["100ms"], "max_age": max_age}}])

        config = make_config(settings("1s"))  # so that an event dies at once
        path = tmp_path / "senddock.yaml"
        app = Senddock(config)
        app.create_list("news")
        for name in ("a", "b", "c"):
            app.add_subscriber(f"{name}@example.com", lists=["news"])
        app.unsubscribe("a@example.com")
        with running_node(config):
            wait_for(lambda: statuses(app) == ["delivered"], 30, "the first delivery")
            answers["status"] = 500
            app.unsubscribe("b@example.com")
            wait_for(lambda: statuses(app) == ["delivered", "dead"], 30, "the second event to die")
        # From here events must outlive the commands run between two nodes (seconds on a busy
        # machine): an event older than max_age for a disabled endpoint dies, as it should.
        config = make_config(settings("1h"))

        shown = cli("webhooks", "ls", "-c", path, "--json")
        assert shown.exit_code == 0, shown.stderr
        [endpoint] = shown.json["endpoints"]
        assert (endpoint["delivered"], endpoint["dead"], endpoint["pending"], endpoint["disabled"]) == (1, 1, 0, False)
        assert endpoint["url"].endswith("/hooks?***")  # the query string may carry a token
        [failing] = shown.json["failing"]
        assert (failing["status"], failing["last_error"]) == ("dead", "HTTP 500 Internal Server Error")
        text = cli("webhooks", "ls", "-c", path)
        assert text.exit_code == 0 and "HTTP 500 Internal Server Error" in text.stdout and "token=abc" not in text.stdout

        # The dead event again, by its id: same webhook-id when it goes.
        dead_id = failing["id"]
        answers["status"] = 200
        again = cli("webhooks", "replay", dead_id, "-c", path, "--json")
        assert again.exit_code == 0, again.stderr
        assert again.json["replayed"] == 1
        with running_node(config):
            wait_for(lambda: statuses(app) == ["delivered", "delivered"], 30, "the replayed event")
        ids = [r.headers["webhook-id"] for r in receiver.requests]
        assert ids[-1] == ids[1] and ids[0] != ids[1]

        # Everything since an hour ago.
        again = cli("webhooks", "replay", "--since", "1h", "-c", path, "--json")
        assert (again.exit_code, again.json["replayed"]) == (0, 2)
        assert statuses(app) == ["pending", "pending"]

        # Problems: an unknown event (1), bad usage (2), never a traceback.
        missing = cli("webhooks", "replay", "999", "-c", path, "--json")
        assert missing.exit_code == 1 and "no delivered or dead event 999" in missing.stderr
        both = cli("webhooks", "replay", "1", "--since", "1h", "-c", path)
        assert both.exit_code == 2 and "give one event ID or --since" in both.stderr
        neither = cli("webhooks", "replay", "-c", path)
        assert neither.exit_code == 2
        bad = cli("webhooks", "replay", "x1", "-c", path)
        assert bad.exit_code == 1 and "is not an event" in bad.stderr

        # 410: disabled, shown as such, enabled again by the operator.
        answers["status"] = 410
        with running_node(config):
            # (Not through the CLI meanwhile: this process's node logs to the stdout it would print to.)
            wait_for(lambda: disabled(app), 30, "the endpoint disabled")
        shown = cli("webhooks", "ls", "-c", path)
        assert "DISABLED (HTTP 410 Gone" in shown.stdout
        enabled = cli("webhooks", "enable", endpoint["id"], "-c", path, "--json")
        assert (enabled.exit_code, enabled.json) == (0, {"enabled": endpoint["id"]})
        assert cli("webhooks", "enable", endpoint["id"], "-c", path).exit_code == 1  # not disabled now
        answers["status"] = 200
        with running_node(config):
            wait_for(lambda: statuses(app) == ["delivered", "delivered"], 30, "delivery after enable")
    app.close()


def test_ls_without_webhooks(cli, config_file):
    shown = cli("webhooks", "ls", "-c", config_file)
    assert shown.exit_code == 0 and "no webhooks configured" in shown.stdout
    assert cli("webhooks", "ls", "-c", config_file, "--json").json == {"endpoints": [], "failing": []}


def test_a_bad_secret_is_a_config_error_that_prints_no_value(cli, tmp_path, monkeypatch):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"webhooks": [{"url": "https://crm.example.com/hook",
                                                  "secret": "${SENDDOCK_WEBHOOK_SECRET}"}]}), encoding="utf-8")
    monkeypatch.setenv("SENDDOCK_WEBHOOK_SECRET", "whsec_c2hvcnQ=")  # base64 of "short"
    shown = cli("webhooks", "ls", "-c", path)
    assert shown.exit_code == 2
    assert "$.webhooks[0].secret: is too short" in shown.stderr and "c2hvcnQ" not in shown.stderr
    monkeypatch.setenv("SENDDOCK_WEBHOOK_SECRET", "hunter2-hunter2-hunter2-hunter2")
    shown = cli("webhooks", "ls", "-c", path)
    assert shown.exit_code == 2 and "must start with whsec_" in shown.stderr and "hunter2" not in shown.stderr
    rotating = tmp_path / "rotating.yaml"
    rotating.write_text(yaml.safe_dump({"webhooks": [{"url": "https://crm.example.com/hook",
                                                      "secret": ["${SENDDOCK_WEBHOOK_SECRET}", "${OLD_SECRET}"]}]}),
                        encoding="utf-8")
    monkeypatch.setenv("SENDDOCK_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("OLD_SECRET", "whsec_c2hvcnQ=")
    shown = cli("check-config", "-c", rotating)
    assert shown.exit_code == 2 and "$.webhooks[0].secret[1]: is too short" in shown.stderr
    monkeypatch.setenv("OLD_SECRET", SECRET.replace("c2Vu", "b2xk"))
    assert cli("check-config", "-c", rotating).exit_code == 0
    written = tmp_path / "written.yaml"
    written.write_text(yaml.safe_dump({"webhooks": [{"url": "https://crm.example.com/hook", "secret": SECRET}]}),
                       encoding="utf-8")
    shown = cli("check-config", "-c", written)
    assert shown.exit_code == 2 and "secrets must not be written in the file" in shown.stderr
    assert SECRET not in shown.stderr


def test_check_config_show_masks_the_secret_and_the_urls_token(cli, tmp_path):
    path = tmp_path / "hooks.yaml"
    path.write_text(yaml.safe_dump({"webhooks": [{"url": "https://crm.example.com/hook",
                                                  "secret": "${SENDDOCK_WEBHOOK_SECRET}", "batch": 50}]}),
                    encoding="utf-8")
    shown = cli("check-config", "-c", path, "--show", "--json")
    assert shown.exit_code == 0, shown.stderr
    assert SECRET not in shown.stdout and SECRET.removeprefix("whsec_") not in shown.stdout
    [hook] = shown.json["config"]["webhooks"]
    assert hook["secret"] == "***"
    assert (hook["batch"], hook["concurrency"], hook["timeout"], hook["retry"]["max_age"]) == (50, 4, "15s", "3d")
