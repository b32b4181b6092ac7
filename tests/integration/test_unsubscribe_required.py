"""Bulk mail without an unsubscribe link: `campaign send` refuses unless told, `check-config` warns.

Gmail and Yahoo require one-click unsubscribe (List-Unsubscribe, RFC 8058) of bulk senders; a
config without the `unsubscribe` section sent every message without it, silently.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "config" / "senddock.yaml"
SECRET = {"SENDDOCK_UNSUBSCRIBE_SECRET": "test-only-secret-0123456789abcdef"}
pytestmark = pytest.mark.usefixtures("in_test_folder")  # the in-process commands' relative paths
MISSING = ("no unsubscribe link is configured: messages would go out without a List-Unsubscribe header, which "
           "Gmail and Yahoo require of bulk senders (one-click, RFC 8058); set unsubscribe.url (the public "
           "https:// address of `senddock serve`) and unsubscribe.secret (see docs/configuration.md#unsubscribe)")


def campaign(cli, config: Path, tmp_path: Path, env: dict[str, str] | None = None) -> int:
    def ok(*argv):
        result = cli(*argv, "-c", config, env=env)
        assert result.exit_code == 0, result.stderr
        return result

    ok("lists", "create", "news")
    (tmp_path / "people.csv").write_text("email,name\nada@example.com,Ada\n", encoding="utf-8")
    ok("subscribers", "import", tmp_path / "people.csv", "--list", "news")
    (tmp_path / "body.txt").write_text("Hello {{ subscriber.name }}\n", encoding="utf-8")
    return ok("campaign", "create", "--name", "Launch", "--list", "news", "--subject", "Hi", "--from",
              "news@example.com", "--text", tmp_path / "body.txt", "--json").json["id"]


@pytest.fixture
def bare_config(tmp_path: Path) -> Path:
    path = tmp_path / "senddock.yaml"
    path.write_text("logging:\n  level: warning\n", encoding="utf-8")
    return path


def test_send_refuses_a_config_without_unsubscribe_links_unless_told(cli, bare_config, tmp_path):
    cid = campaign(cli, bare_config, tmp_path)
    refused = cli("campaign", "send", cid, "-c", bare_config)
    assert refused.exit_code == 1
    assert refused.stderr.strip() == (f"senddock: error: campaign {cid} not sent: {MISSING}; or pass "
                                      "--no-unsubscribe to send without (a test list, a relay of your own)")
    as_json = cli("campaign", "send", cid, "-c", bare_config, "--json")
    assert as_json.exit_code == 1 and as_json.json["error"].startswith(f"campaign {cid} not sent: no unsubscribe")
    status = cli("campaign", "status", cid, "-c", bare_config, "--json").json
    assert (status["status"], status["broadcast_id"]) == ("draft", None)  # nothing enqueued

    told = cli("campaign", "send", cid, "--no-unsubscribe", "-c", bare_config, "--json")
    assert told.exit_code == 0, told.stderr
    assert told.json["enqueued"] == 1


@pytest.mark.parametrize("section", [
    "unsubscribe:\n  url: https://mail.example.com\n  secret: ${SENDDOCK_UNSUBSCRIBE_SECRET}\n",
    "unsubscribe:\n  mailto: unsubscribe@example.com\n  secret: ${SENDDOCK_UNSUBSCRIBE_SECRET}\n",
])
def test_send_and_check_config_are_quiet_with_unsubscribe_links(cli, tmp_path, section):
    config = tmp_path / "senddock.yaml"
    config.write_text("logging:\n  level: warning\n" + section, encoding="utf-8")
    checked = cli("check-config", "-c", config, env=SECRET)
    assert (checked.exit_code, checked.stdout.splitlines()[0], checked.stderr) == (0, "config OK", "")
    assert cli("check-config", "-c", config, "--json", env=SECRET).json["warnings"] == []
    cid = campaign(cli, config, tmp_path, env=SECRET)
    sent = cli("campaign", "send", cid, "-c", config, env=SECRET)
    assert sent.exit_code == 0, sent.stderr


def test_check_config_warns_without_unsubscribe_links(cli, bare_config):
    checked = cli("check-config", "-c", bare_config, db=False)
    assert checked.exit_code == 0
    assert checked.stdout.splitlines()[0] == "config OK"
    warning = (f"{bare_config}::$.unsubscribe: {MISSING}; `campaign send` refuses without it unless given "
               "--no-unsubscribe")
    assert checked.stderr == f"warning: {warning}\n"
    as_json = cli("check-config", "-c", bare_config, "--json", db=False)
    assert as_json.exit_code == 0
    assert (as_json.json["ok"], as_json.json["errors"], as_json.json["warnings"]) == (True, [], [warning])


def test_the_shipped_config_sends_with_links_to_senddock_serve(cli, tmp_path):
    """The README's path: config/senddock.yaml, its secret from the environment, `campaign send` as written."""
    unset = cli("check-config", "-c", SHIPPED, db=False, env={"SENDDOCK_UNSUBSCRIBE_SECRET": ""})
    # An empty variable is not a secret either (minLength 16); an unset one is named (tests/unit/test_config.py).
    assert unset.exit_code == 2 and "$.unsubscribe.secret" in unset.stderr
    assert cli("check-config", "-c", SHIPPED, db=False, env=SECRET).stderr == ""
    cid = campaign(cli, SHIPPED, tmp_path, env=SECRET)
    sent = cli("campaign", "send", cid, "-c", SHIPPED, env=SECRET)
    assert sent.exit_code == 0, sent.stderr
    preview = cli("campaign", "preview", cid, "-c", SHIPPED, "--json", env=SECRET)
    assert preview.exit_code == 0, preview.stderr
    assert preview.json["headers"]["List-Unsubscribe"].strip().startswith("<http://127.0.0.1:8025/unsubscribe/")
