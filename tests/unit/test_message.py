"""The message every transport sends: headers, encodings, list headers, DKIM, VERP."""

from __future__ import annotations

import subprocess
import sys
from email import message_from_bytes
from email.policy import default as default_policy

import dkim
import pytest
import yaml
from senddock_smtp.classify import classify
from senddock_smtp.transport import envelope_sender, send
from tests_support import dkim_key, dns_for

from senddock.loading import load_config
from senddock.mail import mime, verp
from senddock.mail.compose import Composer
from senddock.mail.templates import TemplateError
from senddock.mail.unsubscribe import read_token
from senddock.outcome import CampaignContent, Recipient

SECRET = "unsubscribe-secret-for-tests"


@pytest.fixture
def composer(tmp_path):
    key_file, record = dkim_key(tmp_path)
    path = tmp_path / "senddock.yaml"
    path.write_text(yaml.safe_dump({
        "unsubscribe": {"url": "https://lists.example.com", "mailto": "unsubscribe@example.com",
                        "secret": "${UNSUB_SECRET}"},
        "dkim": {"domain": "example.com", "selector": "s1", "private_key_file": "dkim.pem"},
    }))
    config = load_config(path, environ={"UNSUB_SECRET": SECRET, "SENDDOCK_DATABASE_URL": "postgresql://x@localhost/x"})
    composer = Composer(config)
    composer.dns_record = record
    return composer


CAMPAIGN = CampaignContent(
    campaign_id=7, name="Herbst", subject="Grüße, {{ subscriber.name }}!", from_addr="Zoë News <news@example.com>",
    text_body=None, html_body="<p>Hallo {{ subscriber.name }}, <a href=\"{{ unsubscribe_url }}\">abmelden</a></p>",
    list_id=3, list_name="Newsletter",
)


def build(composer, recipient=None, campaign=CAMPAIGN):
    recipient = recipient or Recipient("juergen@bücher.example", "Jürgen Müller", {}, subscriber_id=42)
    message = composer.message(composer.prepare(campaign), recipient, job_id=1001, broadcast_id=12, attempt=1)
    data = mime.message_bytes(message)
    return message, data, message_from_bytes(data, policy=default_policy)


def test_headers_and_parts_parse_back(composer):
    message, data, parsed = build(composer)
    assert data.isascii()  # RFC 2047 / IDNA: nothing needs SMTPUTF8
    assert parsed["Subject"] == "Grüße, Jürgen Müller!"
    assert parsed["From"].addresses[0].display_name == "Zoë News"
    assert parsed["To"].addresses[0].display_name == "Jürgen Müller"
    assert parsed["To"].addresses[0].addr_spec == "juergen@xn--bcher-kva.example"
    assert parsed["Message-ID"] == "<senddock.12.1001@example.com>"
    assert parsed["Date"].datetime is not None
    assert parsed["List-Id"] == '"Newsletter" <list-3.example.com>'
    assert parsed["X-Senddock-Job"] == "12.1001"
    assert parsed.get_content_type() == "multipart/alternative"
    text, html = (part.get_content() for part in parsed.iter_parts())
    assert "Hallo Jürgen Müller" in html and "Hallo Jürgen Müller" in text


def test_the_message_id_is_the_same_on_every_attempt(composer):
    first = build(composer)[2]["Message-ID"]
    assert build(composer)[2]["Message-ID"] == first


def test_one_click_unsubscribe_headers_carry_a_signed_token(composer):
    _, _, parsed = build(composer)
    url, mailto = (part.strip(" <>") for part in parsed["List-Unsubscribe"].split(","))
    assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert url.startswith("https://lists.example.com/unsubscribe/")
    token = read_token(SECRET, url.rsplit("/", 1)[1])
    assert (token.subscriber_id, token.campaign_id) == (42, 7)
    assert mailto.startswith("mailto:unsubscribe@example.com?subject=unsubscribe%20")
    html = next(p for p in parsed.walk() if p.get_content_type() == "text/html").get_content()
    assert url in html  # {{ unsubscribe_url }} is the same link


def test_the_dkim_signature_verifies_and_covers_the_one_click_headers(composer):
    _, data, parsed = build(composer)
    assert dkim.verify(data, dnsfunc=dns_for(composer.dns_record))
    tags = dict(t.strip().split("=", 1) for t in parsed["DKIM-Signature"].replace("\r\n", "").split(";") if "=" in t)
    signed = {h.strip().lower() for h in tags["h"].split(":")}
    assert {"from", "to", "subject", "date", "message-id", "list-unsubscribe", "list-unsubscribe-post"} <= signed
    assert (tags["d"], tags["s"]) == ("example.com", "s1")


def test_a_changed_signed_header_breaks_the_signature(composer):
    _, data, _ = build(composer)
    forged = data.replace(b"List-Unsubscribe-Post: List-Unsubscribe=One-Click",
                          b"List-Unsubscribe-Post: List-Unsubscribe=Two-Clicks")
    assert forged != data
    assert not dkim.verify(forged, dnsfunc=dns_for(composer.dns_record))


def bare_composer() -> Composer:
    return Composer(load_config(None, environ={"SENDDOCK_DATABASE_URL": "postgresql://x@localhost/x"}))


def test_without_unsubscribe_settings_a_template_using_the_link_says_what_to_configure():
    with pytest.raises(TemplateError, match=r"'unsubscribe_url' is undefined \(set unsubscribe.url"):
        build(bare_composer())


def test_verp_return_path_and_message_id_carry_the_jobs_signed_token(tmp_path):
    bounce_secret = "bounce-secret-for-tests"
    (tmp_path / "senddock.yaml").write_text(yaml.safe_dump({"bounces": {"secret": "${BOUNCE_SECRET}"}}))
    composer = Composer(load_config(tmp_path / "senddock.yaml", environ={
        "BOUNCE_SECRET": bounce_secret, "SENDDOCK_DATABASE_URL": "postgresql://x@localhost/x"}))
    plain = CampaignContent(campaign_id=7, name="n", subject="s", from_addr="news@example.com", text_body="hi")
    message, _, parsed = build(composer, campaign=plain)
    sender = envelope_sender(message, {"return_path": "bounces+{token}@example.com"})
    token = verp.make_token(bounce_secret, 12, 1001)
    assert sender == f"bounces+{token}@example.com"
    assert verp.find_token([bounce_secret], sender.upper()) == verp.JobToken(12, 1001)  # a relay folded its case
    assert parsed["Message-ID"] == f"<senddock.{token}@example.com>"
    assert verp.find_token([bounce_secret], parsed["Message-ID"]) == verp.JobToken(12, 1001)
    assert envelope_sender(message, {}) == "news@example.com"


def test_without_bounces_secret_nothing_names_a_job_and_the_return_path_is_the_from_address():
    plain = CampaignContent(campaign_id=7, name="n", subject="s", from_addr="news@example.com", text_body="hi")
    message, _, parsed = build(bare_composer(), campaign=plain)
    assert "List-Unsubscribe" not in parsed and "DKIM-Signature" not in parsed
    assert message.bounce_token is None and parsed["Message-ID"] == "<senddock.12.1001@example.com>"
    assert envelope_sender(message, {"return_path": "bounces+{token}@example.com"}) == "news@example.com"


def test_a_non_ascii_local_part_fails_alone_without_suppression():
    """SMTPUTF8 (RFC 6531) is not spoken: the job fails as a server without it would answer."""
    plain = CampaignContent(campaign_id=7, name="n", subject="s", from_addr="news@example.com", text_body="hi")
    message, _, _ = build(bare_composer(), Recipient("jürgen@example.com", "", {}, 1), campaign=plain)
    result = send(message, {"host": "127.0.0.1", "port": 9, "timeout": "1s", "helo_name": None}, {})
    assert (result.phase, result.code, result.enhanced_code) == ("rcpt", 553, "5.6.7")
    verdict = classify(result)
    # About that address alone: it never counts towards pausing the campaign.
    assert (verdict.outcome.value, verdict.reason, verdict.about_recipient) == ("fail", "needs_smtputf8", True)


@pytest.mark.parametrize(("key", "error"), [
    (None, "cannot read the DKIM private key"),
    (b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n", "not a PEM private key"),
])
def test_a_bad_dkim_key_stops_the_start_with_the_key_path(tmp_path, key, error):
    from senddock.config import DkimSettings
    from senddock.errors import ConfigError
    from senddock.mail.signing import signer_from_config

    if key is not None:
        (tmp_path / "dkim.pem").write_bytes(key)
    settings = DkimSettings(domain="example.com", selector="s1", private_key_file="dkim.pem")
    with pytest.raises(ConfigError, match=rf"^\$\.dkim\.private_key_file \({tmp_path}/dkim.pem\): {error}"):
        signer_from_config(settings, tmp_path)


def test_an_empty_body_and_trailing_blank_lines_sign_the_same_way_dkimpy_verifies(composer):
    """RFC 6376 3.4.3 corner cases of the simple body canonicalisation, checked by dkimpy."""
    for body in (b"", b"text\r\n\r\n\r\n", b"no final newline"):
        message = b"From: news@example.com\r\nTo: a@example.com\r\nSubject: x\r\n\r\n" + body
        assert dkim.verify(composer.signer.sign(message), dnsfunc=dns_for(composer.dns_record)), body


def test_warming_up_loads_what_a_first_send_would_and_keeps_no_campaign():
    """A node builds made-up messages (text, and HTML-only: its text part is made from the HTML)
    before its first claim: the lazy imports of message building happen then, not in 50 senders at
    once with their sends begun."""
    code = (
        "import sys\n"
        "from senddock.loading import load_config\n"
        "from senddock.mail.compose import Composer\n"
        "composer = Composer(load_config(None, environ={'SENDDOCK_DATABASE_URL': 'postgresql://x@localhost/x'}))\n"
        "assert not {'email_validator', 'inscriptis'} & set(sys.modules), 'already loaded: the test shows nothing'\n"
        "composer.warm_up()\n"
        "assert {'email_validator', 'inscriptis'} <= set(sys.modules)\n"
        "assert composer._prepared == {}\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
