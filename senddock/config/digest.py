"""A config's digest: which configuration a node runs with, comparable between nodes and with a file.

The digest is the sha256 of the *effective* configuration (validated, environment substituted,
defaults filled in) written as canonical JSON, **with every secret masked first** (the same
masking as ``check-config --show``: secret-named keys, DSN passwords, a URL's query string). It is
stored in the ``nodes`` table and printed by ``senddock nodes``, where anyone who may read them
would otherwise hold a hash of the secrets: with the rest of the config known (it is in the
repository), a weak password could be tested against it guess by guess. Masked, the digest holds
nothing to guess. The cost: a secret changed alone does not change the digest (a running node
still notices it, comparing the values in memory: senddock.core.config_watch).

Paths are hashed as written, not resolved against the config's folder: the same file deployed in
another folder is the same configuration.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from senddock.config import Config

#: Hex digits of a digest shown to people (the full 64 are in --json and in the nodes table).
SHOWN = 12


def config_digest(config: Config) -> str:
    """The sha256, in hex, of ``config``'s effective settings with its secrets masked."""
    text = json.dumps(_canonical(config.redacted()), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def short_digest(digest: str | None) -> str:
    """The digest as a column shows it; ``-`` for a node of a senddock that recorded none."""
    return digest[:SHOWN] if digest else "-"


def changed_settings(old: Any, new: Any, path: str = "") -> Iterator[str]:
    """The dotted paths (``retry.schedule``) where two configs differ: names only, never values,
    so secrets may be compared. A list is one setting: a schedule that changed is named once."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in sorted({*old, *new}, key=str):
            if old.get(key) != new.get(key):
                yield from changed_settings(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))
    elif old != new:
        yield path or "$"


def _canonical(value: Any) -> Any:
    """Keys as text: YAML may make ``1:`` an integer, and sort_keys cannot order 1 beside 'a'."""
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value
