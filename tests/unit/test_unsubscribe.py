"""Unsubscribe tokens: verifiable without a lookup, unforgeable without the secret."""

from __future__ import annotations

import pytest

from senddock.mail.unsubscribe import (
    BadToken,
    UnsubscribeToken,
    make_token,
    read_token,
    unsubscribe_url,
)

SECRET = "s3cret-for-tests-only"


def test_a_token_reads_back_as_what_it_was_made_for():
    token = make_token(SECRET, 42, 7)
    assert read_token(SECRET, token) == UnsubscribeToken(subscriber_id=42, campaign_id=7)
    assert unsubscribe_url("https://lists.example.com/", token) == f"https://lists.example.com/unsubscribe/{token}"


@pytest.mark.parametrize("tamper", ["other subscriber", "other secret", "truncated", "garbage", "empty"])
def test_a_tampered_or_foreign_token_is_refused(tamper):
    token = make_token(SECRET, 42, 7)
    payload, mac = token.split(".")
    bad = {
        "other subscriber": f"{make_token(SECRET, 43, 7).split('.')[0]}.{mac}",
        "other secret": make_token("another-secret-entirely", 42, 7),
        "truncated": token[:-3],
        "garbage": "not a token at all",
        "empty": "",
    }[tamper]
    with pytest.raises(BadToken):
        read_token(SECRET, bad)
