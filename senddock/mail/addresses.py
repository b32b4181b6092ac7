"""Email address checks shared by imports, campaigns and the CLI."""

from __future__ import annotations

import functools
import re
from email.utils import getaddresses

from senddock.errors import InvalidInput
from senddock.mail import headertext

# `Display Name <addr>`: one pair of angle brackets, closing the value.
_ANGLE = re.compile(r"(?P<display>[^<>]*)<(?P<address>[^<>]*)>")
# Characters a display name may hold only inside double quotes (RFC 5322 specials; "." is allowed
# bare, as every mail program writes "J. Doe <j@example.com>").
_SPECIALS = set('",;:@[]\\()<>')
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


# A dot-atom local part of ASCII atext (RFC 5322 3.2.3): what nearly every address has. Such an
# address is valid exactly when its domain is, which is checked once per domain (below).
_PLAIN_LOCAL = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")


def check_address(address: str) -> str:
    """The address as given (trimmed) if its syntax is valid; raises ValueError with the reason.

    email_validator decides. It takes 35-80 us an address, most of it checking the domain's
    characters, which repeat from one address to the next in a list: a plain local part is
    matched here and its domain's verdict kept, and anything else gets the whole check."""
    address = address.strip()
    if not address:
        raise ValueError("missing email")
    local, at, domain = address.rpartition("@")
    if at and len(address) <= 254 and len(local) <= 64 and _PLAIN_LOCAL.fullmatch(local) and _domain_valid(domain):
        return address
    # email_validator compiles its grammar at import (~20 ms): loaded by the first check, not by
    # every command that imports this module.
    from email_validator import EmailNotValidError, validate_email

    try:
        validate_email(address, check_deliverability=False)
    except EmailNotValidError as exc:
        raise ValueError(f"invalid address {address!r}: {exc}") from None
    return address


@functools.lru_cache(maxsize=4096)
def _domain_valid(domain: str) -> bool:
    """Whether email_validator takes ``domain`` (with the shortest plain local part)."""
    from email_validator import EmailNotValidError, validate_email

    try:
        validate_email(f"x@{domain}", check_deliverability=False)
    except EmailNotValidError:
        return False
    return True


def mailbox_problem(value: str) -> str | None:
    """Why ``value`` is not exactly one header mailbox (``Display Name <addr>`` or a bare addr), or None.

    Strict where ``email.utils.parseaddr`` is lenient: it keeps the first address of a list and
    glues trailing words onto the domain (``news@example.com junk`` -> ``news@example.comjunk``),
    so a value is taken only when it is one mailbox and nothing else.
    """
    text = value.strip()
    if not text:
        return "no address given"
    if problem := headertext.problem(text):
        return f"contains {problem}"
    found = _ANGLE.fullmatch(text)
    if found:
        display, address = found["display"].strip(), found["address"].strip()
        if not address:
            return "no address inside the angle brackets"
        if display and not _QUOTED.fullmatch(display):
            if "," in display and "@" in display:
                return "one address only, not a list"
            if specials := sorted(_SPECIALS & set(display)):
                quoted = display if '"' not in display and "\\" not in display else "Name"
                return (f"a display name with {' or '.join(map(repr, specials))} must be in double quotes: "
                        f"'\"{quoted}\" <{address}>'")
    elif text.count("<") > 1 or "," in text or ";" in text:
        return "one address only, not a list"
    elif "<" in text and ">" in text and text.index("<") < text.index(">"):
        return "more than an address: nothing may follow the closing '>'"
    elif "<" in text or ">" in text:
        return "not an address: its angle brackets do not pair up (write 'Name <addr@domain>')"
    elif re.search(r"\s", text):
        if "@" in text:
            return ("more than an address: a display name goes first, the address in angle brackets "
                    "('Name <addr@domain>')")
        return "not an address (write 'addr@domain' or 'Name <addr@domain>')"
    else:
        address = text
    try:
        check_address(address)
    except ValueError as exc:
        return str(exc)
    # The message builder reads the value with getaddresses: it must find this one address.
    if [addr for _, addr in getaddresses([text])] != [address]:
        return "cannot be read as one address (write 'Name <addr@domain>')"
    return None


def stored_mailbox_problem(value: str) -> str | None:
    """Why the message builder cannot use a From or Reply-To already stored, or None.

    Lenient where :func:`mailbox_problem` is strict: a value an older senddock accepted and sent
    (``news@example.com (Example News)``, any RFC 5322 form) keeps working after an upgrade; only
    what cannot be built at all (a list, a line break, no valid address) is refused.
    """
    if problem := headertext.problem(value):
        return f"contains {problem}"
    addresses = [address for _, address in getaddresses([value]) if address]
    if len(addresses) != 1:
        return "one address only, not a list" if addresses else "no address in it"
    if addresses[0] not in value:  # trailing words glued onto the domain: `a@example.com junk`
        return "cannot be read as one address (write 'Name <addr@domain>')"
    try:
        check_address(addresses[0])
    except ValueError as exc:
        return str(exc)
    return None


def check_mailbox(value: str, *, what: str) -> str:
    """A header mailbox such as ``News <news@example.com>``, trimmed; raises InvalidInput quoting the
    value and naming ``what`` (the option): ``--from 'a@b.com, c@d.com': one address only, not a list``."""
    if problem := mailbox_problem(value):
        raise InvalidInput(f"{what} {value.strip()!r}: {problem}")
    return value.strip()
