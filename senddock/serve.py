"""`senddock serve`: the HTTP endpoint behind every List-Unsubscribe URL (RFC 8058).

* ``POST /unsubscribe/{token}`` with ``List-Unsubscribe=One-Click`` unsubscribes at once: what
  mail providers send when a user clicks "unsubscribe" in their interface. No cookies, no
  redirect, no confirmation step (RFC 8058 section 3.2).
* ``GET /unsubscribe/{token}``: a person who followed the link from the message body gets a page
  with one button, which posts the same form. A GET never unsubscribes: link scanners and
  prefetchers follow every URL in a message.
* A malformed or tampered token is answered 400 and changes nothing.
* ``GET /healthz`` for load balancers: 200 when the database answers.

Tokens are checked with the HMAC secret alone; the database is touched only for a valid one.
Access logs are off: the URL carries the token, and one structured line per unsubscribe (with
the subscriber id, not the token) is what an operator needs.
"""

from __future__ import annotations

from html import escape

import structlog
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse
from starlette.routing import Route

from senddock.config import Config
from senddock.core import subscribers
from senddock.core.db import Database
from senddock.errors import ConfigError
from senddock.unsubscribe import BadToken, UnsubscribeToken, read_token

log = structlog.get_logger(__name__)

ONE_CLICK_FIELD, ONE_CLICK_VALUE = "List-Unsubscribe", "One-Click"

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<meta name="robots" content="noindex"><title>{title}</title></head>
<body style="font-family: sans-serif; max-width: 32em; margin: 4em auto; padding: 0 1em">
<h1 style="font-size: 1.4em">{title}</h1>{body}</body></html>
"""


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(_PAGE.format(title=escape(title), body=body), status_code=status,
                        headers={"Cache-Control": "no-store"})


def create_app(config: Config, db: Database) -> Starlette:
    secret = config.section("unsubscribe").get("secret")
    if not secret:
        raise ConfigError(["$.unsubscribe.secret: `senddock serve` needs the secret the links were signed with"])

    def token_of(request: Request) -> UnsubscribeToken | None:
        try:
            return read_token(secret, request.path_params["token"])
        except BadToken:
            return None

    def confirm(request: Request) -> HTMLResponse:
        if token_of(request) is None:
            return _page("Invalid link", "<p>This unsubscribe link is not valid. Nothing was changed.</p>", 400)
        form = (f'<form method="post"><input type="hidden" name="{ONE_CLICK_FIELD}" value="{ONE_CLICK_VALUE}">'
                '<button type="submit">Unsubscribe</button></form>')
        return _page("Unsubscribe", "<p>Stop receiving these emails?</p>" + form)

    async def one_click(request: Request) -> HTMLResponse:
        token = token_of(request)
        if token is None:
            return _page("Invalid link", "<p>This unsubscribe link is not valid. Nothing was changed.</p>", 400)
        form = await request.form()
        if form.get(ONE_CLICK_FIELD) != ONE_CLICK_VALUE:
            return _page("Bad request", f"<p>Expected {ONE_CLICK_FIELD}={ONE_CLICK_VALUE} (RFC 8058).</p>", 400)
        email = await run_in_threadpool(_unsubscribe, db, token)
        if email is None:
            return _page("Unknown subscriber", "<p>No such subscriber. Nothing was changed.</p>", 404)
        log.info("unsubscribed", subscriber_id=token.subscriber_id, campaign_id=token.campaign_id)
        return _page("Unsubscribed", f"<p>{escape(email)} will receive no more of these emails.</p>")

    async def healthz(request: Request) -> JSONResponse:
        try:
            await run_in_threadpool(_ping, db)
        except Exception as exc:
            return JSONResponse({"ok": False, "error": type(exc).__name__}, status_code=503)
        return JSONResponse({"ok": True})

    async def not_found(request: Request, exc: Exception) -> PlainTextResponse:
        return PlainTextResponse("not found", status_code=404)

    return Starlette(
        routes=[
            Route("/unsubscribe/{token}", confirm, methods=["GET"]),
            Route("/unsubscribe/{token}", one_click, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers={404: not_found},
    )


def _unsubscribe(db: Database, token: UnsubscribeToken) -> str | None:
    with db.connection() as conn:
        return subscribers.unsubscribe(conn, token.subscriber_id, token.campaign_id)


def _ping(db: Database) -> None:
    with db.connection() as conn:
        conn.execute("SELECT 1")
