"""The dashboard's routes under /dashboard/, mounted by senddock.web.serve.create_app only when
``serve.admin`` is configured (otherwise none of them exists: 404).

GET pages read; POST changes something, only with a logged-in session, its CSRF token and from
the dashboard's own origin. Every login and every action is logged with who, from where and when
(structlog's timestamp); an action on a campaign also records the operator as the actor of the
status change it makes (`campaign history`).
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import structlog
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from senddock.api import Senddock
from senddock.config import AdminSettings, Config
from senddock.domain import campaign_control
from senddock.domain.campaigns import COMPLAINT_RATE_LIMIT
from senddock.store.db import Database
from senddock.store.queries import query
from senddock.errors import InvalidState, NotFound, SenddockError
from senddock.web.dashboard import charts, data
from senddock.passwords import MAX_PASSWORD_LENGTH, verify_password
from senddock.web.dashboard.security import (CSRF_FIELD, PATH, clear_session, cross_site, csrf_ok, secure_headers,
                                             set_session)
from senddock.web.dashboard.sessions import COOKIE, Session, SessionCookies
from senddock.web.dashboard.throttle import LoginThrottle, Verifications
from senddock.wording import plural

log = structlog.get_logger(__name__)

ACTIONS = ("pause", "resume", "cancel")
DONE = {"pause": "Paused: no more of its jobs are claimed; sends in flight finish.",
        "resume": "Resumed.", "cancel": "Cancelled: its unsent jobs failed as cancelled."}
ACTOR_PREFIX = "senddock-dashboard "  # application_name while an action runs: `campaign history` shows it


def dashboard_routes(config: Config, db: Database) -> list[BaseRoute]:
    admin = config.serve.admin
    if admin is None:
        return []
    return [Mount(PATH, routes=Dashboard(config, db, admin).routes())]


class Dashboard:
    def __init__(self, config: Config, db: Database, admin: AdminSettings) -> None:
        self.sd = Senddock(config, database=db)  # never closed here: serve owns the database
        self.db = db
        self.username = admin.username
        self.password_hash = admin.password_hash
        self.cookies = SessionCookies(password_hash=self.password_hash, secret=admin.session_secret,
                                      lifetime=admin.session_lifetime)
        self.throttle = LoginThrottle()
        self.verifications = Verifications(admin.max_verifying)
        self.templates = Environment(loader=PackageLoader("senddock.web.dashboard", "templates"),
                                     autoescape=select_autoescape(default=True), trim_blocks=True, lstrip_blocks=True)
        self.templates.globals.update(csrf_field=CSRF_FIELD, charts=charts, complaint_limit=COMPLAINT_RATE_LIMIT,
                                      plural=plural, actor_words=campaign_control.actor_words, log_rows=data.LOG_ROWS)
        self.templates.filters["utc"] = _utc

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self.guarded(self.overview), methods=["GET"]),
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.guarded(self.logout), methods=["POST"]),
            Route("/campaigns/{campaign_id:int}", self.guarded(self.campaign), methods=["GET"]),
            Route("/campaigns/{campaign_id:int}/progress", self.guarded(self.progress), methods=["GET"]),
            Route("/campaigns/{campaign_id:int}/{action:str}", self.guarded(self.act), methods=["POST"]),
            Mount("/static", app=StaticFiles(directory=Path(__file__).with_name("static")), name="static"),
        ]

    # -- rendering and guarding ----------------------------------------------------------------

    def page(self, request: Request, template: str, status: int = 200, session: Session | None = None,
             **context: Any) -> HTMLResponse:
        html = self.templates.get_template(template).render(session=session, request_path=request.url.path,
                                                            **context)
        return secure_headers(HTMLResponse(html, status_code=status))

    def message(self, request: Request, title: str, text: str, status: int, session: Session | None = None) -> HTMLResponse:
        return self.page(request, "message.html", status, session=session, title=title, text=text)

    def session(self, request: Request) -> Session | None:
        return self.cookies.loads(request.cookies.get(COOKIE))

    def guarded(self, handler: Callable[..., Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """Only for the logged-in operator; a POST also needs its CSRF token and the same origin.
        Whatever fails inside is a page that says so, never a traceback."""

        async def run(request: Request) -> Response:
            session = self.session(request)
            if session is None or session.user is None:
                if request.method == "POST":
                    return self.message(request, "Not logged in", "Log in first: nothing was changed.", 401)
                if request.url.path.endswith("/progress"):
                    return secure_headers(JSONResponse({"error": "not logged in"}, status_code=401))
                return secure_headers(RedirectResponse(f"{PATH}/login?next={quote(request.url.path)}", 303))
            if request.method == "POST":
                refused = await self.refused_post(request, session)
                if refused is not None:
                    return refused
            if _unreadable_query(request):
                # A NUL in ?email= reached the database and was a 500 with a traceback.
                return self.message(request, "Bad request", "The address holds characters no search can contain.",
                                    400, session)
            try:
                return await handler(request, session)
            except NotFound as exc:
                return self.message(request, "Not found", str(exc), 404, session)
            except psycopg.OperationalError as exc:
                log.warning("dashboard_database_unavailable", error=type(exc).__name__, path=request.url.path)
                return self.message(request, "Database unavailable",
                                    "The database does not answer now; try again in a moment.", 503, session)
            except Exception:
                log.exception("dashboard_error", path=request.url.path)
                return self.message(request, "Something went wrong",
                                    "The error is in senddock serve's log; nothing was shown here.", 500, session)

        return run

    async def refused_post(self, request: Request, session: Session | None,
                           expired: Callable[[], Response] | None = None) -> Response | None:
        """The answer to a POST that must change nothing, or None. ``expired``: the answer to a
        token that no longer matches (the login form's session ended: show the form again)."""
        why = cross_site(request)
        if why is None:
            form = await request.form(max_files=0, max_fields=10, max_part_size=4096)
            request.state.form = form
            if not csrf_ok(session, form.get(CSRF_FIELD)):
                why = "missing or wrong CSRF token"
                if expired is not None and session is None:
                    return expired()
        if why is None:
            return None
        log.warning("dashboard_post_refused", reason=why, path=request.url.path, client=_client(request),
                    user=session.user if session else None)
        return self.message(request, "Refused", f"This request was refused ({why}): nothing was changed. "
                            "Reload the page and try again.", 403, session)

    # -- logging in and out --------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        session = self.session(request)
        if session is not None and session.user is not None:
            return secure_headers(RedirectResponse(f"{PATH}/", 303))
        return self.login_page(request, session)

    def login_page(self, request: Request, session: Session | None, error: str | None = None,
                   status: int = 200, headers: dict[str, str] | None = None) -> Response:
        session = session if session is not None and session.user is None else self.cookies.new()
        form = getattr(request.state, "form", None)  # a refused login keeps where it was going
        target = form.get("next") if form is not None else request.query_params.get("next")
        response = self.page(request, "login.html", status, session=session, error=error, next=_local_next(target))
        response.headers.update(headers or {})
        set_session(response, request, self.cookies, session)
        return response

    async def login(self, request: Request) -> Response:
        session = self.session(request)
        expired = functools.partial(self.login_page, request, None, "The form had expired: log in again.", 403)
        if (refused := await self.refused_post(request, session, expired)) is not None:
            return refused
        form = request.state.form
        client, user, password = _client(request), str(form.get("username", "")), form.get("password", "")
        if not self.verifications.try_start():
            log.warning("dashboard_login_busy", client=client, checking=self.verifications.limit)
            return self.login_page(request, session, "Too many logins at once: try again in a moment.", 503,
                                   {"Retry-After": "1"})
        try:
            wait, mark = self.throttle.reserve(client, user)  # counted before the check, not after
            if wait > 0:
                log.warning("dashboard_login_throttled", client=client, retry_in=round(wait))
                return self.login_page(request, session, f"Too many failed logins: try again in {int(wait) + 1}s.",
                                       429, {"Retry-After": str(int(wait) + 1)})
            known = hmac.compare_digest(user.encode(), self.username.encode())
            # The password is checked even for an unknown user name: both take the same time.
            ok = isinstance(password, str) and len(password) <= MAX_PASSWORD_LENGTH and await run_in_threadpool(
                verify_password, self.password_hash, password) and known
        finally:
            self.verifications.done()
        if not ok:
            # A mistyped user name may be the password: only the configured one is logged.
            log.warning("dashboard_login_failed", client=client, user=user if known else None, user_known=known)
            return self.login_page(request, session, "Wrong user name or password.", 401)
        self.throttle.succeeded(client, user, mark)
        log.info("dashboard_login", user=user, client=client)
        response = secure_headers(RedirectResponse(_local_next(form.get("next")) or f"{PATH}/", 303))
        set_session(response, request, self.cookies, self.cookies.new(user))
        return response

    async def logout(self, request: Request, session: Session) -> Response:
        self.cookies.revoke(session)
        log.info("dashboard_logout", user=session.user, client=_client(request))
        response = secure_headers(RedirectResponse(f"{PATH}/login", 303))
        clear_session(response, request)
        return response

    # -- reading -------------------------------------------------------------------------------

    async def overview(self, request: Request, session: Session) -> Response:
        rows = await run_in_threadpool(data.overview, self.sd)
        return self.page(request, "overview.html", session=session, rows=rows,
                         active=any(r.status in data.ACTIVE for r in rows))

    async def campaign(self, request: Request, session: Session, *, done: str | None = None,
                       error: str | None = None, status: int = 200) -> Response:
        campaign_id = request.path_params["campaign_id"]
        email = (request.query_params.get("email") or "").strip()[:320]
        shown = await run_in_threadpool(data.campaign_page, self.sd, campaign_id, email=email)
        return self.page(request, "campaign.html", status, session=session, page=shown,
                         done=done or DONE.get(request.query_params.get("done", "")), error=error)

    async def progress(self, request: Request, session: Session) -> Response:
        shown = await run_in_threadpool(data.progress, self.sd, request.path_params["campaign_id"])
        return secure_headers(JSONResponse(shown.as_dict()))

    # -- acting --------------------------------------------------------------------------------

    async def act(self, request: Request, session: Session) -> Response:
        campaign_id, action = request.path_params["campaign_id"], request.path_params["action"]
        if action not in ACTIONS:
            return self.message(request, "Not found", f"No action {action!r}.", 404, session)
        if action == "cancel" and request.state.form.get("confirm") != "yes":
            return await self.campaign(request, session, error="Tick the box to confirm the cancel: nothing was "
                                                               "changed.", status=400)
        who = {"user": session.user, "client": _client(request), "action": action, "campaign_id": campaign_id}
        try:
            result = await run_in_threadpool(_act, self.db, session.user, action, campaign_id)
        except (InvalidState, NotFound) as exc:
            log.warning("dashboard_action_refused", **who, reason=str(exc))
            if isinstance(exc, NotFound):
                raise
            return await self.campaign(request, session, error=f"Could not {action}: {exc}", status=409)
        except SenddockError as exc:
            log.warning("dashboard_action_refused", **who, reason=str(exc))
            return await self.campaign(request, session, error=f"Could not {action}: {exc}", status=400)
        log.info("dashboard_action", **who, **result)
        return secure_headers(RedirectResponse(f"{PATH}/campaigns/{campaign_id}?done={action}", 303))


def _act(db: Database, user: str, action: str, campaign_id: int) -> dict[str, Any]:
    """The CLI's own pause, resume and cancel, in a transaction that names the operator as the actor."""
    with db.connection() as conn, conn.transaction():
        conn.execute(query("session_actor"), {"actor": ACTOR_PREFIX + user})
        if action == "pause":
            campaign_control.pause_campaign(conn, campaign_id)
        elif action == "resume":
            campaign_control.resume_campaign(conn, campaign_id)
        else:
            return {"cancelled_jobs": campaign_control.cancel_campaign(conn, campaign_id)}
    return {}


def _utc(moment: datetime, form: str = "%Y-%m-%d %H:%M:%S") -> str:
    return moment.astimezone(timezone.utc).strftime(form)


def _unreadable_query(request: Request) -> bool:
    """A query parameter with a control character (a NUL first of all: Postgres text refuses it)."""
    return any(any(ord(c) < 32 or ord(c) == 127 for c in value) for _, value in request.query_params.multi_items())


def _client(request: Request) -> str:
    return request.client.host if request.client else "-"


def _local_next(target: object) -> str | None:
    """Where to go after logging in: a dashboard path only (never another site: an open redirect)."""
    if isinstance(target, str) and target.startswith(f"{PATH}/") and "//" not in target and "\\" not in target:
        return target
    return None
