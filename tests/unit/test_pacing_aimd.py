"""Adaptive pacing's settings and arithmetic, and which limit a throttling reply slows (no database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from senddock.outcome import Classification, Outcome
from senddock.pacing.adaptive import Adaptive, slows_pacing
from senddock.pacing.limits import throttled_limit
from senddock.pacing.limits import limits_for
from senddock.pacing.rates import parse_rate
from test_pacing import ISSUE_EXAMPLE, config_errors, pacing_of


def test_adaptive_true_takes_the_defaults_and_false_turns_it_off(tmp_path: Path):
    assert pacing_of(tmp_path, ISSUE_EXAMPLE).adaptive == Adaptive(recovery=100.0, hold=5.0, floor=0.02)
    off = pacing_of(tmp_path, ISSUE_EXAMPLE.replace("adaptive: true", "adaptive: false"))
    assert off.adaptive is None and not off.adaptive


def test_adaptive_can_be_tuned_and_what_is_left_out_keeps_its_default(tmp_path: Path):
    tuned = pacing_of(tmp_path, ISSUE_EXAMPLE.replace("adaptive: true", "adaptive: {recovery: 5m, floor: 0.1}"))
    assert tuned.adaptive == Adaptive(recovery=300.0, hold=5.0, floor=0.1)
    assert pacing_of(tmp_path, ISSUE_EXAMPLE.replace("adaptive: true", "adaptive: {}")).adaptive == Adaptive()


@pytest.mark.parametrize(("written", "error"), [
    ("{recovery: soon}", "$.pacing.adaptive.recovery: 'soon' is not a duration (e.g. 30s, 2m, 1h30m)"),
    ("{floor: 0}", "$.pacing.adaptive.floor: 0 is less than or equal to the minimum of 0"),
    ("{floor: 2}", "$.pacing.adaptive.floor: 2 is greater than the maximum of 1"),
    ("{slow: 1}", "$.pacing.adaptive.slow: unknown key 'slow' (known keys: recovery, hold, floor)"),
    ("{recovery: 0s}", "$.pacing.adaptive.recovery: '0s' is no time to recover in: give the time to climb from "
                       "nothing back to the configured rate, e.g. 100s"),
])
def test_bad_adaptive_settings_are_named_with_their_place(tmp_path: Path, written: str, error: str):
    assert config_errors(tmp_path, ISSUE_EXAMPLE.replace("adaptive: true", f"adaptive: {written}")) == [error]


def test_the_factor_climbs_back_additively_and_never_above_one():
    adaptive = Adaptive(recovery=100.0)
    assert adaptive.in_force(0.5, None) == 0.5
    assert adaptive.in_force(0.5, 0.0) == 0.5
    assert adaptive.in_force(0.5, 10.0) == pytest.approx(0.6)  # +10% of the rate per 10 s
    assert adaptive.in_force(0.5, 50.0) == 1.0
    assert adaptive.in_force(0.5, 500.0) == 1.0
    assert adaptive.in_force(0.5, -3.0) == 0.5  # a clock a little behind never lowers it


def test_a_throttling_reply_slows_the_recipients_group_else_the_transport_else_everything(tmp_path: Path):
    pacing = pacing_of(tmp_path, ISSUE_EXAMPLE)
    key = lambda **job: (limit.key if (limit := throttled_limit(limits_for(pacing, **job))) else None)  # noqa: E731
    rate = parse_rate("100/min")
    assert key(transport="smtp", domain="gmail.com", campaign_id=3, campaign_rate=rate) == "domain:gmail.com"
    assert key(transport="smtp", domain="example.org", campaign_id=3, campaign_rate=rate) == "transport:smtp"
    assert key(transport="ses_like", domain="example.org") == "global"
    # A campaign's own rate is the sender's choice, not a provider's: never slowed.
    alone = pacing_of(tmp_path, "pacing: {adaptive: true}\n")
    assert throttled_limit(limits_for(alone, transport="smtp", domain="gmail.com", campaign_id=3,
                                      campaign_rate=rate)) is None


def test_throttling_slows_the_pace_and_greylisting_does_not():
    assert slows_pacing(Classification(Outcome.RETRY, "throttled", throttled=True))
    assert slows_pacing(Classification(Outcome.RETRY, "too_many_recipients", throttled=True))
    assert not slows_pacing(Classification(Outcome.RETRY, "greylisted", throttled=True))
    assert not slows_pacing(Classification(Outcome.RETRY, "relay_error", relay_trouble=True))
