"""Campaign templates: subject, text and HTML bodies rendered per recipient in Jinja2's sandbox.

The sandbox keeps a template from reaching Python internals (campaign content is operator input,
often pasted from elsewhere). ``StrictUndefined`` makes a missing variable an error instead of an
empty string: a greeting "Hello ," sent to a whole list is worse than a failed job. HTML bodies
autoescape, so a subscriber's name cannot inject markup.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import jinja2

from senddock.mail import headertext
from senddock.mail.render_limits import DEFAULT_LIMITS, RenderLimits
from senddock.mail.template_limits import BoundedEnvironment, TemplateLimit, render_within
from senddock.mail.template_uses import uses
from senddock.mail.template_variables import FIELDS as _FIELDS
from senddock.mail.template_variables import UNSUBSCRIBE_HINT
from senddock.mail.template_variables import VARIABLES, variable_list  # noqa: F401 - re-exported: the list lives there
from senddock.outcome import CampaignContent, Recipient, RenderedContent


class TemplateError(Exception):
    """A template that cannot be compiled or rendered; the message names the field and line.
    ``limit``: its render went past ``templates.max_size`` or ``max_render_time``."""

    def __init__(self, field: str, message: str, line: int | None = None, *, limit: bool = False) -> None:
        where = f"{field}, line {line}" if line else field
        super().__init__(f"{where}: {message}")
        self.field, self.line, self.detail, self.limit = field, line, message, limit


class _MissingValue(jinja2.UndefinedError):
    """An UndefinedError that keeps what was looked up and in what: Jinja2's own message names
    only the type (``'dict object' has no attribute 'cty'``), which cannot tell a subscriber's
    missing attribute from anything else."""

    def __init__(self, container: Any, key: Any, message: str) -> None:
        super().__init__(message)
        self.container, self.key = container, key


class _Undefined(jinja2.StrictUndefined):
    __slots__ = ()

    def __init__(self, hint: str | None = None, obj: Any = jinja2.runtime.missing, name: str | None = None,
                 exc: type[jinja2.TemplateRuntimeError] = jinja2.UndefinedError) -> None:
        if exc is jinja2.UndefinedError and obj is not jinja2.runtime.missing:
            exc = functools.partial(_MissingValue, obj, name)  # type: ignore[assignment]
        super().__init__(hint, obj, name, exc)


@cache
def _environment(autoescape: bool) -> jinja2.Environment:
    return BoundedEnvironment(undefined=_Undefined, autoescape=autoescape, keep_trailing_newline=True)


@dataclass(frozen=True)
class CampaignTemplates:
    """The compiled templates of one campaign; compile once, render per recipient."""

    subject: jinja2.Template | _Constant
    text_body: jinja2.Template | _Constant | None
    html_body: jinja2.Template | _Constant | None
    limits: RenderLimits = DEFAULT_LIMITS  # what one part's render may cost (templates section)

    @classmethod
    def compile(cls, subject: str, text_body: str | None, html_body: str | None, *,
                limits: RenderLimits = DEFAULT_LIMITS) -> CampaignTemplates:
        """Raise :class:`TemplateError` naming the field and line of the first syntax error."""
        return cls(
            subject=_compile("subject", subject, autoescape=False),
            text_body=_compile("text", text_body, autoescape=False) if text_body is not None else None,
            html_body=_compile("html", html_body, autoescape=True) if html_body is not None else None,
            limits=limits,
        )

    def render(self, context: Mapping[str, Any]) -> RenderedContent:
        """Raise :class:`TemplateError` when the recipient's data does not fit the template (or a
        part's render goes past its limits)."""
        subject = _render("subject", self.subject, context, self.limits)
        # A header is one line: a newline from a subscriber's data would end it, and a control
        # character (NUL, BEL...) would go into the message raw.
        subject = headertext.one_line(subject)
        html = _render("html", self.html_body, context, self.limits) if self.html_body else None
        text = _render("text", self.text_body, context, self.limits) if self.text_body else None
        if text is None and html is not None:
            text = html_to_text(html)
        return RenderedContent(subject=subject, text_body=text, html_body=html)


def context_for(recipient: Recipient, campaign: CampaignContent, unsubscribe_url: str | None) -> dict[str, Any]:
    """What a template sees: ``subscriber``, ``campaign`` and, when configured, ``unsubscribe_url``
    (left out otherwise, so a template using it fails with a message saying what to configure)."""
    context: dict[str, Any] = {
        "subscriber": {"email": recipient.email, "name": recipient.name, "attributes": dict(recipient.attributes)},
        "campaign": {"id": campaign.campaign_id, "name": campaign.name, "from": campaign.from_addr},
    }
    if unsubscribe_url is not None:
        context["unsubscribe_url"] = unsubscribe_url
    return context


def html_to_text(html: str) -> str:
    """The plain-text alternative of an HTML-only campaign (layout-aware: lists, tables, links)."""
    from inscriptis import get_text  # imported on first use: lxml is slow to import
    from inscriptis.css_profiles import CSS_PROFILES
    from inscriptis.model.config import ParserConfig

    config = ParserConfig(css=CSS_PROFILES["strict"], display_links=True)
    return get_text(html, config).strip() + "\n"


class _Constant:
    """A template without any Jinja2 syntax renders to itself: skip Jinja2's per-render context
    set-up, the largest per-message cost of a campaign whose subject or body is not personalised."""

    def __init__(self, source: str) -> None:
        self.source = source

    def render(self, context: Mapping[str, Any]) -> str:
        return self.source


def _compile(field: str, source: str, *, autoescape: bool) -> jinja2.Template | _Constant:
    if not any(marker in source for marker in ("{{", "{%", "{#")):
        return _Constant(source)
    try:
        return _environment(autoescape).from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(field, exc.message or "syntax error", exc.lineno) from None


def _render(field: str, template: jinja2.Template | _Constant, context: Mapping[str, Any],
            limits: RenderLimits = DEFAULT_LIMITS) -> str:
    if isinstance(template, _Constant):
        return template.render(context)
    try:
        return render_within(template, context, limits)
    except jinja2.UndefinedError as exc:
        message = _missing_attribute(exc, context) or exc.message or "undefined variable"
        if message == "'unsubscribe_url' is undefined":
            message += f" ({UNSUBSCRIBE_HINT})"
        raise TemplateError(field, message, _line(exc)) from None
    except TemplateLimit as exc:
        raise TemplateError(field, str(exc), _line(exc), limit=True) from None
    except jinja2.TemplateError as exc:  # sandbox refusals and the rest
        raise TemplateError(field, str(exc), _line(exc)) from None
    except Exception as exc:  # a filter on the wrong type, a division by zero in the data...
        raise TemplateError(field, f"{type(exc).__name__}: {exc}", _line(exc)) from None


# How many of a subscriber's attribute names a message lists before "..."
_LISTED_ATTRIBUTES = 10


def _missing_attribute(exc: jinja2.UndefinedError, context: Mapping[str, Any]) -> str | None:
    """A subscriber attribute the recipient lacks, in the words of `campaign send`'s check, with
    the attributes they do have; None for any other undefined value."""
    subscriber = context.get("subscriber")
    attributes = subscriber.get("attributes") if isinstance(subscriber, Mapping) else None
    if not isinstance(exc, _MissingValue) or attributes is None or exc.container is not attributes:
        return None
    have = sorted(map(str, attributes))
    if not have:
        theirs = "they have no attributes"
    else:
        listed = ", ".join(have[:_LISTED_ATTRIBUTES]) + (f", ... ({len(have)} in all)"
                                                         if len(have) > _LISTED_ATTRIBUTES else "")
        theirs = f"their attributes: {listed}"
        close = difflib.get_close_matches(str(exc.key), have, n=1)
        if close:
            theirs += f"; did you mean {close[0]!r}?"
    return f"this subscriber lacks the attribute {exc.key!r} ({theirs})"


def _line(exc: BaseException) -> int | None:
    """The template line a render error came from, read off the traceback Jinja2 rewrites."""
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


@dataclass(frozen=True)
class Analysis:
    """What a campaign's templates read, judged before any render.

    ``problems``: variables that can never exist, one TemplateError each (field, line, message).
    ``required``: the subscriber attributes read on every render with no default, each with where
    it is first read (``text, line 2``): a recipient without one of them cannot render.
    ``printed``: the subscriber's values written out on every render with nothing to stand in for an
    empty one (``name``, ``attributes.city``), each with where: an empty one leaves a gap (``Hi ,``).
    """

    problems: list[TemplateError] = field(default_factory=list)
    required: dict[str, str] = field(default_factory=dict)
    printed: dict[str, str] = field(default_factory=dict)


def analyse(subject: str, text_body: str | None, html_body: str | None, *,
            unsubscribe_configured: bool = True) -> Analysis:
    """Read the templates' variables off their AST (the sources must compile)."""
    analysis, seen = Analysis(), set()
    for name, source, autoescape in (("subject", subject, False), ("text", text_body, False),
                                     ("html", html_body, True)):
        if source is None or not any(marker in source for marker in ("{{", "{%", "{#")):
            continue
        environment = _environment(autoescape)
        for use in uses(environment.parse(source), frozenset(environment.globals)):
            problem = _problem(use, unsubscribe_configured)
            if problem is not None and (name, use.line, problem) not in seen:
                seen.add((name, use.line, problem))
                analysis.problems.append(TemplateError(name, problem, use.line))
            elif problem is None and (column := _required_attribute(use)) is not None:
                analysis.required.setdefault(column, f"{name}, line {use.line}")
            if problem is None and (value := _printed_value(use)) is not None:
                analysis.printed.setdefault(value, f"{name}, line {use.line}")
    return analysis


def _problem(use, unsubscribe_configured: bool) -> str | None:
    root, path = use.path[0], use.path
    if root == "unsubscribe_url":
        if unsubscribe_configured or use.guarded:
            return None
        return f"unsubscribe_url needs the unsubscribe section ({UNSUBSCRIBE_HINT})"
    if use.guarded:
        return None
    if root not in _FIELDS:
        bad = (root,)
    elif len(path) > 1 and path[1] not in _FIELDS[root]:
        bad = path[:2]
    else:
        return None
    dotted = ".".join(bad)
    suggestion = _suggest(path)
    return f"'{dotted}' is not a variable" + (f" (did you mean {suggestion}?)" if suggestion else "")


def _suggest(path: tuple[str, ...]) -> str | None:
    """The closest real variable: a typo of one (``subscriber.emial``), a field named without its
    object (``name``), or else the subscriber attribute of that name (``city``)."""
    root = path[0]
    if root in _FIELDS:
        close = difflib.get_close_matches(path[1], _FIELDS[root], n=1)
        if close:
            return ".".join((root, close[0], *path[2:]))
        return f"subscriber.attributes.{path[1]}" if root == "subscriber" else None
    fields = {f"{obj}.{name}": name for obj, names in _FIELDS.items() for name in names}
    by_name = {name: full for full, name in reversed(list(fields.items()))}  # "name": subscriber's first
    candidates = [*_FIELDS, "unsubscribe_url", *by_name]
    close = difflib.get_close_matches(root, candidates, n=1)
    if close:
        found = close[0]
        if found in _FIELDS:
            return ".".join((found, *path[1:]))
        return ".".join((by_name.get(found, found), *path[1:]))
    if len(path) == 1:
        return f"subscriber.attributes.{root}"
    return None


def _required_attribute(use) -> str | None:
    """The attribute a use needs every recipient to have, if it does."""
    path = use.path
    if use.guarded or not use.always or len(path) < 3 or path[:2] != ("subscriber", "attributes"):
        return None
    if use.attr[2] and hasattr(dict, path[2]):  # `.items`, `.get`...: the dict's method, not a key
        return None
    return path[2]


def _printed_value(use) -> str | None:
    """``name`` or ``attributes.KEY`` when a use writes the subscriber's value out on every render
    with nothing for an empty one."""
    if not (use.printed and use.always):
        return None
    path = use.path
    if path == ("subscriber", "name"):
        return "name"
    if len(path) == 3 and path[:2] == ("subscriber", "attributes") and not (use.attr[2] and hasattr(dict, path[2])):
        return f"attributes.{path[2]}"
    return None


def trial_render(templates: CampaignTemplates, unsubscribe_configured: bool) -> None:
    """Render once for a made-up subscriber with no attributes, for what only a render shows: a
    template that goes past its limits whoever it is for (raises that TemplateError). Whatever a
    real subscriber's data would change (a missing attribute) is the send's check, not this."""
    context: dict[str, Any] = {
        "subscriber": {"email": "someone@example.com", "name": "Someone", "attributes": {}},
        "campaign": {"id": 0, "name": "trial", "from": "someone@example.com"},
    }
    if unsubscribe_configured:
        context["unsubscribe_url"] = "https://example.com/unsubscribe/trial"
    try:
        templates.render(context)
    except TemplateError as exc:
        if exc.limit:
            raise
