"""Campaign templates: per-recipient rendering in the sandbox, errors with field and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from senddock.mail.templates import VARIABLES, CampaignTemplates, TemplateError, analyse, context_for
from senddock.outcome import CampaignContent, Recipient


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
    assert str(caught.value) == "text, line 2: this subscriber lacks the attribute 'city' (they have no attributes)"


@pytest.mark.parametrize(("source", "attributes", "expected"), [
    ("{{ subscriber.attributes.cty }}", {"plan": "pro", "city": "Paris"},
     "this subscriber lacks the attribute 'cty' (their attributes: city, plan; did you mean 'city'?)"),
    ('{{ subscriber.attributes["first name"] }}', {"plan": "pro"},
     "this subscriber lacks the attribute 'first name' (their attributes: plan)"),
    ("{{ subscriber.attributes.zz }}", {f"a{i:02}": i for i in range(12)},
     "this subscriber lacks the attribute 'zz' (their attributes: a00, a01, a02, a03, a04, a05, a06, a07, a08, "
     "a09, ... (12 in all))"),
    # Not a subscriber attribute: Jinja2's words stay.
    ("{{ subscriber.attributes.address.zip }}", {"address": {"street": "x"}}, "'dict object' has no attribute 'zip'"),
    ("{{ nothing }}", {}, "'nothing' is undefined"),
])
def test_a_missing_attribute_is_named_in_our_words_with_the_ones_the_subscriber_has(source, attributes, expected):
    with pytest.raises(TemplateError) as caught:
        render(text=source, attributes=attributes)
    assert str(caught.value) == f"text, line 1: {expected}"


def test_a_missing_attribute_with_a_default_or_a_defined_test_still_renders():
    rendered = render(text="{{ subscriber.attributes.city | default('there') }}"
                           "{% if subscriber.attributes.plan is defined %}!{% endif %}")
    assert rendered.text_body == "there"


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


def problems(text, *, subject="Hi", html=None, unsubscribe_configured=True):
    analysis = analyse(subject, text, html, unsubscribe_configured=unsubscribe_configured)
    return [str(p) for p in analysis.problems]


def test_a_variable_that_never_exists_is_named_with_its_line_and_the_closest_real_one():
    assert problems("Hello {{ name }}") == ["text, line 1: 'name' is not a variable (did you mean subscriber.name?)"]
    assert problems("\n\n{{ subscriber.emial }} {{ subscribr.name }} {{ campaign.from_addr }}") == [
        "text, line 3: 'subscriber.emial' is not a variable (did you mean subscriber.email?)",
        "text, line 3: 'subscribr' is not a variable (did you mean subscriber.name?)",
        "text, line 3: 'campaign.from_addr' is not a variable (did you mean campaign.from?)",
    ]
    # A CSV column named as if it were a variable of its own: it lives under subscriber.attributes.
    assert problems("{{ city }} {{ subscriber.city }}") == [
        "text, line 1: 'city' is not a variable (did you mean subscriber.attributes.city?)",
        "text, line 1: 'subscriber.city' is not a variable (did you mean subscriber.attributes.city?)",
    ]
    assert problems("{{ unsubscribe_link }}") == [
        "text, line 1: 'unsubscribe_link' is not a variable (did you mean unsubscribe_url?)"]
    assert problems("{{ campaign.subject }}") == ["text, line 1: 'campaign.subject' is not a variable"]
    assert problems(None, subject="Hi {{ nme }}", html="<p>\n{{ x.y }}</p>") == [
        "subject, line 1: 'nme' is not a variable (did you mean subscriber.name?)",
        "html, line 2: 'x' is not a variable",
    ]


def test_what_the_template_defines_or_guards_is_no_problem():
    text = """{% set greeting = "Hello" %}{% set ns = namespace(total=0) %}{% set ns.total = 1 %}
{% macro line(label, value="-") %}{{ label }}: {{ value }}{{ varargs }}{% endmacro %}
{{ greeting }} {{ line("city", subscriber.attributes.city) }}
{% for tag in subscriber.attributes.tags if tag %}{{ loop.index }} {{ tag }}{% else %}none{% endfor %}
{% with total = 3 %}{{ total }}{% endwith %}{% call(item) line("x") %}{{ item }}{{ caller }}{% endcall %}
{{ nickname | default(subscriber.name) }} {{ title | d("") }} {{ range(3) | list }} {{ dict(a=1) }}
{% if vip is defined and vip %}{{ vip.level }}{% elif other is undefined %}x{% endif %}
{{ code if code is defined else "" }} {{ subscriber["email"] }} {{ subscriber.name.upper() }}
{{ subscriber.attributes.items() | list }} {{ subscriber.attributes[campaign.name] }} {{ campaign["from"] }}"""
    assert problems(text, subject="{{ campaign.name }} #{{ campaign.id }}") == []


def test_unsubscribe_url_without_an_unsubscribe_section_says_what_to_configure():
    assert problems("{{ unsubscribe_url }}", unsubscribe_configured=True) == []
    assert problems("x\n{{ unsubscribe_url }}", unsubscribe_configured=False) == [
        "text, line 2: unsubscribe_url needs the unsubscribe section (set unsubscribe.url or unsubscribe.mailto, "
        "with unsubscribe.secret, in the config)"]


def test_required_attributes_are_those_every_render_reads_without_a_default():
    text = """{{ subscriber.attributes.city }} {{ subscriber.attributes["first name"] }}
{{ subscriber.attributes.zip | default("") }}{% if subscriber.attributes.vip is defined %}{{ subscriber.attributes.vip }}{% endif %}
{% if subscriber.attributes.plan == "pro" %}{{ subscriber.attributes.seats }}{% endif %}
{% for x in subscriber.attributes.tags %}{{ subscriber.attributes.inloop }}{% endfor %}
{{ subscriber.attributes.a or subscriber.attributes.b }} {{ subscriber.attributes.get("c") }}
{% macro m() %}{{ subscriber.attributes.inmacro }}{% endmacro %}{{ subscriber.attributes.city }}"""
    required = analyse("{{ subscriber.attributes.greeting }}", text, None).required
    assert required == {"greeting": "subject, line 1", "city": "text, line 1", "first name": "text, line 1",
                        "plan": "text, line 3", "tags": "text, line 4", "a": "text, line 5"}


def test_the_variable_list_is_what_templates_see_and_what_the_docs_show():
    context = context_for(Recipient("ada@example.com", "Ada", {"city": "Paris"}, 1),
                          CampaignContent(campaign_id=7, name="n", subject="s", from_addr="news@example.com"), "u")
    seen = [f"{obj}.{key}" for obj in ("subscriber", "campaign") for key in context[obj]] + ["unsubscribe_url"]
    listed = [name.replace(".<column>", "") for name, _ in VARIABLES]
    assert seen == listed and set(context) == {"subscriber", "campaign", "unsubscribe_url"}
    root = Path(__file__).resolve().parents[2]
    docs = (root / "docs" / "messages.md").read_text(encoding="utf-8")
    readme = (root / "README.md").read_text(encoding="utf-8")
    for name, _ in VARIABLES:
        assert f"`{name}`" in docs and f"`{name}`" in readme, name
