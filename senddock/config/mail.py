"""The sections that shape every message, typed: ``unsubscribe`` (its links), ``dkim`` (its
signature) and ``templates`` (what one render of it may cost).

Secrets are kept out of each repr: a section logged by mistake prints no key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from senddock.durations import parse_duration
from senddock.sizes import parse_size


@dataclass(frozen=True)
class UnsubscribeSettings:
    url: str | None = None
    mailto: str | None = None
    secret: str | None = field(default=None, repr=False)

    @property
    def configured(self) -> bool:
        """Whether messages carry unsubscribe links (and templates may use ``unsubscribe_url``): a key
        to sign them and somewhere for them to lead."""
        return bool(self.secret and (self.url or self.mailto))


@dataclass(frozen=True)
class DkimSettings:
    domain: str
    selector: str
    private_key_file: str | None = None  # as written: relative to the config's folder
    private_key: str | None = field(default=None, repr=False)  # the PEM itself, from the environment


@dataclass(frozen=True)
class TemplateSettings:
    max_size: int  # characters of one rendered part
    max_render_time: float  # seconds of one part's render


def unsubscribe_settings(section: Mapping[str, Any]) -> UnsubscribeSettings:
    return UnsubscribeSettings(url=section["url"], mailto=section["mailto"], secret=section["secret"])


def dkim_settings(section: Mapping[str, Any] | None) -> DkimSettings | None:
    """None without a ``dkim`` section: messages go out unsigned."""
    if not section:
        return None
    return DkimSettings(domain=section["domain"], selector=section["selector"],
                        private_key_file=section.get("private_key_file"), private_key=section.get("private_key"))


def template_settings(section: Mapping[str, Any]) -> TemplateSettings:
    return TemplateSettings(max_size=parse_size(section["max_size"]),
                            max_render_time=parse_duration(section["max_render_time"]))
