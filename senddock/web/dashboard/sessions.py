"""The dashboard's session: a cookie signed with HMAC-SHA256, holding who is logged in (or nobody,
before the login form is sent), the session's CSRF token and when it ends.

Nothing is kept on the server but the key and the tokens of sessions logged out before their end,
so a restart or a second `serve` process with the same ``serve.admin.session_secret`` accepts the
same cookies. The key is derived from the secret *and* the password hash: a new password ends
every session. Without a secret each process draws a random key (a restart logs everyone out).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "senddock_dashboard"
# The login form's session, before anyone logged in: long enough to type a password.
ANONYMOUS_LIFETIME = 3600.0


@dataclass(frozen=True)
class Session:
    user: str | None  # None: nobody logged in yet (the login form's CSRF token only)
    csrf: str  # also the session's identity: a logout revokes it
    expires: float  # unix time

    @property
    def remaining(self) -> int:
        return max(0, int(self.expires - time.time()))


class SessionCookies:
    def __init__(self, *, password_hash: str, secret: str | None, lifetime: float,
                 clock: Callable[[], float] = time.time) -> None:
        base = secret.encode() if secret else os.urandom(32)
        self._key = hmac.new(base, b"senddock-dashboard-session\0" + password_hash.encode(), hashlib.sha256).digest()
        self.lifetime = lifetime
        self._clock = clock
        self._revoked: dict[str, float] = {}  # csrf token -> when its session would have ended anyway
        self._lock = threading.Lock()

    def new(self, user: str | None = None) -> Session:
        """A fresh session (a new token: logging in never keeps the anonymous session's token)."""
        lifetime = self.lifetime if user is not None else ANONYMOUS_LIFETIME
        return Session(user=user, csrf=secrets.token_urlsafe(32), expires=self._clock() + lifetime)

    def dumps(self, session: Session) -> str:
        payload = _b64(json.dumps([session.user, session.csrf, int(session.expires)], separators=(",", ":")).encode())
        return f"{payload}.{_b64(self._sign(payload))}"

    def loads(self, value: str | None) -> Session | None:
        """The session of a cookie, or None when it is missing, forged, expired or logged out."""
        if not value or value.count(".") != 1:
            return None
        payload, signature = value.split(".")
        try:
            valid = hmac.compare_digest(_unb64(signature), self._sign(payload))
            user, csrf, expires = json.loads(_unb64(payload))
        except (ValueError, TypeError):
            return None
        if not valid or not isinstance(csrf, str) or not isinstance(expires, int) or not isinstance(user, (str, type(None))):
            return None
        if expires <= self._clock():
            return None
        with self._lock:
            if csrf in self._revoked:
                return None
        return Session(user=user, csrf=csrf, expires=float(expires))

    def revoke(self, session: Session) -> None:
        """Logged out: the cookie is refused from now on, even if a copy of it survives."""
        now = self._clock()
        with self._lock:
            self._revoked = {token: end for token, end in self._revoked.items() if end > now}
            self._revoked[session.csrf] = session.expires

    def _sign(self, payload: str) -> bytes:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).digest()


def tokens_match(given: str | None, expected: str) -> bool:
    """The form's CSRF token against the session's, in constant time."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
