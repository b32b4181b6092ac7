"""Signed VERP tokens: which job a bounce is about, in a form nobody can make up.

The token goes in the envelope sender (``bounces+{token}@example.com``) and in the Message-ID, so a
delivery status notification names the job whether it comes back to the return path or quotes the
message's headers. It reads ``{broadcast}.{job}.{mac}``: both ids in base 36 and an 80-bit HMAC
(``bounces.secret``) in base 32, letters and digits only, so a relay that lower- or upper-cases the
local part changes nothing, and at most 44 characters even for the largest ids: RFC 5321 allows 64
in a local part, which leaves 20 for the prefix.

Without the secret a token cannot be made, and a bounce naming a job some other way (the unsigned
``b{broadcast}.j{job}`` of earlier versions, X-Senddock-Job) suppresses nobody: ids are sequential,
and anyone who can mail the return-path domain could otherwise suppress any address.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_CONTEXT = b"senddock-verp-v1:"  # a MAC made for this purpose verifies nothing else
_MAC_BYTES = 10  # 80 bits: 16 base-32 characters, beyond guessing one bounce at a time
_ID_MAX = 2**63 - 1  # Postgres bigint
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
MAX_TOKEN_LENGTH = 13 + 1 + 13 + 1 + 16  # base-36 bigints, dots, the MAC
LOCAL_PART_LIMIT = 64  # RFC 5321 4.5.3.1.1
MIN_SECRET_LENGTH = 16

# Case-insensitive: relays may fold the local part. Bounded by what is neither letter nor digit,
# so "bounces+TOKEN@", "<senddock.TOKEN@" and a token on its own all match.
_TOKEN = re.compile(r"(?<![0-9a-z])([0-9a-z]{1,13})\.([0-9a-z]{1,13})\.([a-z2-7]{16})(?![0-9a-z])", re.IGNORECASE)


class BadToken(ValueError):
    """Something shaped like a token whose MAC no configured secret made."""


@dataclass(frozen=True)
class JobToken:
    broadcast_id: int
    job_id: int


def _base36(number: int) -> str:
    if not 0 < number <= _ID_MAX:
        raise ValueError(f"an id must be a positive bigint, not {number}")
    digits = ""
    while number:
        number, digit = divmod(number, 36)
        digits = _DIGITS[digit] + digits
    return digits


def _mac(secret: str, broadcast_id: int, job_id: int) -> str:
    payload = _CONTEXT + f"{broadcast_id}.{job_id}".encode("ascii")
    digest = hmac.new(secret.encode("utf-8"), payload, hashlib.sha256).digest()[:_MAC_BYTES]
    return base64.b32encode(digest).decode("ascii").lower()  # 10 bytes: 16 characters, no padding


def make_token(secret: str, broadcast_id: int, job_id: int) -> str:
    """The token of one job, signed with ``secret`` (the first of ``bounces.secret``)."""
    return f"{_base36(broadcast_id)}.{_base36(job_id)}.{_mac(secret, broadcast_id, job_id)}"


def read_token(secrets: Iterable[str], token: str) -> JobToken:
    """The job of a token any of ``secrets`` signed; BadToken otherwise."""
    found = _TOKEN.fullmatch(token)
    if found is None:
        raise BadToken(f"not a token: {token[:80]!r}")
    return _verified(secrets, found)


def find_token(secrets: Iterable[str], text: str) -> JobToken | None:
    """The first signed token in ``text`` (an address, a Message-ID, a header) that verifies;
    None when there is none. BadToken when there are tokens and none of them verifies."""
    secrets = tuple(secrets)
    forged: BadToken | None = None
    for found in _TOKEN.finditer(text):
        try:
            return _verified(secrets, found)
        except BadToken as exc:
            forged = forged or exc
    if forged is not None:
        raise forged
    return None


def _verified(secrets: Sequence[str] | Iterable[str], found: re.Match[str]) -> JobToken:
    broadcast_text, job_text, mac = (part.lower() for part in found.groups())
    broadcast_id, job_id = int(broadcast_text, 36), int(job_text, 36)
    if not (0 < broadcast_id <= _ID_MAX and 0 < job_id <= _ID_MAX):
        raise BadToken(f"token {found[0]!r} names no job")
    for secret in secrets:
        if hmac.compare_digest(mac, _mac(secret, broadcast_id, job_id)):
            return JobToken(broadcast_id, job_id)
    raise BadToken(f"token {found[0]!r} is not signed with bounces.secret")


def return_path_problem(template: str) -> str | None:
    """Why a return-path template with ``{token}`` cannot carry every token, or None."""
    local = template.rpartition("@")[0]
    room = LOCAL_PART_LIMIT - (len(local) - len("{token}"))
    if room < MAX_TOKEN_LENGTH:
        return (f"its local part leaves {room} characters for {{token}}, which may need {MAX_TOKEN_LENGTH} "
                f"(RFC 5321 allows {LOCAL_PART_LIMIT} in all)")
    return None
