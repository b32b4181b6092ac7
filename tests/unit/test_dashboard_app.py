"""The dashboard app in-process, without a database: no routes at all without serve.admin, the
files it serves are in the installed package, the charts draw what they are given."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from importlib import resources
from pathlib import Path

import pytest

from senddock.loading import load_config
from senddock.web import serve
from senddock.web.dashboard import charts
from senddock.web.dashboard.data import format_eta
from tests_support import asgi_request

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("method,path", [("GET", "/dashboard/"), ("GET", "/dashboard/login"),
                                         ("POST", "/dashboard/login"), ("GET", "/dashboard/campaigns/1"),
                                         ("POST", "/dashboard/campaigns/1/pause"),
                                         ("GET", "/dashboard/static/dashboard.js")])
def test_without_serve_admin_no_dashboard_route_exists(tmp_path: Path, method: str, path: str):
    config = tmp_path / "senddock.yaml"
    config.write_text("logging: {level: warning}\n", encoding="utf-8")
    app = serve.create_app(load_config(config, environ={}), db=None)  # type: ignore[arg-type]
    assert asgi_request(app, method, path)[0]["status"] == 404


def test_the_installed_package_ships_every_template_and_static_file():
    """.ci/run installs senddock with `pip install .` (not editable): the templates and static files
    must be package data, or the dashboard of an installed senddock has no pages."""
    installed = resources.files("senddock.web.dashboard")
    source = REPO / "senddock" / "web" / "dashboard"
    for folder in ("templates", "static"):
        names = sorted(p.name for p in (source / folder).iterdir() if p.is_file())
        assert names, f"no {folder} in the source tree"
        shipped = sorted(p.name for p in installed.joinpath(folder).iterdir() if p.is_file())
        assert shipped == names, f"{folder}: the installed package has {shipped}, the source {names}"
    for name in ("base.html", "campaign.html", "login.html"):
        assert "{% " in installed.joinpath("templates", name).read_text(encoding="utf-8")


def minutes(*rows):
    start = datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc)
    return [{"minute": start + timedelta(minutes=i), "sent": s, "bounced": b, "failed": f, "other": 0,
             "later_bounces": 0, "complaints": c} for i, (s, b, f, c) in enumerate(rows)]


def test_the_sends_chart_stacks_each_minute_and_labels_its_scale():
    svg = charts.sends_per_minute(minutes((90, 10, 0, 0), (0, 0, 0, 0), (40, 0, 5, 0)))
    assert svg.count("<rect") == 4  # sent+bounced, nothing, sent+failed
    assert ">100<" in svg and "10:00" in svg and "10:02 UTC" in svg
    assert "10:00: 90 sent" in svg and "10:02: 5 failed" in svg


def test_the_rates_chart_draws_bounce_and_complaint_rates_against_the_limit():
    svg = charts.rates_per_minute(minutes((95, 5, 0, 1), (100, 0, 0, 0)), complaint_limit=0.003)
    assert "10:00: bounce rate 5.00%" in svg and "10:00: complaint rate 1.05%" in svg
    assert "complaint limit 0.3%" in svg
    assert charts.rates_per_minute([], 0.003) == ""


def test_eta_reads_as_time_left():
    assert [format_eta(s) for s in (None, 42, 125, 7300)] == ["-", "42s", "2m05s", "2h01m"]


@pytest.mark.parametrize("scheme,secure", [("https", True), ("http", False)])
def test_the_session_cookie_is_secure_over_https(scheme: str, secure: bool):
    from starlette.requests import Request
    from starlette.responses import Response

    from senddock.web.dashboard.security import set_session
    from senddock.web.dashboard.sessions import SessionCookies

    request = Request({"type": "http", "method": "GET", "path": "/dashboard/", "headers": [], "scheme": scheme,
                       "server": ("mail.example.com", 443), "query_string": b""})
    cookies = SessionCookies(password_hash="$argon2id$h", secret=None, lifetime=3600)
    response = Response()
    set_session(response, request, cookies, cookies.new("admin"))
    header = response.headers["set-cookie"]
    assert "HttpOnly" in header and "SameSite=strict" in header and "Path=/dashboard" in header
    assert ("Secure" in header) is secure


@pytest.mark.parametrize("headers,refused", [
    ({}, False),  # no browser hint: the CSRF token decides
    ({"origin": "http://mail.example.com:8025"}, False),
    ({"origin": "https://mail.example.com:8025"}, False),  # TLS ended by a proxy in front
    ({"origin": "https://evil.example"}, True),
    ({"origin": "null"}, True),
    ({"referer": "https://evil.example/page"}, True),
    ({"sec-fetch-site": "same-site"}, True),
    ({"sec-fetch-site": "same-origin", "origin": "http://mail.example.com:8025"}, False),
])
def test_a_post_from_another_site_is_told_apart(headers: dict, refused: bool):
    from starlette.requests import Request

    from senddock.web.dashboard.security import cross_site

    raw = [(b"host", b"mail.example.com:8025")] + [(k.encode(), v.encode()) for k, v in headers.items()]
    request = Request({"type": "http", "method": "POST", "path": "/dashboard/login", "headers": raw, "scheme": "http",
                       "query_string": b""})
    assert (cross_site(request) is not None) is refused
