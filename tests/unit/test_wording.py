from __future__ import annotations

import pytest

from senddock.cli.output import plural
from senddock.durations import rough_duration
from senddock.wording import is_status


@pytest.mark.parametrize(("count", "expected"), [(0, "0 addresses"), (1, "1 address"), (2, "2 addresses")])
def test_plural_agrees_with_the_count(count, expected):
    assert plural(count, "address", "addresses") == expected
    assert plural(count, "row") == expected.replace("addresses", "rows").replace("address", "row")


@pytest.mark.parametrize(("seconds", "expected"), [
    (0, "0 seconds"), (1, "1 second"), (59.9, "59 seconds"), (60, "1 minute"), (300, "5 minutes"),
    (7200, "2 hours"), (86400 * 3, "3 days"), (86400 * 45, "1 month"), (86400 * 365 * 5 + 100, "5 years"),
])
def test_rough_duration_is_its_largest_whole_unit(seconds, expected):
    assert rough_duration(seconds) == expected


def test_a_draft_is_a_noun_the_other_statuses_adjectives():
    assert (is_status("draft"), is_status("paused"), is_status("scheduled")) == (
        "is a draft", "is paused", "is scheduled")
