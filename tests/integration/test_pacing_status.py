"""`senddock status` and `campaign status`: per pacing limit, rate configured / effective / measured
over the last minute, in text and JSON; nothing extra when no limit is configured."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import yaml

from senddock.core.pacer import Pacer
from senddock.pacing.adaptive import Adaptive

PACING = {
    "global": "200/s",
    "transports": {"smtp": "100/s", "ses_like": "5/s"},
    "domains": [
        {"match": ["gmail.com", "googlemail.com"], "rate": "20/s"},
        {"match": ["*.onmicrosoft.com"], "rate": "600/min"},
        {"match": ["yahoo.com"], "concurrency": 3},
    ],
    "adaptive": {"recovery": "1d"},  # recovering so slowly that a halving shows as exactly half
}
RECIPIENTS = ["a@gmail.com", "b@GoogleMail.com", "c@contoso.onmicrosoft.com", "d@yahoo.com", "e@example.com",
              "f@gmail.com"]


def write_config(tmp_path: Path, pacing: dict | None) -> Path:
    config = tmp_path / "senddock.yaml"
    config.write_text(yaml.safe_dump({"logging": {"level": "warning"}, **({"pacing": pacing} if pacing else {})},
                                     sort_keys=False),
                      encoding="utf-8")
    return config


def sent_campaign(cli, config: Path, tmp_path: Path) -> int:
    assert cli("lists", "create", "news", "-c", config).exit_code == 0
    csv = tmp_path / "people.csv"
    csv.write_text("email\n" + "".join(f"{email}\n" for email in RECIPIENTS), encoding="utf-8")
    assert cli("subscribers", "import", csv, "--list", "news", "-c", config).exit_code == 0
    body = tmp_path / "body.txt"
    body.write_text("Hello", encoding="utf-8")
    created = cli("campaign", "create", "--name", "Launch", "--list", "news", "--subject", "Hi",
                  "--from", "news@example.com", "--text", body, "-c", config, "--json")
    assert created.exit_code == 0, created.stderr
    campaign_id = created.json["id"]
    assert cli("campaign", "send", campaign_id, "--no-unsubscribe", "-c", config).exit_code == 0
    return campaign_id


def attempts_begun(dsn: str, campaign_id: int, emails: list[str], seconds_ago: float) -> None:
    """A send attempt to each of ``emails``, begun ``seconds_ago``."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, started_at, outcome) "
            "SELECT j.id, j.broadcast_id, 1, clock_timestamp() - make_interval(secs => %s), 'sent' "
            "FROM broadcast_jobs j JOIN campaigns c ON c.broadcast_id = j.broadcast_id "
            "WHERE c.id = %s AND lower(j.email) = ANY (%s)",
            (seconds_ago, campaign_id, [e.lower() for e in emails]))


@pytest.fixture
def paced_campaign(cli, tmp_path: Path, database_dsn: str) -> tuple[Path, int]:
    config = write_config(tmp_path, PACING)
    campaign_id = sent_campaign(cli, config, tmp_path)
    # In the last minute: 3 to Gmail's group (googlemail.com is in it), 1 to Microsoft's, 1 to
    # yahoo.com, 2 to no group; a minute ago and more: not counted.
    attempts_begun(database_dsn, campaign_id, RECIPIENTS, seconds_ago=10)
    attempts_begun(database_dsn, campaign_id, ["e@example.com"], seconds_ago=30)
    attempts_begun(database_dsn, campaign_id, RECIPIENTS, seconds_ago=90)
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE campaigns SET send_rate = '120/min' WHERE id = %s", (campaign_id,))
        Pacer(conn, Adaptive()).throttled(["domain:gmail.com"])  # Gmail said 421 4.7.28 just now
    return config, campaign_id


def by_limit(rows: list[dict]) -> dict[str, tuple]:
    return {r["limit"]: (r["configured"], r["effective_per_second"], r["sends_last_minute"]) for r in rows}


def test_status_shows_every_limit_configured_effective_and_measured(cli, paced_campaign):
    config, campaign_id = paced_campaign
    shown = cli("status", "-c", config, "--json")
    assert shown.exit_code == 0, shown.stderr
    rows = by_limit(shown.json["pacing"])
    assert list(rows) == ["global", "transport:smtp", "transport:ses_like", "domain:gmail.com",
                          "domain:*.onmicrosoft.com", "domain:yahoo.com", f"campaign:{campaign_id}"]
    assert rows["global"] == ("200/s", 200.0, 7)
    assert rows["transport:smtp"] == ("100/s", 100.0, 7)  # this node's transport: every send
    assert rows["transport:ses_like"] == ("5/s", 5.0, None)  # attempts do not say their transport
    configured, effective, sends = rows["domain:gmail.com"]
    assert (configured, sends) == ("20/s", 3)
    assert effective == pytest.approx(10.0, rel=0.01)  # halved by throttling, recovering slowly
    assert rows["domain:*.onmicrosoft.com"] == ("600/min", 10.0, 1)
    assert rows["domain:yahoo.com"] == (None, None, 1)  # a concurrency, no rate
    assert rows[f"campaign:{campaign_id}"] == ("120/min", 2.0, 7)
    gmail = next(r for r in shown.json["pacing"] if r["limit"] == "domain:gmail.com")
    assert gmail["measured_per_second"] == pytest.approx(3 / 60)
    assert gmail["factor"] == pytest.approx(0.5, abs=0.01)

    text = cli("status", "-c", config)
    assert text.exit_code == 0, text.stderr
    lines = [line.split() for line in text.stdout.splitlines()]
    assert lines[0] == ["PACING", "CONFIGURED", "EFFECTIVE", "LAST", "MINUTE"]
    assert ["global", "200/s", "200/s", "0.117/s"] in lines
    assert ["domain:gmail.com", "20/s", "10/s", "(50%:", "throttled)", "0.05/s"] in lines
    assert ["domain:*.onmicrosoft.com", "600/min", "600/min", "1/min"] in lines
    assert ["domain:yahoo.com", "-", "-", "0.0167/s"] in lines


def test_campaign_status_shows_the_limits_with_the_campaigns_own_rate(cli, paced_campaign):
    config, campaign_id = paced_campaign
    shown = cli("campaign", "status", campaign_id, "-c", config, "--json")
    assert shown.exit_code == 0, shown.stderr
    assert shown.json["sent"] == 0  # the counts are the broadcast's as before
    rows = by_limit(shown.json["pacing"])
    assert list(rows)[-1] == f"campaign:{campaign_id}" and len(rows) == 7
    text = cli("campaign", "status", campaign_id, "-c", config)
    assert "PACING" in text.stdout and f"campaign:{campaign_id}" in text.stdout


def test_without_pacing_nothing_extra_is_shown(cli, tmp_path: Path, database_dsn: str):
    config = write_config(tmp_path, None)
    campaign_id = sent_campaign(cli, config, tmp_path)
    attempts_begun(database_dsn, campaign_id, RECIPIENTS, seconds_ago=10)
    assert cli("status", "-c", config, "--json").json == {"pacing": []}
    assert cli("status", "-c", config).stdout.startswith("pacing: no limit configured")
    status = cli("campaign", "status", campaign_id, "-c", config, "--json")
    assert status.json["pacing"] == []
    assert "PACING" not in cli("campaign", "status", campaign_id, "-c", config).stdout
    # A campaign's own rate is pacing configured, for that campaign.
    with psycopg.connect(database_dsn) as conn:
        conn.execute("UPDATE campaigns SET send_rate = '10/s' WHERE id = %s", (campaign_id,))
    rows = by_limit(cli("campaign", "status", campaign_id, "-c", config, "--json").json["pacing"])
    assert rows == {f"campaign:{campaign_id}": ("10/s", 10.0, 6)}


def test_with_adaptive_off_the_effective_rate_is_the_configured_one(cli, paced_campaign, tmp_path: Path):
    config, _ = paced_campaign
    text = config.read_text(encoding="utf-8")
    config.write_text(text.replace("adaptive:\n    recovery: 1d", "adaptive: false"), encoding="utf-8")
    assert "adaptive: false" in config.read_text(encoding="utf-8")
    rows = by_limit(cli("status", "-c", config, "--json").json["pacing"])
    assert rows["domain:gmail.com"] == ("20/s", 20.0, 3)
