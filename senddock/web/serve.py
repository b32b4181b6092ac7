"""`senddock serve`: the HTTP endpoint behind every List-Unsubscribe URL (RFC 8058).

* ``POST /unsubscribe/{token}`` with ``List-Unsubscribe=One-Click`` unsubscribes at once: what
  mail providers send when a user clicks "unsubscribe" in their interface. No cookies, no
  redirect, no confirmation step (RFC 8058 section 3.2).
* ``GET /unsubscribe/{token}``: a person who followed the link from the message body gets a page
  with one button, which posts the same form. A GET never unsubscribes: link scanners and
  prefetchers follow every URL in a message.
* A malformed or tampered token is answered 400 and changes nothing.
* ``GET /healthz`` for load balancers: 200 when the database answers.
* ``GET /metrics``: the cluster's Prometheus metrics, to ``serve.metrics.allow`` or its token
  (senddock.web.metrics_endpoint).
* ``/dashboard/``: the web dashboard (senddock.web.dashboard), only with ``serve.admin`` configured.
* ``POST /webhooks/ses``: SES notifications delivered by SNS over HTTP(S). The topic must be one
  of ``serve.sns_topic_arns`` and the SNS signature must verify (403 and nothing applied otherwise;
  503 when the signing certificate cannot be fetched now); a subscription is confirmed; a notification
  is applied as ``senddock events ingest`` would. One about a message no job sent (yet) is
  answered 503, so SNS delivers it again later; a malformed one 400.

Tokens are checked with the HMAC secret alone; the database is touched only for a valid one.
Access logs are off: the URL carries the token, and one structured line per unsubscribe (with
the subscriber id, not the token) is what an operator needs.
"""

from __future__ import annotations

import json
import urllib.request
from html import escape

import structlog
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse
from starlette.routing import Route

from senddock.config import Config
from senddock.domain import subscribers
from senddock.store.db import Database
from senddock.domain.events import UnknownMessage, apply_events
from senddock.store.suppressions import Suppressions
from senddock.mail.unsubscribe import BadToken, UnsubscribeToken, read_token
from senddock.outcome import EventError
from senddock.web.dashboard.routes import dashboard_routes
from senddock.web.http_limits import BodyLimit, HttpLimits
from senddock.web.metrics_endpoint import metrics_endpoint
from senddock.web.sns import CertificateUnavailable, SignatureError, Verifier, is_sns_url
from senddock.config.webhooks import Subscriptions, subscriptions

log = structlog.get_logger(__name__)

ONE_CLICK_FIELD, ONE_CLICK_VALUE = "List-Unsubscribe", "One-Click"
# What SNS always sends as strings (or leaves out). Anything else is not SNS, and must not reach
# code that hashes or formats these fields: a list as TopicArn was a 500.
_SNS_STRING_FIELDS = ("Type", "MessageId", "TopicArn", "Subject", "Message", "Timestamp", "SignatureVersion",
                      "Signature", "SigningCertURL", "SubscribeURL", "Token", "UnsubscribeURL")

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<meta name="robots" content="noindex"><title>{title}</title></head>
<body style="font-family: sans-serif; max-width: 32em; margin: 4em auto; padding: 0 1em">
<h1 style="font-size: 1.4em">{title}</h1>{body}</body></html>
"""


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(_PAGE.format(title=escape(title), body=body), status_code=status,
                        headers={"Cache-Control": "no-store"})


# One status for every link that cannot be read, so the warning logged when unsubscribe is off
# says what is really answered.
INVALID_LINK_STATUS = 400


def _invalid_link() -> HTMLResponse:
    return _page("Invalid link", "<p>This unsubscribe link is not valid. Nothing was changed.</p>", INVALID_LINK_STATUS)


def create_app(config: Config, db: Database) -> Starlette:
    secret = config.unsubscribe.secret
    if not secret:
        log.warning("unsubscribe_off", reason=f"unsubscribe.secret is not set: /unsubscribe answers "
                                              f"{INVALID_LINK_STATUS} (invalid link) to every link")

    def token_of(request: Request) -> UnsubscribeToken | None:
        if not secret:
            return None
        try:
            return read_token(secret, request.path_params["token"])
        except BadToken:
            return None

    def confirm(request: Request) -> HTMLResponse:
        if token_of(request) is None:
            return _invalid_link()
        form = (f'<form method="post"><input type="hidden" name="{ONE_CLICK_FIELD}" value="{ONE_CLICK_VALUE}">'
                '<button type="submit">Unsubscribe</button></form>')
        return _page("Unsubscribe", "<p>Stop receiving these emails?</p>" + form)

    async def one_click(request: Request) -> HTMLResponse:
        token = token_of(request)
        if token is None:
            return _invalid_link()
        # RFC 8058 posts one short field: room for a few more, none long, no files (the body as a
        # whole is capped by BodyLimit before this reads it).
        form = await request.form(max_files=0, max_fields=10, max_part_size=1024)
        if form.get(ONE_CLICK_FIELD) != ONE_CLICK_VALUE:
            return _page("Bad request", f"<p>Expected {ONE_CLICK_FIELD}={ONE_CLICK_VALUE} (RFC 8058).</p>", 400)
        email = await run_in_threadpool(_unsubscribe, db, token, subscriptions(config.data))
        if email is None:
            return _page("Unknown subscriber", "<p>No such subscriber. Nothing was changed.</p>", 404)
        log.info("unsubscribed", subscriber_id=token.subscriber_id, campaign_id=token.campaign_id)
        return _page("Unsubscribed", f"<p>{escape(email)} will receive no more of these emails.</p>")

    settings = config.serve
    verifier = Verifier({url: config.folder / path for url, path in settings.sns_certificates.items()},
                        timeout=settings.sns_certificate_timeout)
    suppressions = Suppressions(db)
    pm = config.plugin_manager
    topics = set(settings.sns_topic_arns)

    async def ses_webhook(request: Request) -> JSONResponse:
        try:
            document = json.loads(await request.body())
        except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past Python's stack
            return JSONResponse({"error": "not JSON"}, status_code=400)
        if not isinstance(document, dict):
            return JSONResponse({"error": "not a JSON object"}, status_code=400)
        odd = next((name for name in _SNS_STRING_FIELDS if not isinstance(document.get(name), (str, type(None)))), None)
        if odd is not None:
            return JSONResponse({"error": f"not an SNS message: {odd} is not a string"}, status_code=400)
        # Anyone can sign with SNS's key by publishing to a topic of their own: only the topics
        # configured here are believed, before any subscription is confirmed or event applied.
        if document.get("TopicArn") not in topics:
            log.warning("sns_refused", reason="topic not in serve.sns_topic_arns", topic=document.get("TopicArn"))
            return JSONResponse({"error": "refused: topic not in serve.sns_topic_arns"}, status_code=403)
        try:
            await run_in_threadpool(verifier.verify, document)
        except SignatureError as exc:
            log.warning("sns_refused", reason=str(exc), topic=document.get("TopicArn"))
            return JSONResponse({"error": f"refused: {exc}"}, status_code=403)
        except CertificateUnavailable as exc:
            log.warning("sns_unverified", reason=str(exc), topic=document.get("TopicArn"))
            return JSONResponse({"error": str(exc), "retry": True}, status_code=503)
        kind = document.get("Type")
        if kind == "SubscriptionConfirmation":
            url = str(document.get("SubscribeURL", ""))
            if not is_sns_url(url):
                return JSONResponse({"error": "SubscribeURL is not an SNS host of amazonaws.com"}, status_code=400)
            await run_in_threadpool(_confirm, url)
            log.info("sns_subscribed", topic=document.get("TopicArn"))
            return JSONResponse({"confirmed": True})
        if kind != "Notification":
            return JSONResponse({"ignored": kind})
        try:
            parsed = pm.hook.parse_provider_event(document=document, config=config)
            if parsed is None:
                return JSONResponse({"error": "not a notification any installed plugin reads"}, status_code=400)
            applied = await run_in_threadpool(apply_events, db, pm, config, suppressions, parsed)
        except EventError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except UnknownMessage as exc:
            return JSONResponse({"error": str(exc), "retry": True}, status_code=503)
        if applied.hooks_failed:
            return JSONResponse({"error": "on_bounced failed", "retry": True}, status_code=500)
        return JSONResponse({"recorded": applied.recorded, "already_recorded": applied.already_recorded,
                             "suppressed": len(applied.suppressed)})

    async def healthz(request: Request) -> JSONResponse:
        try:
            await run_in_threadpool(_ping, db)
        except Exception as exc:
            return JSONResponse({"ok": False, "error": type(exc).__name__}, status_code=503)
        return JSONResponse({"ok": True})

    async def not_found(request: Request, exc: Exception) -> PlainTextResponse:
        return PlainTextResponse("not found", status_code=404)

    limits = HttpLimits.from_settings(settings)
    return Starlette(
        # Inside Starlette's error middleware, so a refused body is never turned into a 500.
        middleware=[Middleware(BodyLimit, max_body=limits.max_body, timeout=limits.body_timeout)],
        routes=[
            Route("/unsubscribe/{token}", confirm, methods=["GET"]),
            Route("/unsubscribe/{token}", one_click, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/webhooks/ses", ses_webhook, methods=["POST"]),
            Route("/metrics", metrics_endpoint(config, db), methods=["GET"]),
            *dashboard_routes(config, db),  # none without serve.admin: /dashboard/ is then a 404
        ],
        exception_handlers={404: not_found},
    )


def _unsubscribe(db: Database, token: UnsubscribeToken, webhooks: Subscriptions) -> str | None:
    with db.connection() as conn:
        return subscribers.unsubscribe(conn, token.subscriber_id, token.campaign_id, webhooks=webhooks)


def _confirm(url: str) -> None:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - https, SNS host (checked)
        response.read()


def _ping(db: Database) -> None:
    with db.connection() as conn:
        conn.execute("SELECT 1")
