"""Email address checks shared by imports, campaigns and the CLI."""

from __future__ import annotations

from email.utils import parseaddr

from senddock import headertext
from senddock.errors import InvalidInput


def check_address(address: str) -> str:
    """The address as given (trimmed) if its syntax is valid; raises ValueError with the reason."""
    # email_validator compiles its grammar at import (~20 ms): loaded by the first check, not by
    # every command that imports this module.
    from email_validator import EmailNotValidError, validate_email

    address = address.strip()
    if not address:
        raise ValueError("missing email")
    try:
        validate_email(address, check_deliverability=False)
    except EmailNotValidError as exc:
        raise ValueError(f"invalid address {address!r}: {exc}") from None
    return address


def check_mailbox(value: str, *, what: str) -> str:
    """A header mailbox such as ``News <news@example.com>``; raises InvalidInput naming ``what``."""
    if problem := headertext.problem(value.strip()):
        raise InvalidInput(f"{what}: {value!r} contains {problem}")
    display, address = parseaddr(value)
    if not address or ("<" in value and ">" not in value):
        raise InvalidInput(f"{what}: {value!r} is not an address")
    try:
        check_address(address)
    except ValueError as exc:
        raise InvalidInput(f"{what}: {exc}") from None
    return value.strip()
