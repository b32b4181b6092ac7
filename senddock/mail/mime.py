"""Build the MIME message of a job: shared by every transport, so switching transports changes
nothing the recipient sees. Plugins may import this module (it is not part of the engine).

The standard library's ``email`` package builds the structure; its header folding is replaced by
:mod:`senddock.mail.headerfold` (encoded-words of at most 75 characters, structured headers such as
List-Unsubscribe never encoded), and the text parts are encoded here, 7-bit clean. Every byte of
the message is ASCII, so it needs no ``BODY=8BITMIME`` (RFC 6152) and no relay ever has to convert
it: a conversion would change the body under the DKIM body hash.
Internationalised domains are written in their IDNA (xn--) form, which every relay accepts;
non-ASCII local parts would need SMTPUTF8 (RFC 6531), which the SMTP transport refuses per job.
"""

from __future__ import annotations

import binascii
import functools
import secrets
import sys
import uuid
from collections.abc import Collection
from email import base64mime
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, getaddresses, localtime

from senddock.mail.headerfold import POLICY
from senddock.outcome import Message

BODY_LINE = 76  # RFC 2045 6.7, 6.8: quoted-printable and base64 lines are at most 76 characters
_EIGHT_BIT = bytes(range(0x80, 0x100))


def message_id_for(broadcast_id: int, job_id: int, domain: str, bounce_token: str | None = None) -> str:
    """Derived from the job, so a resend after a crash carries the same Message-ID. With a signed
    VERP token it carries the token: a bounce or complaint that quotes the message's headers names
    its job even when a relay rewrote the return path."""
    local = bounce_token or f"{broadcast_id}.{job_id}"
    return f"<senddock.{local}@{ascii_domain(domain)}>"


def one_off_message_id(kind: str, domain: str) -> str:
    """A Message-ID for a message that is no job (a preview, a test send): unique every time."""
    return f"<senddock.{kind}.{uuid.uuid4().hex}@{ascii_domain(domain)}>"


def ascii_domain(domain: str) -> str:
    """``bücher.example`` -> ``xn--bcher-kva.example``; ASCII domains unchanged."""
    try:
        domain.encode("ascii")
        return domain
    except UnicodeEncodeError:
        return domain.encode("idna").decode("ascii")


def ascii_address(address: str) -> str:
    """An addr-spec with its domain in IDNA form (the envelope and the headers take this)."""
    local, at, domain = address.rpartition("@")
    return f"{local}{at}{ascii_domain(domain)}" if at else address


def comparable_address(address: str) -> str:
    """An address as two spellings of it compare equal: IDNA domain, lower case. A domain that has
    no IDNA form (an empty or 64+ character label, as a forged report may hold) stays as written."""
    try:
        return ascii_address(address.strip()).lower()
    except UnicodeError:
        return address.strip().lower()


@functools.lru_cache(maxsize=1024)
def _mailboxes(header: str) -> tuple[tuple[str, str], ...]:
    """(display name, address) pairs of a campaign's From or Reply-To: parsed once per campaign,
    not once per message (email.utils' parser cost ~10% of a sender's CPU run per message)."""
    return tuple(getaddresses([header]))


def sender_domain(from_addr: str) -> str:
    [(_, address)] = _mailboxes(from_addr) or [("", "")]
    return address.rpartition("@")[2] or "localhost"


def envelope_sender(message: Message) -> str:
    return ascii_address(_mailboxes(message.campaign.from_addr)[0][1])


def list_id(list_name: str | None, list_id_value: int | None, domain: str) -> str:
    """RFC 2919 ``List-Id: "Name" <label.domain>``; without a list, one per sending domain."""
    label = f"list-{list_id_value}" if list_id_value is not None else "senddock"
    identifier = f"<{label}.{ascii_domain(domain)}>"
    if not list_name:
        return identifier
    phrase = list_name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{phrase}" {identifier}'


def _mailbox(display_name: str, address: str) -> Address | str:
    address = ascii_address(address)
    if not display_name:
        return address
    local, _, domain = address.rpartition("@")
    return Address(display_name=display_name, username=local, domain=domain)


def _from_header(from_addr: str) -> Address | str:
    [(name, address)] = _mailboxes(from_addr)
    return _mailbox(name, address)


def build_email(message: Message, *, message_id_domain: str | None = None) -> EmailMessage:
    """The message as an EmailMessage (not yet signed: see :func:`message_bytes`)."""
    campaign, content, recipient = message.campaign, message.content, message.recipient
    email = EmailMessage(policy=POLICY)
    email["From"] = _from_header(campaign.from_addr)
    email["To"] = _mailbox(recipient.name, recipient.email)
    if campaign.reply_to:
        email["Reply-To"] = _from_header(campaign.reply_to)
    email["Subject"] = content.subject
    email["Date"] = format_datetime(localtime())
    email["Message-ID"] = (
        message_id_for(message.broadcast_id, message.job_id, message_id_domain, message.bounce_token)
        if message_id_domain
        else message.message_id
    )
    for name, value in message.headers.items():
        email[name] = value
    email["MIME-Version"] = "1.0"
    parts = [(body, subtype) for body, subtype in ((content.text_body, "plain"), (content.html_body, "html"))
             if body is not None] or [("", "html")]
    if len(parts) == 1:
        _set_text(email, *parts[0])
    else:
        alternatives = []
        for body, subtype in parts:
            part = EmailMessage(policy=POLICY)
            _set_text(part, body, subtype)
            alternatives.append(part)
        # As make_alternative() then the generator would write it, with the campaign's boundary.
        boundary = _boundary(campaign.campaign_id, [part.get_payload() for part in alternatives])
        email["Content-Type"] = f'multipart/alternative; boundary="{boundary}"'
        for part in alternatives:
            email.attach(part)
    return email


def _new_boundary() -> str:
    return "=" * 15 + f"{secrets.randbelow(sys.maxsize):019d}" + "=="  # the email package's form


@functools.lru_cache(maxsize=1024)
def _campaign_boundary(campaign_id: int) -> str:
    return _new_boundary()


def _boundary(campaign_id: int, texts: list[str]) -> str:
    """The multipart boundary: one per campaign and process, so every message of a campaign has
    the same Content-Type, parsed and folded once (a boundary drawn per message, as the email
    package's generator does, cost a regex compile and a header parse, about a third of building
    a two-part message). Unguessable before the first message shows it; a text that holds it (a
    recipient's data may) gets a fresh one drawn for that message."""
    boundary = _campaign_boundary(campaign_id)
    while any("--" + boundary in text for text in texts):
        boundary = _new_boundary()
    return boundary


def _set_text(part: EmailMessage, text: str, subtype: str) -> None:
    """UTF-8 text in a 7-bit transfer encoding, whichever is the shorter for this text.

    7bit when it is ASCII in short lines; quoted-printable while at most one byte in six is
    8-bit (mostly-Latin text: QP costs 3 characters for such a byte, base64 4/3 for every
    byte); base64 otherwise (Cyrillic, Greek, CJK, emoji-heavy text). The text decodes back
    exactly, its line breaks as CRLF and ending with one (RFC 2045 canonical text).
    """
    data = b"\n".join(text.encode("utf-8").splitlines()) + b"\n"
    eight_bit = len(data) - len(data.translate(None, _EIGHT_BIT))
    if not eight_bit and max(map(len, data.split(b"\n"))) <= POLICY.max_line_length:
        cte, payload = "7bit", data.decode("ascii")
    elif 5 * eight_bit <= len(data) - eight_bit:
        # binascii's (C) encoder: lines of at most 76, trailing whitespace and a lone "." encoded.
        cte, payload = "quoted-printable", binascii.b2a_qp(data, istext=True).decode("ascii")
    else:
        cte = "base64"  # of the canonical form, CRLF line breaks (RFC 2045 6.8)
        payload = base64mime.body_encode(data.replace(b"\n", b"\r\n"), maxlinelen=BODY_LINE, eol="\n")
    part["Content-Type"] = f'text/{subtype}; charset="utf-8"'
    part["Content-Transfer-Encoding"] = cte
    part.set_payload(payload)


def message_bytes(message: Message, *, message_id_domain: str | None = None,
                  unsigned_headers: Collection[str] = ()) -> bytes:
    """The finished message as sent: built, then signed when a signer is configured (DKIM).

    ``unsigned_headers``: headers the transport's provider rewrites, left out of the signature.
    """
    data = build_email(message, message_id_domain=message_id_domain).as_bytes()
    return message.signer.sign(data, exclude=unsigned_headers) if message.signer is not None else data

