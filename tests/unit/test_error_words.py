"""An error names a value once; each interface words it its own way."""

from __future__ import annotations

from senddock.cli.words import FLAGS
from senddock.errors import InvalidInput, UsageError


def test_the_python_api_sees_parameter_names_and_the_cli_its_flags():
    error = UsageError("{=send_at} 2020-01-01T00:00:00+00:00 is in the past: leave {=send_at} out to send now")
    assert str(error) == "send_at 2020-01-01T00:00:00+00:00 is in the past: leave send_at out to send now"
    assert error.worded(FLAGS) == "--at 2020-01-01T00:00:00+00:00 is in the past: leave --at out to send now"


def test_a_value_whose_api_word_is_not_its_name():
    error = InvalidInput("campaign 3 not sent: unsubscribe.url is not set; or pass {=no_unsubscribe} to send without")
    assert str(error).endswith("or pass require_unsubscribe=False to send without")
    assert error.worded(FLAGS).endswith("or pass --no-unsubscribe to send without")
    assert error.worded({**FLAGS, "force": "-f"}) == error.worded(FLAGS)  # only the names it uses count


def test_other_braces_are_left_as_they_are():
    # Template syntax and environment references in a message are not values to word.
    text = "subject, line 1: {{ subscriber.email }} and {email} and ${SMTP_PASSWORD} stay"
    error = InvalidInput(text)
    assert str(error) == text and error.worded(FLAGS) == text
