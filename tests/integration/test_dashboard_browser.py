"""The dashboard in a real browser: Playwright driving Debian's chromium (executable_path; Playwright's
own browser download is never used). A node drains a campaign through a paced SMTP sink while the
browser logs in, watches the progress bar move, pauses, resumes and cancels, each seen in the database.

``SENDDOCK_DASHBOARD_SCREENSHOT=docs/dashboard.png`` also saves the campaign page mid-drain (README's picture).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dashboard_support import PASSWORD, USER, serving
from senddock.api import Senddock
from senddock.sink import FailRule, Sink
from senddock.testing import fast_settings
from tests_support import make_broadcast, require_tool, start_node, write_config

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = os.environ.get("SENDDOCK_DASHBOARD_SCREENSHOT")
# For the screenshot, a drain of a few minutes: a few bars in the per-minute charts.
RECIPIENTS = 4000 if SCREENSHOT else 2400


@pytest.fixture
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    require_tool(str(CHROMIUM), "chromium")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield launched
        finally:
            launched.close()


def status_of(dsn: str, campaign_id: int) -> str:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT status FROM campaigns WHERE id = %s", (campaign_id,)).fetchone()[0]


def test_log_in_watch_the_progress_move_then_pause_resume_and_cancel(browser, make_config, database_dsn, tmp_path):
    # Two sends at a time to a relay that takes 100 ms a message: two minutes to drain, so the
    # campaign is still sending when the browser pauses it. One address in 40 bounces (2.5%: under
    # the breaker's 20%), so the charts and the bounce rates have something to show.
    with Sink("127.0.0.1", 0, delay=0.1, rules=[FailRule.parse("gone*@example.com=550 5.1.1 no such user")]) as sink:
        settings = fast_settings(sink.port, concurrency=2,
                                 pacing={"domains": [{"match": ["example.com"], "rate": "100/s"}]})
        app = Senddock(make_config(settings))
        emails = [f"{'gone' if i % 40 == 39 else 'reader'}{i}@example.com" for i in range(RECIPIENTS)]
        campaign_id = make_broadcast(app, emails, name="Winter news")
        node = start_node(write_config(tmp_path, settings), database_dsn, "node-a")
        try:
            with serving(settings, database_dsn, tmp_path) as served:
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                drive(page, served, campaign_id, database_dsn)
        finally:
            node.terminate()
            node.wait(60)
            app.close()


def drive(page, served, campaign_id: int, dsn: str) -> None:
    page.goto(f"{served.url}/dashboard/campaigns/{campaign_id}")
    assert page.url.endswith(f"/dashboard/login?next=/dashboard/campaigns/{campaign_id}")
    page.fill("input[name=username]", USER)
    page.fill("input[name=password]", "not the password")
    page.click("button[type=submit]")
    assert page.locator(".error").inner_text() == "Wrong user name or password."
    page.fill("input[name=username]", USER)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"**/dashboard/campaigns/{campaign_id}")

    # The live refresh (dashboard.js) moves the bar without a reload: twice, to see it move.
    bar = page.locator("#progress progress")
    for _ in range(2):
        seen = int(bar.get_attribute("value"))
        page.wait_for_function(
            "([seen]) => document.querySelector('#progress progress').value > seen", arg=[seen], timeout=30_000)
    assert int(bar.get_attribute("value")) < RECIPIENTS
    assert page.locator("#status").inner_text() == "sending"
    assert page.locator("[data-field=per_minute]").first.inner_text() != "0"
    assert "domain:example.com" in page.locator("table.pacing").inner_text()
    # The charts, bounces and pacing are drawn again from the page every few refreshes.
    page.evaluate("() => { document.getElementById('charts').dataset.old = 'yes'; }")
    page.wait_for_function("() => document.getElementById('charts').dataset.old !== 'yes'", timeout=60_000)
    assert page.locator("#charts svg.chart rect").count() >= 1
    if SCREENSHOT:
        # README's picture, late in the drain (not part of the test: it only waits for it).
        page.wait_for_function(f"() => document.querySelector('#progress progress').value > {RECIPIENTS * 7 // 10}",
                               timeout=600_000)
        page.set_viewport_size({"width": 1280, "height": 1480})
        page.reload()
        page.screenshot(path=SCREENSHOT)

    page.click("#pause")
    page.wait_for_url(f"**/dashboard/campaigns/{campaign_id}?done=pause")
    assert page.locator("#status").inner_text() == "paused"
    assert status_of(dsn, campaign_id) == "paused"
    assert "dashboard (admin)" in page.locator("table.history").inner_text()

    page.click("#resume")
    page.wait_for_url(f"**/dashboard/campaigns/{campaign_id}?done=resume")
    assert status_of(dsn, campaign_id) == "sending"

    page.click("#cancel")  # the confirmation box is required: the browser does not send the form
    assert status_of(dsn, campaign_id) == "sending"
    page.check("input[name=confirm]")
    page.click("#cancel")
    page.wait_for_url(f"**/dashboard/campaigns/{campaign_id}?done=cancel")
    assert status_of(dsn, campaign_id) == "cancelled"
    assert page.locator("#status").inner_text() == "cancelled"
    log = served.logged("dashboard_action", 3)
    assert '"action": "cancel"' in log and '"user": "admin"' in log


def test_without_javascript_the_pages_read_and_refresh_themselves(browser, make_config, database_dsn, tmp_path):
    settings = fast_settings(2525)
    app = Senddock(make_config(settings))
    campaign_id = make_broadcast(app, ["one@example.com", "two@example.com"])
    app.close()
    with serving(settings, database_dsn, tmp_path) as served:
        context = browser.new_context(java_script_enabled=False)
        page = context.new_page()
        page.goto(f"{served.url}/dashboard/login")
        page.fill("input[name=username]", USER)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{served.url}/dashboard/")
        page.click(f"a[href='/dashboard/campaigns/{campaign_id}'] >> nth=0")
        page.wait_for_url(f"**/dashboard/campaigns/{campaign_id}")
        assert page.locator("#progress .figures").inner_text().replace("\n", " ") == "0/2 (0.0%)"
        assert page.locator("noscript").count() == 1  # the meta refresh of a campaign in flight
        page.click("#pause")  # forms work without a script
        page.wait_for_url(f"**/dashboard/campaigns/{campaign_id}?done=pause")
        assert status_of(database_dsn, campaign_id) == "paused"
        context.close()
