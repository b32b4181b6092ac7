"""Campaign templates: per-recipient rendering in the sandbox, errors with field and line."""

from __future__ import annotations

import pytest

from senddock.outcome import CampaignContent, Recipient
from senddock.templates import CampaignTemplates, TemplateError, context_for


def render(subject="Hi", text=None, html=None, **subscriber):
    context = context_for(
        Recipient(subscriber.get("email", "ada@example.com"), subscriber.get("name", "Ada"),
                  subscriber.get("attributes", {})),
        CampaignContent(campaign_id=7, name="November news", subject=subject, from_addr="news@example.com"),
        "https://lists.example.com/unsubscribe/t0k",
    )
    return CampaignTemplates.compile(subject, text, html).render(context)


def test_every_variable_a_template_may_use():
    rendered = render(
        "{{ campaign.name }} for {{ subscriber.name }}",
        "{{ subscriber.email }} in {{ subscriber.attributes.city }}, campaign {{ campaign.id }}: {{ unsubscribe_url }}",
        attributes={"city": "Zürich"},
    )
    assert rendered.subject == "November news for Ada"
    assert rendered.text_body == "ada@example.com in Zürich, campaign 7: https://lists.example.com/unsubscribe/t0k"
    assert rendered.html_body is None


def test_html_is_autoescaped_and_text_is_not():
    rendered = render(text="{{ subscriber.name }}", html="<p>{{ subscriber.name }}</p>", name="<b>Ada</b> & co")
    assert rendered.html_body == "<p>&lt;b&gt;Ada&lt;/b&gt; &amp; co</p>"
    assert rendered.text_body == "<b>Ada</b> & co"


def test_an_undefined_variable_is_an_error_with_its_line():
    with pytest.raises(TemplateError) as caught:
        render(text="Hello\n{{ subscriber.attributes.city }}\n")
    assert str(caught.value) == "text, line 2: 'dict object' has no attribute 'city'"


def test_a_syntax_error_is_refused_at_compile_with_its_line():
    with pytest.raises(TemplateError) as caught:
        CampaignTemplates.compile("ok", None, "<p>\nHello {{ subscriber.name }\n</p>")
    assert str(caught.value) == "html, line 2: unexpected '}'"


def test_the_sandbox_keeps_templates_away_from_python_internals():
    with pytest.raises(TemplateError) as caught:
        render(text="{{ subscriber.email.__class__.__mro__[1].__subclasses__() }}")
    assert "unsafe" in str(caught.value)


def test_a_newline_from_the_data_cannot_break_the_subject_header():
    assert render("Hi {{ subscriber.name }}", "x", name="Ada\r\nBcc: victim@example.com").subject == (
        "Hi Ada Bcc: victim@example.com"
    )


def test_html_only_gets_a_text_part_with_its_links():
    rendered = render(html='<h1>News</h1><ul><li>one</li><li>two</li></ul><p><a href="https://x.example/a">Read</a></p>')
    assert rendered.text_body.splitlines()[0] == "News"
    assert "* one" in rendered.text_body and "* two" in rendered.text_body
    assert "https://x.example/a" in rendered.text_body


@pytest.mark.parametrize("source", ["Plain text, no markup", "<p>a & b</p>", "trailing newline\n", ""])
def test_a_template_without_jinja_syntax_renders_to_itself(source):
    rendered = render(source or "s", text=source, html=source)
    assert rendered.text_body == source and rendered.html_body == source
