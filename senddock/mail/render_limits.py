"""The ``templates`` section as numbers: what one render of a campaign template may cost.

Apart from the renderer (template_limits) so that what only carries the limits around (the
campaign checks, the CLI's query commands) does not import Jinja2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from senddock.config import TemplateSettings


@dataclass(frozen=True)
class RenderLimits:
    max_size: int = 5 * 1024 * 1024  # characters of one rendered part
    max_seconds: float = 2.0  # of one part's render


DEFAULT_LIMITS = RenderLimits()


def render_limits(templates: TemplateSettings) -> RenderLimits:
    """The ``templates`` section as limits."""
    return RenderLimits(max_size=templates.max_size, max_seconds=templates.max_render_time)
