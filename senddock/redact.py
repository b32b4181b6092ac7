"""Keep secrets out of everything senddock prints or logs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MASK = "***"

# password, secret, key, api_key, secret_access_key... but not key_file / key_env (paths and names).
_SECRET_KEY = re.compile(r"(^|_)(password|passwd|pass|secret|token|key)(_|$)", re.IGNORECASE)
_NOT_SECRET_SUFFIX = re.compile(r"_(file|path|env|id|name)$", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]*)(?P<tail>@)", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key)) and not _NOT_SECRET_SUFFIX.search(key)


def redact_dsn(dsn: str) -> str:
    """Mask the password of a URL-style or key=value connection string."""
    dsn = _URL_PASSWORD.sub(lambda m: m["head"] + (MASK if m["pw"] else "") + m["tail"], dsn)
    return _KV_PASSWORD.sub(lambda m: m["head"] + MASK, dsn)


def redact(value: Any, key: str = "") -> Any:
    """A copy of a config value with secret-named keys masked and passwords cut out of DSNs/URLs."""
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if key and is_secret_key(key) and value not in (None, ""):
        return MASK
    if isinstance(value, str):
        return redact_dsn(value)
    return value
