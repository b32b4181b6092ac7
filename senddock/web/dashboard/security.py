"""What every dashboard answer carries, and the checks on every POST: the session's CSRF token,
and a request that comes from the dashboard's own pages (Origin / Sec-Fetch-Site)."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from senddock.web.dashboard.sessions import COOKIE, Session, SessionCookies, tokens_match

# Scripts and styles from the package's own /dashboard/static only (no inline script can run),
# never framed, forms posted only here.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
CSRF_FIELD = "csrf_token"
PATH = "/dashboard"


def secure_headers(response: Response) -> Response:
    response.headers.update(HEADERS)
    return response


def set_session(response: Response, request: Request, cookies: SessionCookies, session: Session) -> None:
    """HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it), Secure when
    the request came over HTTPS: uvicorn's own TLS, or a proxy uvicorn trusts saying so
    (X-Forwarded-Proto from --forwarded-allow-ips, 127.0.0.1 by default)."""
    response.set_cookie(COOKIE, cookies.dumps(session), max_age=session.remaining, path=PATH, httponly=True,
                        secure=request.url.scheme == "https", samesite="strict")


def clear_session(response: Response, request: Request) -> None:
    response.delete_cookie(COOKIE, path=PATH, httponly=True, secure=request.url.scheme == "https", samesite="strict")


def cross_site(request: Request) -> str | None:
    """Why a POST does not come from the dashboard's own pages, or None. A browser says where a
    request comes from in Origin (and Sec-Fetch-Site); a missing header is left to the CSRF token
    (non-browser clients send neither). The host is compared, not the scheme: behind a proxy that
    ends TLS the request reaches senddock over plain HTTP."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site: {site}"
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is None:
        return None
    host = request.headers.get("host", "").lower()
    if origin == "null" or urlsplit(origin).netloc.lower() != host:
        return f"from another origin ({origin[:100]})"
    return None


def csrf_ok(session: Session | None, form_token: object) -> bool:
    return session is not None and isinstance(form_token, str) and tokens_match(form_token, session.csrf)
