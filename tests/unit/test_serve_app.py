"""The serve app in-process (no database: these requests never reach it)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from senddock.loading import load_config
from senddock.web import serve
from senddock.web.fetch import FetchError
from senddock.web.sns import Verifier
from tests_support import asgi_request

TOPIC = "arn:aws:sns:us-east-1:123:ses"


def post(app: Any, body: bytes) -> tuple[int, dict]:
    sent = asgi_request(app, "POST", "/webhooks/ses", body)
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def test_an_unfetchable_certificate_is_503_so_sns_retries_and_is_fetched_once(tmp_path: Path, monkeypatch):
    fetched: list[str] = []

    def unreachable(url: str, **bounds: Any) -> bytes:
        fetched.append(url)
        raise FetchError("took longer than 5s")

    monkeypatch.setattr(serve, "Verifier", functools.partial(Verifier, fetch=unreachable))
    path = tmp_path / "senddock.yaml"
    path.write_text(f"serve:\n  sns_topic_arns: ['{TOPIC}']\n  sns_certificate_timeout: 5s\n")
    app = serve.create_app(load_config(path, environ={}), db=None)  # type: ignore[arg-type]
    document = {"Type": "Notification", "MessageId": "m", "TopicArn": TOPIC, "Message": "{}",
                "Timestamp": "2026-12-02T10:00:00Z", "SignatureVersion": "2", "Signature": "AAAA",
                "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.pem"}
    status, answer = post(app, json.dumps(document).encode())
    assert (status, answer) == (503, {"error": "cannot fetch the signing certificate: took longer than 5s",
                                      "retry": True})
    status, answer = post(app, json.dumps(document).encode())
    assert status == 503 and "failed recently" in answer["error"]
    assert fetched == [document["SigningCertURL"]]


@pytest.mark.parametrize("url", ["https://evil.example/cert.pem", "http://sns.us-east-1.amazonaws.com/c.pem"])
def test_a_certificate_url_off_sns_is_still_403(tmp_path: Path, url: str):
    path = tmp_path / "senddock.yaml"
    path.write_text(f"serve:\n  sns_topic_arns: ['{TOPIC}']\n")
    app = serve.create_app(load_config(path, environ={}), db=None)  # type: ignore[arg-type]
    document = {"Type": "Notification", "MessageId": "m", "TopicArn": TOPIC, "Message": "{}",
                "Timestamp": "2026-12-02T10:00:00Z", "SignatureVersion": "2", "Signature": "AAAA",
                "SigningCertURL": url}
    assert post(app, json.dumps(document).encode())[0] == 403
