"""DKIM signing (RFC 6376) with dkimpy, configured by the ``dkim:`` section.

The signature covers the headers receivers and RFC 8058 care about: From, To, Subject, Date,
Message-ID, the MIME structure, and List-Unsubscribe with List-Unsubscribe-Post (a one-click
link that is not signed does not count as one-click). Relaxed header canonicalisation survives
relays that re-fold headers; simple body canonicalisation is what large senders use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dkim
from dkim.crypto import UnparsableKeyError, parse_pem_private_key

from senddock.errors import ConfigError

SIGNED_HEADERS = (
    "From", "To", "Subject", "Date", "Message-ID", "Reply-To", "MIME-Version", "Content-Type",
    "List-Id", "List-Unsubscribe", "List-Unsubscribe-Post", "Feedback-ID",
)


@dataclass(frozen=True)
class DkimSigner:
    domain: str
    selector: str
    private_key: bytes

    def sign(self, message: bytes) -> bytes:
        signature = dkim.sign(
            message,
            self.selector.encode("ascii"),
            self.domain.encode("idna"),
            self.private_key,
            canonicalize=(b"relaxed", b"simple"),
            include_headers=[h.encode("ascii") for h in SIGNED_HEADERS],
        )
        return signature + message


def signer_from_config(section: Mapping[str, Any] | None, base: Path) -> DkimSigner | None:
    """The configured signer, or None without a ``dkim:`` section. Bad keys fail here, at start-up."""
    if not section:
        return None
    if section.get("private_key"):
        key, where = section["private_key"].encode("utf-8"), "$.dkim.private_key"
    else:
        path = base / section["private_key_file"]
        where = f"$.dkim.private_key_file ({path})"
        try:
            key = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read the DKIM private key: {exc.strerror}") from None
    try:
        parse_pem_private_key(key)
    except UnparsableKeyError as exc:
        raise ConfigError(f"{where}: not a PEM RSA private key ({exc})") from None
    return DkimSigner(domain=section["domain"], selector=section["selector"], private_key=key)
