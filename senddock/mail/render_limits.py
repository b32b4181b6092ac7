"""The ``templates`` section as numbers: what one render of a campaign template may cost.

Apart from the renderer (template_limits) so that what only carries the limits around (the
campaign checks, the CLI's query commands) does not import Jinja2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RenderLimits:
    max_size: int = 5 * 1024 * 1024  # characters of one rendered part
    max_seconds: float = 2.0  # of one part's render


DEFAULT_LIMITS = RenderLimits()


def render_limits(templates: Any) -> RenderLimits:
    """The ``templates`` section (validated) as limits."""
    from senddock.durations import parse_duration
    from senddock.sizes import parse_size

    if not templates:
        return DEFAULT_LIMITS
    return RenderLimits(max_size=parse_size(templates.get("max_size", "5MiB")),
                        max_seconds=parse_duration(templates.get("max_render_time", "2s")))
