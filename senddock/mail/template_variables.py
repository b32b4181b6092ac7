"""The variables a campaign template sees, as data: no Jinja2 import, so `campaign create --help`
can show them without loading the template engine."""

from __future__ import annotations

# What a template sees (built by context_for). The one list that the create-time check, its error
# message, `campaign create --help`, docs/messages.md and README are held to (tests compare them).
VARIABLES: tuple[tuple[str, str], ...] = (
    ("subscriber.email", "the subscriber's address"),
    ("subscriber.name", "the subscriber's name"),
    ("subscriber.attributes.<column>", "a CSV column beyond email and name (e.g. city)"),
    ("campaign.id", "the campaign's id"),
    ("campaign.name", "the campaign's name"),
    ("campaign.from", "the campaign's From address"),
    ("unsubscribe_url", "the recipient's unsubscribe link (needs the unsubscribe config section)"),
)
FIELDS = {"subscriber": ("email", "name", "attributes"), "campaign": ("id", "name", "from")}
UNSUBSCRIBE_HINT = "set unsubscribe.url or unsubscribe.mailto, with unsubscribe.secret, in the config"


def variable_list() -> str:
    """``subscriber.email, subscriber.name, ...``: what an error about a variable ends with."""
    return ", ".join(name for name, _ in VARIABLES)
