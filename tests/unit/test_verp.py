"""Signed VERP tokens: made with bounces.secret, read back whatever a relay did to their case,
refused when forged, tampered with or signed by a key no longer listed."""

from __future__ import annotations

import pytest

from senddock.mail import verp

KEY, OLD_KEY = "current-bounce-key-0123", "previous-bounce-key-0123"


def test_a_token_names_its_job_and_survives_case_folding():
    token = verp.make_token(KEY, 12, 1001)
    assert token.isascii() and token.replace(".", "").isalnum()
    assert verp.read_token([KEY], token) == verp.JobToken(12, 1001)
    assert verp.read_token([KEY], token.upper()) == verp.JobToken(12, 1001)


def test_the_largest_ids_fit_the_local_part_with_room_for_a_prefix():
    biggest = verp.make_token(KEY, 2**63 - 1, 2**63 - 1)
    assert len(biggest) == verp.MAX_TOKEN_LENGTH <= 64 - len("bounces+")
    assert verp.read_token([KEY], biggest) == verp.JobToken(2**63 - 1, 2**63 - 1)


def test_rotation_the_old_key_still_verifies_until_it_is_dropped():
    old = verp.make_token(OLD_KEY, 5, 6)
    assert verp.read_token([KEY, OLD_KEY], old) == verp.JobToken(5, 6)
    with pytest.raises(verp.BadToken, match="not signed"):
        verp.read_token([KEY], old)


@pytest.mark.parametrize("tamper", [
    lambda t: t.replace(t.split(".")[1], verp._base36(1002), 1),  # another job, same MAC
    lambda t: t[:-1] + ("a" if t[-1] != "a" else "b"),  # one MAC character
])
def test_a_tampered_token_is_refused(tamper):
    with pytest.raises(verp.BadToken):
        verp.read_token([KEY], tamper(verp.make_token(KEY, 12, 1001)))


def test_find_token_in_addresses_and_message_ids():
    token = verp.make_token(KEY, 12, 1001)
    assert verp.find_token([KEY], f"Bounces+{token.upper()}@Example.COM") == verp.JobToken(12, 1001)
    assert verp.find_token([KEY], f"<senddock.{token}@example.com>") == verp.JobToken(12, 1001)
    assert verp.find_token([KEY], "bounces+b12.j1001@example.com") is None  # the old unsigned form names nothing
    with pytest.raises(verp.BadToken):
        verp.find_token([KEY], f"bounces+{verp.make_token('someone-elses-key-000', 12, 1001)}@example.com")


def test_return_path_room():
    assert verp.return_path_problem("bounces+{token}@example.com") is None
    assert "leaves 15 characters" in verp.return_path_problem(
        "a-very-long-prefix-for-bounces-of-the-newsletter+{token}@example.com")


def test_without_a_secret_a_token_is_neither_verified_nor_called_forged():
    from email import message_from_string

    from senddock.bounces.matching import JobMatch, find_job

    message = message_from_string(f"To: bounces+{verp.make_token(KEY, 1, 2)}@example.com\n\nhi\n")
    assert find_job(message, ()) == JobMatch()
    assert find_job(message, (KEY,)).job == verp.JobToken(1, 2)
    assert find_job(message, (OLD_KEY,)).forged
