"""Webhook signatures, checked by the Standard Webhooks project's own library."""

from __future__ import annotations

import base64
import time

import pytest
import standardwebhooks

from senddock.webhooks import signing
from senddock.config.webhooks import decode_secret, shown_url

NEW = "whsec_" + base64.b64encode(b"n" * 32).decode()
OLD = "whsec_" + base64.b64encode(b"o" * 32).decode()


def test_a_signature_verifies_with_the_standard_library():
    body = b'{"type":"message.sent","data":{"email":"a@example.com"}}'
    headers = signing.headers([decode_secret(NEW)], "msg_1", int(time.time()), body)
    assert standardwebhooks.Webhook(NEW).verify(body, headers)["type"] == "message.sent"
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(OLD).verify(body, headers)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(NEW).verify(body + b" ", headers)  # a byte changed


def test_while_keys_rotate_each_key_verifies():
    body = b"[]"
    headers = signing.headers([decode_secret(NEW), decode_secret(OLD)], "batch_x", int(time.time()), body)
    assert headers["webhook-signature"].count("v1,") == 2
    for secret in (NEW, OLD):
        standardwebhooks.Webhook(secret).verify(body, headers)


@pytest.mark.parametrize(("secret", "message"), [
    ("c2VjcmV0", "must start with whsec_"),
    ("whsec_not base64!", "is not whsec_ followed by base64"),
    ("whsec_" + base64.b64encode(b"x" * 23).decode(), "is too short"),
])
def test_a_bad_secret_is_refused_without_its_value(secret: str, message: str):
    with pytest.raises(ValueError, match=message) as refused:
        decode_secret(secret)
    assert secret not in str(refused.value)


def test_urls_are_shown_without_their_secrets():
    assert shown_url("https://u:p%40ss@hooks.example.com/in?token=abc") == "https://u:***@hooks.example.com/in?***"
    assert shown_url("https://hooks.example.com/in") == "https://hooks.example.com/in"
