"""Keep secrets out of everything senddock prints or logs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"

# password, secret, key, api_key, secret_access_key... but not key_file / key_env (paths and names).
_SECRET_KEY = re.compile(r"(^|_)(password|passwd|pass|secret|token|key)(_|$)", re.IGNORECASE)
_NOT_SECRET_SUFFIX = re.compile(r"_(file|path|env|id|name)$", re.IGNORECASE)

# A URL in running text ends at whitespace (libpq refuses unencoded spaces in a URI anyway).
_URL = r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)(?P<rest>\S*)"
# libpq's key=value form: spaces around "=", single-quoted values with \' and \\ escapes, an
# unquoted value up to whitespace. An unterminated quote runs to the end (libpq refuses it, and
# its content is still the password). password and sslpassword are libpq's only secret keywords.
_KV = r"(?P<head>(?<![\w.-])(?:ssl)?password\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*(?:'|\\?\Z)|\S+)"
_URL_OR_KV = re.compile(f"{_URL}|{_KV}", re.IGNORECASE)
_WHOLE_URL = re.compile(r"\s*[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_QUERY_SECRET = re.compile(r"(?P<head>[?&](?:ssl)?password=)(?P<value>[^&#]+)", re.IGNORECASE)
# What comes before the first "/" or "?" of a user info whose password holds that "/" or "?":
# "user:pass...", never "host:5432" (a port) or "[::1]..." (an IPv6 host).
_PASSWORD_START = re.compile(r"[^:\[\]]*:(?!\d*\Z).*", re.DOTALL)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key)) and not _NOT_SECRET_SUFFIX.search(key)


def redact_dsn(text: str) -> str:
    """Mask the passwords of every URL-style or key=value connection string in ``text``: the
    password of a URL's user info, ``password`` and ``sslpassword`` (key=value or URL query
    parameters). Host, port, user and database stay readable."""
    if _WHOLE_URL.match(text):
        # A DSN on its own is one URL even with a space in it: libpq reads it so.
        scheme_end = text.index("://") + 3
        return text[:scheme_end] + _mask_url_rest(text[scheme_end:])
    return _URL_OR_KV.sub(_mask_match, text)


def redact_text(text: str, dsns: Iterable[str | None] = ()) -> str:
    """``text`` (an error message) with the DSNs in it redacted and every secret of ``dsns`` masked
    wherever it appears: libpq and psycopg quote parts of a bad DSN back in their errors."""
    secrets: set[str] = set()
    for dsn in dsns:
        secrets |= dsn_secrets(dsn)
    # Longest first: a password is masked whole before the tail that is also on the list.
    for secret in sorted(secrets, key=len, reverse=True):
        # Whole words only where the secret starts or ends with one: a short password must not
        # mask the middle of the error's own words.
        before = r"(?<!\w)" if re.match(r"\w", secret[0]) else ""
        after = r"(?!\w)" if re.match(r"\w", secret[-1]) else ""
        text = re.sub(before + re.escape(secret) + after, MASK, text)
    return redact_dsn(text)


def dsn_secrets(dsn: str | None) -> set[str]:
    """Each password of a DSN as written and percent-decoded, and what follows each ``@`` in it:
    libpq ends a URL's password at its first ``@`` and reports the rest as part of the host."""
    found: set[str] = set()
    if not dsn:
        return found

    def add(value: str) -> None:
        for form in (value, unquote(value)):
            parts = form.split("@")
            found.update(p for p in ("@".join(parts[i:]) for i in range(len(parts))) if p)

    if _WHOLE_URL.match(dsn):
        urls = [dsn[dsn.index("://") + 3:]]
    else:
        urls = []
        for m in _URL_OR_KV.finditer(dsn):
            if m["scheme"]:
                urls.append(m["rest"])
            else:
                add(_kv_value(m["value"]))
    for rest in urls:
        at = _userinfo_end(rest)
        if at is not None:
            add(rest[:at].partition(":")[2])
        for m in _QUERY_SECRET.finditer(rest[at or 0:]):
            add(m["value"])
    return found


def redact(value: Any, key: str = "") -> Any:
    """A copy of a config value with secret-named keys masked, passwords cut out of DSNs/URLs, and
    the query string of a ``url`` masked (a receiver's token often rides there: ``?sig=...``)."""
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if key and is_secret_key(key) and value not in (None, ""):
        return MASK
    if isinstance(value, str) and key == "url":
        return shown_url(value)
    if isinstance(value, str):
        return redact_dsn(value)
    return value


def shown_url(url: str) -> str:
    """A URL as printed and logged: its password and its query string masked."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = (user.split(":", 1)[0] + f":{MASK}@" if ":" in user else user + "@") + host
    return urlunsplit((parts.scheme, netloc, parts.path, MASK if parts.query else "", ""))


def _mask_match(m: re.Match[str]) -> str:
    if m["scheme"]:
        return m["scheme"] + _mask_url_rest(m["rest"])
    return m["head"] + MASK


def _mask_url_rest(rest: str) -> str:
    """What follows ``scheme://``: the password of the user info and the secret query parameters masked."""
    at = _userinfo_end(rest)
    if at is None:
        return _QUERY_SECRET.sub(lambda q: q["head"] + MASK, rest)
    user, colon, password = rest[:at].partition(":")
    userinfo = f"{user}:{MASK}" if password else rest[:at]
    return userinfo + _QUERY_SECRET.sub(lambda q: q["head"] + MASK, rest[at:])


def _userinfo_end(rest: str) -> int | None:
    """Where the user info of a URL ends (the ``@`` before the host), or None when it has none.

    libpq takes the first ``@`` before any ``/``. A password holding an unencoded ``@`` or ``/``
    is a mistake people make (generated passwords), and the part after it must not show either:
    take the last ``@`` that is not in the path or query, so ``u:p@ss@host/db?x=a@b`` ends at the
    ``@`` before ``host``.
    """
    for at in reversed([i for i, c in enumerate(rest) if c == "@"]):
        before = rest[:at]
        first_at = before.find("@")
        if first_at >= 0 and any(c in before[first_at:] for c in "/?#"):
            continue  # in the path or query of a URL whose user info ended at an earlier "@"
        cuts = [i for i in (before.find("/"), before.find("?"), before.find("#")) if i >= 0]
        if cuts and not _PASSWORD_START.fullmatch(before[:min(cuts)]):
            continue  # host:port/path?...=a@b: the "@" is a parameter's, there is no user info
        return at
    return None


def _kv_value(value: str) -> str:
    """A key=value value as libpq reads it: quotes removed, backslash escapes resolved."""
    if not value.startswith("'"):
        return value
    chars, i = [], 1
    while i < len(value) and value[i] != "'":
        if value[i] == "\\" and i + 1 < len(value):
            i += 1
        chars.append(value[i])
        i += 1
    return "".join(chars)
