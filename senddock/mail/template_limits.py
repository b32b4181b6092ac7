"""What one render of a campaign template may cost: the size of what it writes and its time.

Jinja2's sandbox keeps a template from Python's internals, not from work: ``{{ 'a' * 100000000 }}``
rendered 100 MB, and two nested ``range(100000)`` loops hung `campaign preview`. A render runs
under a :class:`Budget` (``templates.max_size`` characters a part, ``templates.max_render_time``):

* ``*`` and ``**`` are intercepted: a repetition longer than the size, or a power of more than a
  few thousand digits, is refused before it is made;
* ``range`` counts its items as the loop takes them, and every call and every piece of output
  looks at the clock;
* the output is streamed (``Template.generate``) and counted as it comes.

Past either, the render stops with :class:`TemplateLimit`, a template error like any other:
refused at ``campaign create`` and ``edit`` (a trial render), ``preview``, ``send-test``, and at
the send (the job fails as a template error, and its campaign pauses).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from senddock.mail.render_limits import RenderLimits

# A power with a result longer than this many bits is refused (10**10000 is 33,220 bits).
MAX_POWER_BITS = 100_000


class TemplateLimit(jinja2.TemplateError):
    """A render went past ``templates.max_size`` or ``templates.max_render_time``."""


_current = threading.local()  # the Budget of the render running in this thread


class Budget:
    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.max_seconds

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimit(f"the render took longer than templates.max_render_time "
                                f"({self.limits.max_seconds:g}s)")

    def check_size(self, size: int) -> None:
        if size > self.limits.max_size:
            raise TemplateLimit(f"it renders more than templates.max_size ({self.limits.max_size:,} characters)")


def _budget() -> Budget | None:
    return getattr(_current, "budget", None)


def _tick() -> None:
    budget = _budget()
    if budget is not None:
        budget.tick()


def render_within(template: jinja2.Template, context: Any, limits: RenderLimits) -> str:
    """``template`` rendered with ``context`` under ``limits`` (raises :class:`TemplateLimit`)."""
    budget = Budget(limits)
    outer, _current.budget = _budget(), budget
    try:
        parts, size = [], 0
        for piece in template.generate(context):
            size += len(piece)
            budget.check_size(size)
            budget.tick()
            parts.append(piece)
        return "".join(parts)
    finally:
        _current.budget = outer


def _bounded_range(*args: int) -> Iterator[int]:
    """Jinja2's own range (at most 100,000 items), its items counted against the clock."""
    for n, item in enumerate(safe_range(*args)):
        if n % 1024 == 0:
            _tick()
        yield item


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with the checks above: repetition and powers, calls, ``range``."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals["range"] = _bounded_range

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        if budget is not None:
            budget.tick()
            if operator == "*":
                _check_repeat(budget, left, right)
            elif operator == "**" and _too_big_a_power(left, right):
                raise TemplateLimit(f"{left!r} ** {right!r} is too large a number")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _tick()
        return super().call(__context, __obj, *args, **kwargs)


def _check_repeat(budget: Budget, left: Any, right: Any) -> None:
    for sequence, times in ((left, right), (right, left)):
        if isinstance(sequence, (str, list, tuple)) and isinstance(times, int) and not isinstance(times, bool):
            budget.check_size(len(sequence) * times)


def _too_big_a_power(base: Any, exponent: Any) -> bool:
    if not (isinstance(base, int) and isinstance(exponent, int)) or exponent <= 0 or abs(base) < 2:
        return False
    return abs(base).bit_length() * exponent > MAX_POWER_BITS
