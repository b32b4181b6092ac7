"""Rates, the `pacing` section and the limits a send is subject to (no database)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from tests_support import installed_transports

from senddock.config import base_schema
from senddock.loading import load_config
from senddock.errors import ConfigError
from senddock.pacing.adaptive import Adaptive
from senddock.pacing.limits import DomainGroup, Limit, PacingSettings, limits_for, recipient_domain
from senddock.pacing.rates import (
    RATE_PATTERN,
    Rate,
    campaign_rate_text,
    campaign_rate_view,
    parse_campaign_rate,
    parse_rate,
)

ISSUE_EXAMPLE = """\
pacing:
  global: 200/s                      # all nodes together
  transports: {smtp: 100/s}
  domains:                           # by recipient domain, matched in order
    - match: [gmail.com, googlemail.com]
      rate: 20/s
      concurrency: 10                # sends in flight to this group, all nodes together
    - match: [outlook.com, hotmail.com, live.com, "*.onmicrosoft.com"]
      rate: 10/s
  adaptive: true                     # slow a group down on throttling replies, recover slowly
"""


def config_errors(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "senddock.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    return [e.removeprefix(f"{path}::") for e in caught.value.errors]


def pacing_of(tmp_path: Path, text: str) -> PacingSettings:
    path = tmp_path / "senddock.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, environ={}).pacing


@pytest.mark.parametrize(("text", "per_second", "burst"), [
    ("20/s", 20.0, 20),
    ("100/min", 100 / 60, 1),
    ("5000/h", 5000 / 3600, 1),
    ("100000/day", 100000 / 86400, 1),
    ("0.5/s", 0.5, 1),  # a decimal N, and never a burst of 0
    ("2.5/s", 2.5, 2),  # one second's worth, rounded down
    ("600/min", 10.0, 10),
])
def test_a_rate_is_n_per_unit_with_one_seconds_worth_of_burst(text: str, per_second: float, burst: int):
    rate = parse_rate(text)
    assert (rate.per_second, rate.burst, rate.text) == (pytest.approx(per_second), burst, text)


def test_a_rate_gives_the_limiters_interval_and_tolerance():
    rate = parse_rate("20/s", burst=40)
    assert (rate.interval, rate.tolerance) == (pytest.approx(0.05), pytest.approx(0.05 * 39))
    assert parse_rate("1/min").tolerance == 0  # burst 1: no send ahead of the pace


@pytest.mark.parametrize(("text", "burst", "margin", "at_once"), [
    ("60/s", None, 0.0, 60),
    ("60/s", None, 0.25, 45),  # a quarter second's worth kept back
    ("60/s", 120, 0.25, 105),
    ("60/s", None, 5.0, 30),  # never more than half the tolerance: the rest absorbs the claims' timing
    ("20/s", 5, 0.25, 3),  # needs 5 kept back, keeps 2: a burst this small cannot hold the whole margin
    ("3.5/s", 4, 0.25, 3),  # 1.25 s holds 4 sends at 3.5/s, 1 s holds 3: one interval kept back
    ("2/s", 2, 0.25, 2),  # 1.25 s holds no more sends than 1 s at 2/s: nothing to keep back
    ("1/min", 3, 0.25, 3),
    ("1/min", None, 0.25, 1),
])
def test_the_latency_margin_comes_off_the_burst(text: str, burst: int | None, margin: float, at_once: int):
    assert parse_rate(text, burst).at_once(margin) == at_once


@pytest.mark.parametrize(("text", "burst"), [("60/s", None), ("60/s", 120), ("3.5/s", 4), ("2/s", 2), ("10/s", 30),
                                              ("1/min", 3), ("0.5/s", 3)])
def test_with_the_margin_no_second_at_a_late_relay_holds_more_than_rate_and_burst(text: str, burst: int | None):
    # GCRA's bound over w seconds, floor((w + tau) / T) + 1, over the 1.25 s whose sends a relay
    # 250 ms late may count in one of its seconds (bursts large enough to keep the margin whole).
    rate = parse_rate(text, burst)
    over = math.floor((1.25 + rate.tolerance_within(0.25)) * rate.per_second + 1e-6) + 1
    assert over <= rate.per_second + rate.burst


@pytest.mark.parametrize(("text", "message"), [
    ("20 per second", "'20 per second' is not a rate: write N/s, N/min, N/h or N/day, e.g. 20/s"),
    ("20/sec", "'20/sec' is not a rate: write N/s, N/min, N/h or N/day, e.g. 20/s"),
    ("20", "'20' is not a rate: write N/s, N/min, N/h or N/day, e.g. 20/s"),
    ("-1/s", "'-1/s' is not a rate: write N/s, N/min, N/h or N/day, e.g. 20/s"),
    ("0/s", "'0/s' is not a rate: N must be more than 0 (to stop sending, pause the campaign)"),
    ("0.0/min", "'0.0/min' is not a rate: N must be more than 0 (to stop sending, pause the campaign)"),
    ("0.0000001/day", "'0.0000001/day' is too slow a rate: at least 1/day (for later sends, `campaign send --at TIME`)"),
    ("0.5/day", "'0.5/day' is too slow a rate: at least 1/day (for later sends, `campaign send --at TIME`)"),
])
def test_what_is_not_a_rate_is_told_how_to_write_one(text: str, message: str):
    with pytest.raises(ValueError) as caught:
        parse_rate(text)
    assert str(caught.value) == message


@pytest.mark.parametrize("burst", [0, -3, 2.5, True])
def test_a_burst_is_a_whole_number_of_sends(burst):
    with pytest.raises(ValueError, match="is not a burst: write a whole number of sends, at least 1"):
        parse_rate("20/s", burst=burst)


@pytest.mark.parametrize(("text", "burst", "stored"), [
    ("100/min", None, "100/min"),
    ("0100/min", None, "100/min"),  # one spelling per rate: the number written the shortest way
    ("100.0/min", None, "100/min"),
    ("2.50/s", None, "2.5/s"),
    ("0.5/s", 3, "0.5/s burst 3"),
    ("100000/day", 1, "100000/day burst 1"),  # a burst given stays, even the default one
])
def test_a_campaign_rate_is_stored_as_one_text_and_read_back(text, burst, stored):
    assert campaign_rate_text(text, burst) == stored
    rate = parse_campaign_rate(stored)
    assert rate == parse_rate(stored.split()[0], burst)
    assert campaign_rate_view(stored) == {"rate": stored.split()[0], "burst": rate.burst}


def test_a_campaign_rate_is_refused_as_a_config_rate_is():
    with pytest.raises(ValueError, match="'20 per second' is not a rate: write N/s"):
        campaign_rate_text("20 per second")
    with pytest.raises(ValueError, match="0 is not a burst"):
        campaign_rate_text("20/s", 0)
    for stored in ("fast", "20/s burst", "20/s burst 0", "20/s  burst 2", "20/s bursts 2"):
        with pytest.raises(ValueError):
            parse_campaign_rate(stored)
    assert campaign_rate_view(None) is None
    assert campaign_rate_view("fast") == {"rate": "fast", "burst": None}  # hand-written: shown, never a traceback


def test_the_schema_and_the_parser_take_the_same_rates():
    assert base_schema()["$defs"]["rate"]["pattern"] == RATE_PATTERN


def test_the_issues_example_loads_typed(tmp_path: Path):
    pacing = pacing_of(tmp_path, ISSUE_EXAMPLE)
    assert pacing.global_rate == Rate(200.0, 200, "200/s")
    assert pacing.transports == {"smtp": Rate(100.0, 100, "100/s")}
    assert pacing.domains == (
        DomainGroup(("gmail.com", "googlemail.com"), Rate(20.0, 20, "20/s"), 10),
        DomainGroup(("outlook.com", "hotmail.com", "live.com", "*.onmicrosoft.com"), Rate(10.0, 10, "10/s"), None),
    )
    assert pacing.adaptive == Adaptive()  # `adaptive: true`: the defaults


def test_without_a_pacing_section_nothing_is_limited():
    pacing = load_config(None, environ={}).pacing
    assert pacing == PacingSettings(global_rate=None, transports={}, domains=(), adaptive=None, latency_margin=0.25)
    assert limits_for(pacing, transport="smtp", domain="gmail.com", campaign_id=3) == ()


def test_a_burst_is_written_beside_its_rate(tmp_path: Path):
    pacing = pacing_of(tmp_path, """\
pacing:
  global: {rate: 200/s, burst: 400}
  transports: {smtp: {rate: 6000/min}}
  domains:
    - match: [gmail.com]
      rate: 20/s
      burst: 5
    - match: [yahoo.com]
      concurrency: 4
""")
    assert pacing.global_rate == Rate(200.0, 400, "200/s")
    assert pacing.transports["smtp"] == Rate(100.0, 100, "6000/min")
    assert pacing.domains[0].rate == Rate(20.0, 5, "20/s")
    assert pacing.domains[1] == DomainGroup(("yahoo.com",), None, 4)  # concurrency alone: no rate limit


def test_bad_pacing_values_are_named_with_their_place(tmp_path: Path):
    assert config_errors(tmp_path, """\
pacing:
  global: 200
  transports: {smtp: 20 per second, ses_like: {rate: 10/s, burst: 0}}
  domains:
    - match: [gmail.com, "bad domain"]
      rate: 20/sec
    - match: [yahoo.com]
      burst: 4
    - match: []
      rate: 1/s
  adaptive: sometimes
""") == [
        "$.pacing.adaptive: 'sometimes' is not of type 'boolean'",
        "$.pacing.domains[0].match[1]: 'bad domain' is not a domain (gmail.com) or a wildcard for its subdomains "
        "(*.onmicrosoft.com)",
        "$.pacing.domains[0].rate: '20/sec' is not a rate: write N/s, N/min, N/h or N/day, e.g. 20/s",
        "$.pacing.domains[1]: 'rate' is a required property",
        "$.pacing.domains[2].match: [] should be non-empty",
        "$.pacing.global: 200 is not a rate: write N/s, N/min, N/h or N/day, e.g. 20/s",
        "$.pacing.transports.ses_like.burst: 0 is less than the minimum of 1",
        "$.pacing.transports.smtp: '20 per second' is not a rate: write N/s, N/min, N/h or N/day, e.g. 20/s",
    ]


def test_the_latency_margin_is_a_duration(tmp_path: Path):
    assert pacing_of(tmp_path, "pacing: {latency_margin: 0s}\n").latency_margin == 0.0
    assert pacing_of(tmp_path, "pacing: {latency_margin: 100ms}\n").latency_margin == pytest.approx(0.1)
    assert config_errors(tmp_path, "pacing: {latency_margin: 1}\n") == [
        "$.pacing.latency_margin: 1 is not a duration: add a unit, e.g. 1s"]
    assert config_errors(tmp_path, "pacing: {latency_margin: soon}\n") == [
        "$.pacing.latency_margin: 'soon' is not a duration (e.g. 30s, 2m, 1h30m)"]


def test_what_the_schema_cannot_see_is_refused_too(tmp_path: Path):
    assert config_errors(tmp_path, """\
pacing:
  global: 0/s
  transports: {smpt: 5/s}
  domains:
    - match: [gmail.com, "*.onmicrosoft.com", x.onmicrosoft.com]
      rate: 20/s
    - match: [Gmail.com, live.com]
      burst: 3
      concurrency: 2
""") == [
        "$.pacing.global: '0/s' is not a rate: N must be more than 0 (to stop sending, pause the campaign)",
        f"$.pacing.transports.smpt: 'smpt' is not an installed transport (installed: {installed_transports()})",
        "$.pacing.domains[0].match[2]: 'x.onmicrosoft.com' is already matched by this group (by '*.onmicrosoft.com'): "
        "a domain is paced by the first group that matches it",
        "$.pacing.domains[1].burst: a burst needs a rate beside it",
        "$.pacing.domains[1].match[0]: 'gmail.com' is already matched by $.pacing.domains[0]: "
        "a domain is paced by the first group that matches it",
    ]


def test_groups_are_matched_in_order_with_wildcards_for_subdomains(tmp_path: Path):
    pacing = pacing_of(tmp_path, ISSUE_EXAMPLE.replace("  adaptive: true", """\
    - match: ["*.example.com"]
      rate: 1/s
    - match: [example.com]
      rate: 2/s
  adaptive: true"""))
    name = lambda domain: (g.name if (g := pacing.group_for(domain)) else None)  # noqa: E731
    assert name("gmail.com") == name("googlemail.com") == name("GMail.COM.") == "gmail.com"
    assert name("contoso.onmicrosoft.com") == name("a.b.onmicrosoft.com") == "outlook.com"
    assert name("onmicrosoft.com") is None  # *. is for subdomains only
    assert name("notgmail.com") is None
    assert name("mail.example.com") == "*.example.com"
    assert name("example.com") == "example.com"


def test_a_send_maps_to_the_keys_of_its_limits(tmp_path: Path):
    pacing = pacing_of(tmp_path, ISSUE_EXAMPLE)
    keys = lambda **job: [limit.key for limit in limits_for(pacing, **job)]  # noqa: E731
    assert keys(transport="smtp", domain=recipient_domain("ada@GoogleMail.com"), campaign_id=12,
                campaign_rate=parse_rate("100/min")) == ["global", "transport:smtp", "domain:gmail.com", "campaign:12"]
    assert keys(transport="ses_like", domain="contoso.onmicrosoft.com") == ["global", "domain:outlook.com"]
    assert keys(transport="smtp", domain="example.org", campaign_id=12) == ["global", "transport:smtp"]
    gmail = limits_for(pacing, transport="smtp", domain="gmail.com")[2]
    assert gmail == Limit("domain:gmail.com", Rate(20.0, 20, "20/s"))


def test_the_recipient_domain_is_compared_as_the_config_names_it():
    assert recipient_domain("Ada@Gmail.COM") == "gmail.com"
    assert recipient_domain("zoe@bücher.example") == "xn--bcher-kva.example"
