"""Counts in messages: ``1 address``, ``2 addresses``.

Here rather than in the CLI: the engine's refusals (``InvalidState``...) are shown as they are, and
the engine never imports the CLI. ``senddock.cli.output`` re-exports it for the commands.
"""

from __future__ import annotations


def plural(count: int, one: str, many: str | None = None) -> str:
    """The count with its noun agreeing: ``plural(1, "address", "addresses")`` is ``1 address``;
    ``many`` defaults to ``one`` + "s"."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def is_status(status: str) -> str:
    """``is a draft``, ``is paused``: a campaign's status after "campaign 5 ..." (draft is a noun)."""
    return "is a draft" if status == "draft" else f"is {status}"
