"""serve without unsubscribe.secret: the warning it logs says what /unsubscribe really answers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from senddock.loading import load_config
from senddock.web import serve
from tests_support import asgi_request


def request(app: Any, method: str, path: str, body: bytes = b"") -> int:
    sent = asgi_request(app, method, path, body, [(b"content-type", b"application/x-www-form-urlencoded")])
    return sent[0]["status"]


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_the_unsubscribe_off_warning_names_the_status_really_answered(tmp_path: Path, method: str):
    path = tmp_path / "senddock.yaml"
    path.write_text("serve:\n  port: 8025\n", encoding="utf-8")
    with capture_logs() as logs:
        app = serve.create_app(load_config(path, environ={}), db=None)  # type: ignore[arg-type]
    [warning] = [entry for entry in logs if entry["event"] == "unsubscribe_off"]
    assert warning["log_level"] == "warning"
    said = re.search(r"/unsubscribe answers (\d{3})", warning["reason"])
    assert said, warning["reason"]
    status = request(app, method, "/unsubscribe/1.2.3-anything", b"List-Unsubscribe=One-Click")
    assert status == int(said[1]) == 400
