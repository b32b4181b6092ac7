"""`senddock sink --limit RATE=REPLY`: a provider that throttles beyond a rate."""

from __future__ import annotations

import time

import pytest

from senddock.sink import RateRule


def test_a_second_s_worth_goes_at_once_then_one_per_interval():
    rule = RateRule.parse("5/s=421 4.7.28 rate limited")
    assert rule.reply == "421 4.7.28 rate limited"
    assert [rule.refuses() for _ in range(6)] == [False] * 5 + [True]
    time.sleep(0.25)  # a little over one interval (0.2 s)
    assert [rule.refuses() for _ in range(2)] == [False, True]


@pytest.mark.parametrize(("text", "message"), [
    ("5/s", "--limit '5/s': expected RATE=REPLY, e.g. '5/s=421 4.7.28 rate limited'"),
    ("fast=421 4.7.28 slow down", "--limit 'fast=421 4.7.28 slow down': 'fast' is not a rate"),
    ("5/s=slow down", "--limit '5/s=slow down': 'slow down' is not an SMTP reply"),
])
def test_a_bad_limit_says_which_part_is_wrong(text, message):
    with pytest.raises(ValueError) as caught:
        RateRule.parse(text)
    assert str(caught.value).startswith(message)
