"""The operator's password: an argon2id hash in the standard PHC string form
(``$argon2id$v=19$m=65536,t=3,p=4$salt$hash``), made by `senddock admin hash-password`.

argon2-cffi is imported by the functions that hash or verify: config validation only needs
:func:`is_password_hash` (the check this module registers), and every command validates the config.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from senddock.config import checks
from senddock.durations import parse_duration

# The PHC string argon2-cffi (and libargon2, passlib, PHP's password_hash) writes.
_ARGON2 = re.compile(r"\$argon2(id|i|d)\$v=\d+\$m=\d+,t=\d+,p=\d+\$[A-Za-z0-9+/]+\$[A-Za-z0-9+/]+")

# Longer input is refused before hashing: nobody types it, and it only costs CPU.
MAX_PASSWORD_LENGTH = 1024


def is_password_hash(text: str) -> bool:
    """Whether ``text`` is an argon2 hash string this module can verify a password against."""
    return bool(_ARGON2.fullmatch(text.strip()))


def hash_password(password: str) -> str:
    """An argon2id hash with argon2-cffi's defaults (RFC 9106's second recommended profile, 64 MiB)."""
    from argon2 import PasswordHasher

    return PasswordHasher().hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    """Whether ``password`` matches; False (never an exception) for any mismatch or bad input.
    Takes tens of milliseconds by design: call it off the event loop."""
    from argon2 import PasswordHasher
    from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

    if not password or len(password) > MAX_PASSWORD_LENGTH:
        return False
    try:
        return PasswordHasher().verify(password_hash.strip(), password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


@checks.register
def admin_problems(data: Mapping[str, Any], transports: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """The dashboard's account: a hash it can verify (the value itself is never shown: a secret)."""
    admin = data["serve"]["admin"]
    if admin is None:
        return
    if not is_password_hash(admin["password_hash"]):
        yield "$.serve.admin.password_hash", ("is not an argon2 password hash ($argon2id$v=19$m=...): make one with "
                                              "`senddock admin hash-password` and pass it from the environment")
    if parse_duration(admin["session_lifetime"]) <= 0:
        yield "$.serve.admin.session_lifetime", "must be longer than 0s"
