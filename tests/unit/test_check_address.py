"""check_address takes a shortcut for plain addresses (a dot-atom local part, its domain's verdict
kept): its verdict must be email_validator's for every address, plain or not."""

from __future__ import annotations

from email_validator import EmailNotValidError, validate_email
from hypothesis import given, settings
from hypothesis import strategies as st

from senddock.mail.addresses import check_address

ATEXT = "abcXYZ019!#$%&'*+/=?^_`{|}~-"
# Locals and domains near the edges: dots in odd places, quotes, non-ASCII, spaces, long labels.
local = st.text(alphabet=ATEXT + '."\\ é@', min_size=0, max_size=70)
label = st.text(alphabet="abcXYZ019-é_", min_size=0, max_size=66)
domain = st.lists(label, min_size=1, max_size=4).map(".".join) | st.sampled_from(
    ["example.com", "localhost", "test", "example.local", "[127.0.0.1]", "gmail.com.", "xn--bcher-kva.example", ""])


def validator_says(address: str) -> bool:
    try:
        validate_email(address.strip(), check_deliverability=False)
    except EmailNotValidError:
        return False
    return bool(address.strip())


def check_says(address: str) -> bool:
    try:
        return check_address(address) == address.strip()
    except ValueError:
        return False


@settings(max_examples=3000, deadline=None)
@given(local, domain)
def test_check_address_agrees_with_email_validator(local_part: str, domain_part: str):
    address = f"{local_part}@{domain_part}"
    assert check_says(address) == validator_says(address), address


def test_long_addresses_are_refused_as_the_validator_refuses_them():
    for address in ("a" * 64 + "@example.com", "a" * 65 + "@example.com",
                    "a@" + ".".join(["b" * 60] * 4) + ".com", "a@" + ".".join(["b" * 63] * 4)):
        assert check_says(address) == validator_says(address), address
    assert check_says("ada@example.com") and not check_says("ada@@example.com") and not check_says(" ")
