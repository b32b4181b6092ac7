"""A campaign's own rate as the operator gives it (`--rate 100/min --burst 5`, `none`), checked
and turned into the text `campaigns.send_rate` keeps; the claimer reads it back with
senddock.pacing.rates.parse_campaign_rate."""

from __future__ import annotations

from senddock.errors import UsageError
from senddock.pacing.rates import campaign_rate_text

NO_RATE = "none"  # `--rate none`, `set-rate ID none`: no rate of its own


def send_rate_text(rate: str | None, burst: int | None = None, *, option: str = "{=rate}") -> str | None:
    """A campaign's rate as stored (`100/min`, `100/min burst 5`), or None for ``rate`` None or
    ``"none"``; a bad rate or burst is a UsageError naming ``option`` (or the burst) and the form to use."""
    if rate is None or rate == NO_RATE:
        if burst is not None:
            raise UsageError(f"{{=burst}} {burst}: a burst needs a rate beside it (give {option} too)")
        return None
    if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int) or burst < 1):
        raise UsageError(f"{{=burst}} {burst!r}: not a burst: write a whole number of sends, at least 1")
    try:
        return campaign_rate_text(rate, burst)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None
