"""The bytes on the wire as a strict receiver or a relay reads them: list headers never
RFC 2047-encoded, 7-bit clean bodies, encoded-words of at most 75 characters, folded lines."""

from __future__ import annotations

import dataclasses
import re
import time
from email import message_from_bytes
from email.header import decode_header
from email.policy import default as default_policy
from urllib.parse import quote

import dkim
import pytest
import yaml
from tests_support import dkim_key, dns_for

from senddock.loading import load_config
from senddock.mail import mime
from senddock.mail.compose import Composer
from senddock.mail.unsubscribe import make_token, unsubscribe_url
from senddock.outcome import CampaignContent, Recipient

SECRET = "unsubscribe-secret-for-tests"
SUBSCRIBER_ID = 1234567890  # ten digits: the longest token a real list makes
ENCODED_WORD = re.compile(rb"=\?[^?\s]+\?[bBqQ]\?[^?\s]*\?=")


def make_composer(tmp_path, url: str) -> Composer:
    key_file, record = dkim_key(tmp_path)
    path = tmp_path / "senddock.yaml"
    path.write_text(yaml.safe_dump({
        "unsubscribe": {"url": url, "mailto": "unsubscribe@example.com", "secret": "${UNSUB_SECRET}"},
        "dkim": {"domain": "example.com", "selector": "s1", "private_key_file": str(key_file)},
    }))
    composer = Composer(load_config(path, environ={"UNSUB_SECRET": SECRET,
                                                   "SENDDOCK_DATABASE_URL": "postgresql://x@localhost/x"}))
    composer.dns_record = record
    return composer


@pytest.fixture(scope="module")
def composer(tmp_path_factory):
    """One for the module: making a Composer (its config, templates, key) took 37 ms a test, and
    no test changes one."""
    return make_composer(tmp_path_factory.mktemp("composer"), "https://lists.example.com")


def campaign(**changes) -> CampaignContent:
    fields = dict(campaign_id=7, name="n", subject="Hello {{ subscriber.name }}",
                  from_addr="Zoë News <news@example.com>", text_body="Hallo {{ subscriber.name }}",
                  html_body="<p>Hallo {{ subscriber.name }}</p>", list_id=3, list_name="Newsletter")
    return CampaignContent(**{**fields, **changes})


def build(composer, content=None, recipient=None):
    recipient = recipient or Recipient("juergen@example.com", "Jürgen Müller", {}, subscriber_id=SUBSCRIBER_ID)
    message = composer.message(composer.prepare(content or campaign()), recipient,
                               job_id=1001, broadcast_id=12, attempt=1)
    return message, mime.message_bytes(message)


def header_fields(data: bytes) -> list[tuple[str, list[bytes]]]:
    """Each header field's name and its physical lines, as they are on the wire."""
    fields: list[tuple[str, list[bytes]]] = []
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line[:1] in (b" ", b"\t"):
            fields[-1][1].append(line)
        else:
            fields.append((line.split(b":", 1)[0].decode("ascii").lower(), [line]))
    return fields


def raw_value(data: bytes, name: str) -> str:
    """A header's value as a receiver reads it: unfolded (RFC 5322 2.2.3, each CRLF before
    whitespace removed), not decoded."""
    [lines] = [lines for field, lines in header_fields(data) if field == name.lower()]
    return b"\r\n".join(lines).replace(b"\r\n", b"").split(b":", 1)[1].strip(b" \t").decode("ascii")


def assert_dkim_verifies(composer, data: bytes) -> None:
    assert dkim.verify(data, dnsfunc=dns_for(composer.dns_record))


# -- List-Unsubscribe and the other structured headers ------------------------------------------

@pytest.mark.parametrize("base_url", [
    "https://lists.example.com/newsletter/u/x",  # 40 characters: encoded before the fix
    "https://lists.example.com/" + "a-rather-long-path-segment/" * 6 + "x" * 12,  # 200
])
def test_list_unsubscribe_holds_the_uris_unencoded_and_folds_only_between_them(tmp_path, base_url):
    assert len(base_url) in (40, 200)
    composer = make_composer(tmp_path, base_url)
    _, data = build(composer)
    token = make_token(SECRET, SUBSCRIBER_ID, 7)
    intended = [unsubscribe_url(base_url, token),
                f"mailto:unsubscribe@example.com?subject={quote('unsubscribe ' + token)}"]

    value = raw_value(data, "List-Unsubscribe")
    assert "=?" not in value
    assert re.findall(r"<([^<>]*)>", value) == intended  # what a mailbox provider extracts
    assert value == ", ".join(f"<{uri}>" for uri in intended)
    [lines] = [lines for name, lines in header_fields(data) if name == "list-unsubscribe"]
    # Folded at the whitespace after a comma only, each URI whole on its line.
    assert all(line.endswith(b">,") for line in lines[:-1]) and lines[-1].endswith(b">")
    assert all(line.startswith(b" <") for line in lines[1:])
    assert raw_value(data, "List-Unsubscribe-Post") == "List-Unsubscribe=One-Click"
    assert message_from_bytes(data, policy=default_policy)["List-Unsubscribe"] == value
    assert_dkim_verifies(composer, data)


def test_ids_and_list_headers_are_never_encoded_even_on_a_long_domain(composer):
    domain = "newsletters.of-a-rather-long-organisation-name.bücher-und-zeitschriften.example"
    ascii_domain = mime.ascii_domain(domain)
    long_name = "The Weekly Newsletter of a Rather Long Organisation Name, Autumn Edition"
    _, data = build(composer, campaign(from_addr=f"News <news@{domain}>", list_name=long_name))
    assert data.split(b"\r\n\r\n", 1)[0].isascii()
    assert raw_value(data, "Message-ID") == f"<senddock.12.1001@{ascii_domain}>"
    assert raw_value(data, "Feedback-ID") == f"7:12:senddock:{ascii_domain}"
    assert raw_value(data, "X-Senddock-Job") == "12.1001"
    assert raw_value(data, "List-Id") == f'"{long_name}" <list-3.{ascii_domain}>'
    assert_dkim_verifies(composer, data)


def test_a_list_name_that_is_not_ascii_is_encoded_in_its_phrase_only(composer):
    name = "Nachrichten für Bücherfreunde — die ausführliche Ausgabe mit allen Neuigkeiten"
    _, data = build(composer, campaign(list_name=name))
    value = raw_value(data, "List-Id")
    assert value.endswith(" <list-3.example.com>") and "=?" in value  # the id itself stays whole
    assert message_from_bytes(data, policy=default_policy)["List-Id"] == f"{name} <list-3.example.com>"
    assert all(len(e) <= 75 for e in ENCODED_WORD.findall(value.encode()))


# -- Bodies -------------------------------------------------------------------------------------

NAMES = ["Zoë Çelik", "Jürgen Müller", "山田 太郎", "Иван Петров", "\"Quoted\" O'Brien, Jr.", "😀 Emoji Fan",
         "=?utf-8?q?Admin?=", "Maximilian Alexander Friedrich von und zu Hohenzollern-Sigmaringen-Württemberg"]
BODIES = {
    "german": ("Hallo {{ subscriber.name }},\n\nunsere Herbst-Auswahl ist da: Bücher, Grüße, Straße.\n"
               "A line with trailing spaces   \n.\nFrom here on a line that starts with From.\n",
               "<p>Hallo {{ subscriber.name }}, ça va?</p>\n" + "<span>Größe</span>" * 150),  # one 2,700-char line
    "russian": ("Здравствуйте, {{ subscriber.name }}! Новая подборка книг уже здесь.\n" * 5,
                "<p>Здравствуйте, {{ subscriber.name }}!</p>"),
    "japanese": ("{{ subscriber.name }}様、新しい本のご案内です。\n" * 5, None),
    "ascii": ("Hello {{ subscriber.name }}\r\nWindows line ends\rand an old Mac one, no final newline", None),
    "html only": (None, "<!doctype html><html><body><h1>Hi {{ subscriber.name }}</h1>"
                        "<p>Ünïcödé ☃ and a table:</p><table><tr><td>a</td><td>b</td></tr></table></body></html>"),
}


def canonical(text: str) -> str:
    """Text as MIME carries it: line breaks as one kind, ending with one (RFC 2045 canonical form)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text if text.endswith("\n") else text + "\n"


@pytest.mark.parametrize("kind", BODIES)
@pytest.mark.parametrize("name", NAMES)
def test_bodies_are_seven_bit_clean_and_decode_back_exactly(composer, kind, name):
    text, html = BODIES[kind]
    recipient = Recipient("reader@example.com", name, {}, subscriber_id=SUBSCRIBER_ID)
    message, data = build(composer, campaign(text_body=text, html_body=html), recipient)
    assert data.isascii()  # no BODY=8BITMIME needed (RFC 6152), nothing for a relay to convert
    assert all(len(line) <= 998 for line in data.split(b"\r\n"))  # RFC 5322 2.1.1
    parsed = message_from_bytes(data, policy=default_policy)
    parts = {part.get_content_subtype(): part for part in parsed.walk() if part.get_content_maintype() == "text"}
    rendered = {"plain": message.content.text_body, "html": message.content.html_body}
    assert set(parts) == {k for k, v in rendered.items() if v is not None}
    for subtype, part in parts.items():
        encoding = part["Content-Transfer-Encoding"]
        assert encoding in ("7bit", "quoted-printable", "base64")
        body_lines = part.get_payload(decode=False).splitlines()
        assert all(len(line) <= (78 if encoding == "7bit" else 76) for line in body_lines), encoding
        assert canonical(part.get_content()) == canonical(rendered[subtype])
    assert parsed["To"].addresses[0].display_name == name
    assert_dkim_verifies(composer, data)


def test_the_transfer_encoding_is_the_shorter_one_for_the_text(composer):
    chosen = {}
    for kind in ("german", "russian"):
        _, data = build(composer, campaign(text_body=BODIES[kind][0], html_body=None))
        chosen[kind] = message_from_bytes(data, policy=default_policy)["Content-Transfer-Encoding"]
    assert chosen == {"german": "quoted-printable", "russian": "base64"}


# -- Encoded-words and line lengths -------------------------------------------------------------

SUBJECTS = [
    "Hello", "Your weekly digest is here, with twelve articles about things that matter this week",
    "Grüße aus Köln: die Herbst-Auswahl für Bücherfreunde, ausführlich und schön",
    "Ééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééé",
    "日本語のニュースレター：今週の新着書籍と特集記事のご案内をお届けします",
    "中文标题很长很长很长很长很长很长 ééééééééééééééééééééé 中文标题很长很长很长很长很长很长",
    "🎉🎉 Big sale 🎉🎉 — 50% off everything 😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀",
    "Supercalifragilisticexpialidocioussupercalifragilisticexpialidocious word",
    "x" * 120,
    "https://example.com/a/very/long/link/in/a/subject/that/has/no/whitespace/at/all/anywhere/x",
    '"Quoted" words, \'single\' quotes and (parentheses) <angles> [brackets]: all ASCII',
    "„Anführungszeichen“ «guillemets» and “curly quotes” – dashes — too",
    "=?utf-8?q?looks_encoded?= but is not",
    "Mixed: ASCII then Ünïcödé then ASCII then 日本 then ASCII then emoji 😀 then ASCII again",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z ä ö ü á é í ó ú ñ ç 日 本 語 😀",
    "Ünïcödé" * 12,
]


@pytest.mark.parametrize("subject", SUBJECTS)
def test_encoded_words_and_header_lines_stay_within_the_limits(composer, subject):
    recipient = Recipient("reader@example.com", "Jürgen Maximilian Müller-Lüdenscheidt 日本語 😀",
                          {}, subscriber_id=SUBSCRIBER_ID)
    message, data = build(composer, campaign(subject=subject), recipient)
    assert message.content.subject == subject
    head = data.split(b"\r\n\r\n", 1)[0]
    assert all(len(word) <= 75 for word in ENCODED_WORD.findall(head))  # RFC 2047 2
    for name, lines in header_fields(data):
        if name == "list-unsubscribe":  # a URI longer than a line cannot be folded; entries are
            assert all(len(line) <= 78 or line.count(b"<") == 1 for line in lines)
            continue
        assert all(len(line) <= 78 for line in lines), (name, [len(line) for line in lines])
    parsed = message_from_bytes(data, policy=default_policy)
    assert parsed["Subject"] == subject
    assert parsed["To"].addresses[0].display_name == recipient.name
    assert_dkim_verifies(composer, data)


def rfc2047_display_name(raw_to: str) -> str:
    """The display name as RFC 2047 6.2 decodes it: no whitespace between adjacent encoded-words.
    (CPython's address parser puts a space there, so a name needing two encoded-words is read
    back by it with one space more; its own folder writes the same.)"""
    phrase = raw_to.rsplit(" <", 1)[0]
    text = ""
    for word, charset in decode_header(phrase):
        if charset:
            text += word.decode(charset)
        else:  # atoms and quoted-strings
            word = word if isinstance(word, str) else word.decode("ascii")
            text += re.sub(r'"((?:[^"\\]|\\.)*)"', lambda m: re.sub(r"\\(.)", r"\1", m[1]), word)
    return text


LONG_NAMES = ["x" * 90, "Ünïcödé " * 15, "山田太郎" * 12, "Jürgen Maximilian Müller-Lüdenscheidt " * 3]


@pytest.mark.parametrize("name", ["Plain Name", "O'Brien", 'Quote " and \\ backslash', "Comma, Jr.",
                                  "  spaced  out  ", "=?utf-8?q?Admin?=", "Dr. Zoë Çelik, MD",
                                  *LONG_NAMES])
def test_a_display_name_round_trips_however_it_has_to_be_written(composer, name):
    _, data = build(composer, recipient=Recipient("r@example.com", name, {}, subscriber_id=1))
    assert all(len(line) <= 78 for n, lines in header_fields(data) if n == "to" for line in lines)
    assert all(len(word) <= 75 for word in ENCODED_WORD.findall(raw_value(data, "To").encode()))
    to = message_from_bytes(data, policy=default_policy)["To"].addresses[0]
    assert to.addr_spec == "r@example.com"
    assert rfc2047_display_name(raw_value(data, "To")) == name
    if name not in LONG_NAMES:  # one encoded-word per run: CPython's parser reads it back too
        assert to.display_name == name


# -- the shortcuts of the message build: the same bytes as the email package's own path -----------

def email_package_bytes(message) -> tuple[bytes, bytes]:
    """senddock's bytes of ``message``, and the same message written the email package's own way:
    every header parsed when set (the stock Message-ID class, the stock parse of the headers kept
    verbatim), the parts joined by make_alternative() and a boundary drawn by the generator (then
    replaced by senddock's, to compare)."""
    from email.headerregistry import MessageIDHeader, UnstructuredHeader
    from email.message import EmailMessage

    from senddock.mail import headerfold

    class ParsedVerbatim(UnstructuredHeader):  # headerfold._Verbatim before it parsed lazily
        @classmethod
        def parse(cls, value, kwds):
            super().parse(value, kwds)
            kwds["decoded"] = value

    class ParsedUniqueVerbatim(ParsedVerbatim):
        max_count = 1

    registry = headerfold._ClassCachingRegistry(default_class=ParsedVerbatim)
    registry.map_to_type("subject", ParsedUniqueVerbatim)
    registry.map_to_type("message-id", MessageIDHeader)
    for name in ("from", "to", "reply-to"):
        registry.map_to_type(name, headerfold._AddressHeader)
    built = mime.build_email(message)
    reference = EmailMessage(policy=headerfold.POLICY.clone(header_factory=registry))
    for name, value in built.items():
        if built.is_multipart() and name.lower().startswith("content-"):
            continue  # make_alternative() writes it
        reference[name] = value.addresses if hasattr(value, "addresses") else str(value)
    if built.is_multipart():
        reference.make_alternative()
        for part in built.get_payload():
            reference.attach(part)
    else:
        reference.set_payload(built.get_payload())
    slow = reference.as_bytes()
    if built.is_multipart():
        slow = slow.replace(reference.get_boundary().encode(), built.get_boundary().encode())
    return built.as_bytes(), slow


@pytest.mark.parametrize("subject,text,html", [
    ("Hello {{ subscriber.name }}", "Hallo {{ subscriber.name }}", "<p>Hallo {{ subscriber.name }}</p>"),
    ("Plain", "Only text", None),
    ("Grüße aus Köln, {{ subscriber.name }}", None, "<p>Nur HTML, " + "lang " * 40 + "</p>"),
    ("=?utf-8?q?looks_encoded?= " + "x" * 90, "Привет " * 30, "<p>" + "😀" * 50 + "</p>"),
])
def test_the_message_is_the_bytes_the_email_package_writes(composer, subject, text, html):
    message, _ = build(composer, campaign(subject=subject, text_body=text, html_body=html))
    fast, slow = email_package_bytes(message)
    assert fast == slow


RECIPIENTS = {
    "a display name that is not ASCII": Recipient("juergen@example.com", "Jürgen Müller", {}, subscriber_id=1),
    "no display name": Recipient("plain@example.com", "", {}, subscriber_id=2),
    "a name to quote": Recipient("jim@example.com", 'Doe, "Jim" (Sales)', {}, subscriber_id=3),
    "a long name": Recipient("long@example.com", "Maximilian Alexander " * 6, {}, subscriber_id=4),
    "an IDN domain": Recipient("user@bücher.example", "Ünal", {}, subscriber_id=5),
    "a quoted local part": Recipient('"john doe"@example.com', "John", {}, subscriber_id=6),
    "a quoted local part, no name": Recipient('"john doe"@example.com', "", {}, subscriber_id=7),
}
CONTENTS = {
    "two parts": {},
    "text only": {"html_body": None},
    "html only": {"text_body": None},
    "no body": {"text_body": None, "html_body": None},
    "a reply-to": {"reply_to": "Support Team <help@example.com>"},
    "a reply-to that is not ASCII": {"reply_to": "Zoë Support <help@example.com>"},
    "a plain from": {"from_addr": "news@example.com"},
    "a long subject that is not ASCII": {"subject": "Grüße aus Köln " * 12, "text_body": "Привет " * 40},
    "a subject like an encoded-word": {"subject": "=?utf-8?q?x?= {{ subscriber.name }}"},
    "a list name that is not ASCII": {"list_name": "Bücherwurm-Rundbrief"},
    "no list": {"list_id": None, "list_name": None},
}


@pytest.mark.parametrize("recipient", RECIPIENTS.values(), ids=RECIPIENTS.keys())
@pytest.mark.parametrize("changes", CONTENTS.values(), ids=CONTENTS.keys())
@pytest.mark.parametrize("message_id_domain", [None, "mail.example.com"])
def test_the_message_written_directly_is_the_one_the_email_package_writes(
        composer, monkeypatch: pytest.MonkeyPatch, recipient, changes, message_id_domain):
    """message_bytes writes most messages without an EmailMessage (and builds one where it cannot
    vouch for a header): either way, the bytes build_email's message flattens to."""
    now = mime._date_now()
    monkeypatch.setattr(mime, "_date_now", lambda: now)  # both paths in the same second
    message, _ = build(composer, campaign(**changes), recipient)
    unsigned = dataclasses.replace(message, signer=None)
    written = mime.message_bytes(unsigned, message_id_domain=message_id_domain)
    assert written == mime.build_email(unsigned, message_id_domain=message_id_domain).as_bytes()


def test_a_message_with_a_field_the_email_package_refuses_is_refused_either_way(composer):
    message, _ = build(composer)
    for headers in ({"Subject": "twice"}, {"X-Note": "two\nlines"}):
        with pytest.raises(ValueError):
            mime.message_bytes(dataclasses.replace(message, signer=None, headers={**message.headers, **headers}))


def test_the_date_is_now_in_local_time():
    from email.utils import parsedate_to_datetime

    written = parsedate_to_datetime(mime._date_now())
    assert abs(written.timestamp() - time.time()) < 2 and written.utcoffset() is not None


def test_a_campaigns_messages_share_a_boundary_that_no_body_holds(composer):
    _, first_bytes = build(composer)
    _, second_bytes = build(composer, recipient=Recipient("b@example.com", "B", {}, subscriber_id=2))
    boundary = message_from_bytes(first_bytes, policy=default_policy).get_boundary()
    assert boundary and message_from_bytes(second_bytes, policy=default_policy).get_boundary() == boundary
    # A recipient whose data holds that boundary gets a message of its own drawing, still two parts.
    content = campaign(text_body="Hallo {{ subscriber.attributes.note }}",
                       html_body="<p>{{ subscriber.attributes.note }}</p>")
    sneaky = Recipient("c@example.com", "C", {"note": f"\n--{boundary}\nContent-Type: text/plain\n\nforged"},
                       subscriber_id=3)
    _, data = build(composer, content, sneaky)
    parsed = message_from_bytes(data, policy=default_policy)
    assert parsed.get_boundary() != boundary
    assert [p.get_content_type() for p in parsed.iter_parts()] == ["text/plain", "text/html"]
    assert f"--{boundary}" in parsed.get_body(("plain",)).get_content()


def test_a_header_folded_once_is_folded_again_for_a_policy_with_other_line_ends(composer):
    """The fold memo is per policy settings: a clone with LF line ends gets the email package's
    Content-* lines with LF (senddock's own folder writes CRLF whatever the policy)."""
    from email.generator import BytesGenerator
    from io import BytesIO

    from senddock.mail.headerfold import POLICY

    message, _ = build(composer)
    built = mime.build_email(message)
    assert b'charset="utf-8"\r\n' in built.as_bytes()  # folded (and memoized) for CRLF
    out = BytesIO()
    BytesGenerator(out, policy=POLICY.clone(linesep="\n")).flatten(built)
    assert b'charset="utf-8"\n' in out.getvalue() and b'charset="utf-8"\r\n' not in out.getvalue()
