"""The dashboard over plain HTTP against a real `senddock serve`: logging in (and being refused,
and throttled), the pages, and POSTs that must change nothing: without a session, without or with
a wrong CSRF token, from another site. Browser tests: test_dashboard_browser.py."""

from __future__ import annotations

import json

import psycopg
import pytest

from dashboard_support import PASSWORD, USER, Client, csrf_of, serving
from senddock.api import Senddock
from senddock.testing import fast_settings
from tests_support import make_broadcast


@pytest.fixture
def sending(make_config, database_dsn, tmp_path):
    """A campaign of 30 recipients enqueued (no node runs: it stays sending) and serve with the dashboard."""
    settings = fast_settings(2525)
    app = Senddock(make_config(settings))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(30)])
    with serving(settings, database_dsn, tmp_path) as served:
        yield app, campaign_id, served
    app.close()


def state(dsn: str, campaign_id: int) -> tuple[str, int, int]:
    """The campaign's status, its status events, and its jobs still to send."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT c.status, (SELECT count(*) FROM campaign_events e WHERE e.campaign_id = c.id), "
            "(SELECT count(*) FROM broadcast_jobs j WHERE j.broadcast_id = c.broadcast_id AND j.status = 'pending') "
            "FROM campaigns c WHERE c.id = %s", (campaign_id,)).fetchone()


def test_a_wrong_password_is_refused_then_throttled_and_never_logged(sending):
    app, campaign_id, served = sending
    client = Client(served.url)
    page = client.get(f"/dashboard/campaigns/{campaign_id}")
    assert page.status == 303 and page.headers["location"] == f"/dashboard/login?next=/dashboard/campaigns/{campaign_id}"
    for _ in range(5):
        refused = client.login(password="wrong password")
        assert refused.status == 401 and "Wrong user name or password" in refused.body
    assert client.get("/dashboard/").status == 303  # still not logged in
    throttled = client.login()  # the right password, too late: not even checked
    assert throttled.status == 429 and "Too many failed logins" in throttled.body
    assert int(throttled.headers["retry-after"]) > 0
    assert client.get("/dashboard/").status == 303
    served.logged("dashboard_login_failed", 5)
    log = served.logged("dashboard_login_throttled")
    assert "wrong password" not in log and PASSWORD not in log


def test_a_login_sets_a_strict_http_only_cookie_and_shows_the_campaign(sending):
    app, campaign_id, served = sending
    client = Client(served.url)
    answer = client.login()
    assert answer.status == 303 and answer.headers["location"] == "/dashboard/"
    cookie = client.set_cookies[-1]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard" in cookie
    assert "Secure" not in cookie  # plain HTTP here; over https the cookie is Secure
    overview = client.get("/dashboard/")
    assert overview.status == 200 and f'href="/dashboard/campaigns/{campaign_id}"' in overview.body
    assert overview.headers["cache-control"] == "no-store" and "frame-ancestors 'none'" in \
        overview.headers["content-security-policy"]
    page = client.get(f"/dashboard/campaigns/{campaign_id}")
    assert page.status == 200
    assert '<progress data-field="bar" max="30" value="0">' in page.body
    assert "Sends per minute" in page.body and "<svg" in page.body and "Attempt log" in page.body
    assert 'id="pause"' in page.body and 'id="resume"' not in page.body
    progress = json.loads(client.get(f"/dashboard/campaigns/{campaign_id}/progress").body)
    assert progress["status"] == "sending" and progress["total"] == 30 and progress["pending"] == 30
    assert client.get("/dashboard/campaigns/999").status == 404
    log = served.logged("dashboard_login")
    assert f'"user": "{USER}"' in log


def test_posts_without_a_session_or_a_good_token_or_from_another_site_change_nothing(sending, database_dsn):
    app, campaign_id, served = sending
    before = state(database_dsn, campaign_id)
    assert before[0] == "sending"
    path = f"/dashboard/campaigns/{campaign_id}/pause"

    stranger = Client(served.url)
    assert stranger.post(path, {"csrf_token": "x"}).status == 401
    stranger.get("/dashboard/login")  # an anonymous session (the login form's) is no login either
    assert stranger.post(path, {"csrf_token": csrf_of(stranger.get("/dashboard/login").body)}).status == 401

    client = Client(served.url)
    client.login()
    token = csrf_of(client.get(f"/dashboard/campaigns/{campaign_id}").body)
    assert client.post(path, {}).status == 403  # no token
    assert client.post(path, {"csrf_token": token[:-1] + ("A" if token[-1] != "A" else "B")}).status == 403
    assert client.post(path, {"csrf_token": csrf_of(stranger.get("/dashboard/login").body)}).status == 403
    assert client.post(path, {"csrf_token": token}, {"Origin": "https://evil.example"}).status == 403
    assert client.post(path, {"csrf_token": token}, {"Origin": "null"}).status == 403
    assert client.post(path, {"csrf_token": token}, {"Sec-Fetch-Site": "cross-site"}).status == 403
    assert client.post(f"/dashboard/campaigns/{campaign_id}/cancel", {"csrf_token": token}).status == 400  # unconfirmed
    assert state(database_dsn, campaign_id) == before
    served.logged("dashboard_post_refused", 6)

    same_site = client.post(path, {"csrf_token": token}, {"Origin": served.url, "Sec-Fetch-Site": "same-origin"})
    assert same_site.status == 303 and same_site.headers["location"] == f"/dashboard/campaigns/{campaign_id}?done=pause"
    assert state(database_dsn, campaign_id)[0] == "paused"
    again = client.post(path, {"csrf_token": token})
    assert again.status == 409 and "Could not pause" in again.body
    history = app.campaign_history(campaign_id)
    assert history[0].to_status == "paused" and history[0].actor == f"senddock-dashboard {USER}"
    assert "dashboard (admin)" in client.get(f"/dashboard/campaigns/{campaign_id}").body
    served.logged("dashboard_action")

    client.post("/dashboard/logout", {"csrf_token": token})
    assert client.get("/dashboard/").status == 303
    assert client.post(f"/dashboard/campaigns/{campaign_id}/resume", {"csrf_token": token}).status == 401
    assert state(database_dsn, campaign_id)[0] == "paused"


def test_the_attempt_log_searches_by_address_and_lists_those_in_doubt(sending, database_dsn):
    app, campaign_id, served = sending
    broadcast_id = app.campaign(campaign_id).broadcast_id
    with psycopg.connect(database_dsn) as conn:
        jobs = dict(conn.execute("SELECT email, id FROM broadcast_jobs WHERE broadcast_id = %s", (broadcast_id,)))
        # user1: a send interrupted by a crash, then sent; user2: sent once.
        for email, attempt, outcome, in_doubt in (("user1@example.com", 1, "in_doubt", True),
                                                  ("user1@example.com", 2, "sent", False),
                                                  ("user2@example.com", 1, "sent", False)):
            conn.execute("INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, node, started_at, outcome, "
                         "in_doubt, smtp_code, message) VALUES (%s, %s, %s, 'n1', now(), %s, %s, 250, 'ok queued')",
                         (jobs[email], broadcast_id, attempt, outcome, in_doubt))
        conn.execute("UPDATE broadcast_jobs SET status = 'sent' WHERE id = ANY(%s)",
                     ([jobs["user1@example.com"], jobs["user2@example.com"]],))
    client = Client(served.url)
    client.login()
    page = client.get(f"/dashboard/campaigns/{campaign_id}").body
    assert "1 recipient may have received two copies" in page
    assert '<li><a href="?email=user1%40example.com#log">user1@example.com</a></li>' in page
    found = client.get(f"/dashboard/campaigns/{campaign_id}?email=USER2@example.com").body
    assert found.count('<tr class="outcome-') == 1 and "user2@example.com" in found and "ok queued" in found
    nobody = client.get(f"/dashboard/campaigns/{campaign_id}?email=nobody@example.com").body
    assert "No attempt to nobody@example.com" in nobody
