"""Header text from subscriber data: one line, no control characters, or the one job fails."""

from __future__ import annotations

import pytest

from senddock.loading import load_config
from senddock.errors import InvalidInput
from senddock.mail import headertext
from senddock.mail.addresses import check_mailbox
from senddock.mail.compose import BadRecipient, Composer
from senddock.mail.templates import CampaignTemplates, context_for
from senddock.outcome import CampaignContent, Recipient

CAMPAIGN = CampaignContent(campaign_id=7, name="n", subject="Hi {{ subscriber.name }}", from_addr="news@example.com",
                           text_body="Hello {{ subscriber.attributes.city }}")


@pytest.mark.parametrize(("text", "problem", "one_line"), [
    ("Ada Lovelace", None, "Ada Lovelace"),
    ("Zoë Çelik", None, "Zoë Çelik"),
    ("", None, ""),
    ("Ada\nLovelace", "a line break", "Ada Lovelace"),
    ("Ada\r\nBcc: victim@example.com", "a line break", "Ada Bcc: victim@example.com"),
    ("Ada\u2028Lovelace", "a line break", "Ada Lovelace"),
    ("Ada\x85Lovelace", "a line break", "Ada Lovelace"),
    ("Ada\x00Lovelace", "a control character", "Ada Lovelace"),
    ("Ada\x07 \t Lovelace\x1b", "a control character", "Ada Lovelace"),
    ("\r\n", "a line break", ""),
])
def test_problem_and_one_line(text, problem, one_line):
    assert headertext.problem(text) == problem
    assert headertext.one_line(text) == one_line


def test_a_control_character_from_the_data_never_reaches_the_subject():
    templates = CampaignTemplates.compile("Hi {{ subscriber.attributes.city }}!", "x", None)
    recipient = Recipient("ada@example.com", "Ada", {"city": "Lon\x00don\x07\r\nBcc: x@example.com"})
    assert templates.render(context_for(recipient, CAMPAIGN, None)).subject == "Hi Lon don Bcc: x@example.com!"


@pytest.fixture
def composer(tmp_path):
    path = tmp_path / "senddock.yaml"
    path.write_text("{}\n")
    return Composer(load_config(path, environ={"SENDDOCK_DATABASE_URL": "postgresql://x@localhost/x"}))


@pytest.mark.parametrize(("email", "name", "message"), [
    ("ada@example.com", "Ada\r\nBcc: victim@example.com",
     r"subscriber ada@example.com: name 'Ada\r\nBcc: victim@example.com' contains a line break"),
    ("ada@example.com", "Ada\x00", r"subscriber ada@example.com: name 'Ada\x00' contains a control character"),
    ("ada@example.com\r\nBcc: victim@example.com", "Ada",
     r"address 'ada@example.com\r\nBcc: victim@example.com' contains a line break"),
    ("ada\x00@example.com", "Ada", r"address 'ada\x00@example.com' contains a control character"),
])
def test_a_recipient_that_cannot_go_into_a_header_is_refused_before_anything_is_built(composer, email, name, message):
    with pytest.raises(BadRecipient) as caught:
        composer.message(composer.prepare(CAMPAIGN), Recipient(email, name, {"city": "x"}, 1),
                         job_id=1, broadcast_id=1, attempt=1)
    assert str(caught.value) == message
    assert "\n" not in str(caught.value) and "\r" not in str(caught.value)  # one line wherever it is shown


@pytest.mark.parametrize("value", ["News <news@example.com>\r\nBcc: victim@example.com", "Ne\x00ws <news@example.com>"])
def test_a_from_or_reply_to_with_a_line_break_is_refused_at_create(value):
    with pytest.raises(InvalidInput, match="--from .*: contains a"):
        check_mailbox(value, what="--from")
