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
import re
import secrets
import sys
import time
import uuid
from collections.abc import Collection
from datetime import datetime, timezone
from email import base64mime
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, getaddresses, localtime
from typing import Any

from senddock.mail.headerfold import POLICY, fold, fold_addresses, printable_ascii
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


def _headers(message: Message, message_id_domain: str | None) -> list[tuple[str, Any]]:
    """The message's header fields in order, but for its Content-* fields."""
    campaign, recipient = message.campaign, message.recipient
    headers: list[tuple[str, Any]] = [("From", _from_header(campaign.from_addr)),
                                      ("To", _mailbox(recipient.name, recipient.email))]
    if campaign.reply_to:
        headers.append(("Reply-To", _from_header(campaign.reply_to)))
    headers.append(("Subject", message.content.subject))
    headers.append(("Date", _date_now()))
    headers.append(("Message-ID", (
        message_id_for(message.broadcast_id, message.job_id, message_id_domain, message.bounce_token)
        if message_id_domain
        else message.message_id
    )))
    headers.extend(message.headers.items())
    headers.append(("MIME-Version", "1.0"))
    return headers


_last_date: tuple[int, str] = (-1, "")


def _date_now() -> str:
    """The Date field's text for now, in local time: formatted once a second, not once a message."""
    global _last_date
    second = int(time.time())
    last = _last_date  # one read: another thread may replace it meanwhile
    if last[0] != second:
        last = _last_date = (second, format_datetime(localtime(datetime.fromtimestamp(second, timezone.utc))))
    return last[1]


def _parts(message: Message) -> list[tuple[str, str]]:
    """(text, subtype) of each alternative, plain before html; an empty html part for no body."""
    content = message.content
    return [(body, subtype) for body, subtype in ((content.text_body, "plain"), (content.html_body, "html"))
            if body is not None] or [("", "html")]


def build_email(message: Message, *, message_id_domain: str | None = None) -> EmailMessage:
    """The message as an EmailMessage (not yet signed: see :func:`message_bytes`)."""
    email = EmailMessage(policy=POLICY)
    for name, value in _headers(message, message_id_domain):
        email[name] = value
    parts = _parts(message)
    if len(parts) == 1:
        _set_text(email, *parts[0])
    else:
        alternatives = []
        for body, subtype in parts:
            part = EmailMessage(policy=POLICY)
            _set_text(part, body, subtype)
            alternatives.append(part)
        # As make_alternative() then the generator would write it, with the campaign's boundary.
        boundary = _boundary(message.campaign.campaign_id, [part.get_payload() for part in alternatives])
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
    """``part``'s Content-* fields and payload: see :func:`_encoded_text`."""
    content_type, cte, payload = _encoded_text(text, subtype)
    part["Content-Type"] = content_type
    part["Content-Transfer-Encoding"] = cte
    part.set_payload(payload)


def _encoded_text(text: str, subtype: str) -> tuple[str, str, str]:
    """(Content-Type, Content-Transfer-Encoding, payload): UTF-8 text in a 7-bit transfer
    encoding, whichever is the shorter for this text.

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
    return f'text/{subtype}; charset="utf-8"', cte, payload


def message_bytes(message: Message, *, message_id_domain: str | None = None,
                  unsigned_headers: Collection[str] = ()) -> bytes:
    """The finished message as sent: built, then signed when a signer is configured (DKIM).

    ``unsigned_headers``: headers the transport's provider rewrites, left out of the signature.
    """
    data = _written(message, message_id_domain)
    if data is None:
        data = build_email(message, message_id_domain=message_id_domain).as_bytes()
    return message.signer.sign(data, exclude=unsigned_headers) if message.signer is not None else data


# -- the message written without an EmailMessage ----------------------------------------------------
#
# What the email package's generator writes for build_email's message, written directly: the same
# header lines (senddock's folder for all but Content-*, the email package's own, memoized, for
# those), a blank line, the payload with CRLF line ends, and for two parts the boundary lines as
# its _handle_multipart writes them. Building and flattening an EmailMessage was a fifth of a
# sender's CPU against a local relay. A message with anything the shortcut does not vouch for
# (a header the email package would parse, check or fold itself) is built the long way instead;
# tests/unit/test_message_encoding.py checks both give the same bytes.

_DOT_ATOM = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
_LINE_BREAKS = re.compile(r"[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")  # what str.splitlines() splits at
_HEADER_NAME = re.compile(r"[!-9;-~]+")  # RFC 5322 ftext
_ADDRESS_FIELDS = frozenset({"from", "to", "reply-to"})
# Fields the email package keeps as given (str(header) == value) for the values senddock sets:
# Subject (verbatim), a Date it formatted, a Message-ID it made, MIME-Version 1.0. Folded by
# senddock's folder whatever their text (Subject's words that are not ASCII as encoded-words).
_STORED_AS_GIVEN = frozenset({"subject", "date", "message-id", "mime-version"})
_REGISTERED = frozenset(POLICY.header_factory.registry)  # fields the email package parses its own way


def _written(message: Message, message_id_domain: str | None) -> bytes | None:
    """The message's bytes unsigned, as build_email(...).as_bytes() writes them, or None where
    only that path can tell."""
    lines = []
    seen = set()
    for name, value in _headers(message, message_id_domain):
        lower = name.lower()
        if lower in seen or not _HEADER_NAME.fullmatch(name):
            return None  # a second field of a name the email package allows once (or a bad name)
        seen.add(lower)
        line = _header_line(name, lower, value)
        if line is None:
            return None
        lines.append(line)
    parts = [_encoded_text(text, subtype) for text, subtype in _parts(message)]
    if len(parts) == 1:
        content_type, cte, payload = parts[0]
        lines += [_content_line("Content-Type", content_type), _content_line("Content-Transfer-Encoding", cte),
                  "\r\n", _crlf(payload)]
        return "".join(lines).encode("ascii")
    boundary = _boundary(message.campaign.campaign_id, [payload for _, _, payload in parts])
    lines += [_content_line("Content-Type", f'multipart/alternative; boundary="{boundary}"'), "\r\n"]
    for i, (content_type, cte, payload) in enumerate(parts):
        lines += ["\r\n" if i else "", "--", boundary, "\r\n", _content_line("Content-Type", content_type),
                  _content_line("Content-Transfer-Encoding", cte), "\r\n", _crlf(payload)]
    lines += ["\r\n--", boundary, "--\r\n"]
    return "".join(lines).encode("ascii")


def _header_line(name: str, lower: str, value: Any) -> str | None:
    """The field as senddock's folder writes it, where the email package would store it as given."""
    if lower in _ADDRESS_FIELDS:
        if isinstance(value, str):
            local, at, domain = value.rpartition("@")
            key = ("", local, domain) if at else None
        elif isinstance(value, Address):
            key = (value.display_name, value.username, value.domain)
        else:
            key = None
        if key is None or not _DOT_ATOM.fullmatch(key[1]) or not _DOT_ATOM.fullmatch(key[2]):
            return None  # an address the email package would parse (and might quote) or build otherwise
        return _address_line(name, *key)
    if not isinstance(value, str) or _LINE_BREAKS.search(value):
        return None  # the email package refuses a value with a line break
    if lower not in _STORED_AS_GIVEN:
        if lower in _REGISTERED:
            return None  # a field the email package parses into something else (Cc, Sender, Content-*...)
        if not printable_ascii(value):
            return None  # its own folding (a list header that is not ASCII)
    return _text_line(name, value)


# Most fields repeat from one message of a campaign to the next (From, Subject, List-Id, Date
# within a second...): each is folded once. Those of one recipient only pass through.
@functools.lru_cache(maxsize=256)
def _address_line(name: str, display_name: str, username: str, domain: str) -> str:
    return fold_addresses(name, [Address(display_name=display_name, username=username, domain=domain)])


@functools.lru_cache(maxsize=256)
def _text_line(name: str, value: str) -> str | None:
    return fold(name, value)


@functools.lru_cache(maxsize=256)
def _content_line(name: str, value: str) -> str:
    """A Content-* field folded by the email package, as its generator would."""
    return POLICY.fold_binary(name, POLICY.header_factory(name, value)).decode("ascii")


def _crlf(payload: str) -> str:
    return payload.replace("\n", "\r\n")
