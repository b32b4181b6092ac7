"""A running node's watch on its config file: it says when the file no longer holds what the node runs with.

A node reads its config once, at start, and keeps it: a retry schedule edited afterwards changes
nothing until a restart. Reloading on SIGHUP was the other way; it was not taken because most
settings are taken apart at start (the pool, concurrency and the send slots, the transport's
connections, the pacing gate, the lease the lifeline keeps), and a reload that applies some and
not others leaves a node that runs neither the old file nor the new one. So the node warns,
once per change, naming the settings that differ, and goes on with the config it started with.

Cheap: on each round of chores, one stat of the file (modification time, size, inode: an editor
that saves by renaming makes a new one); the file is read and validated again only when those change.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from senddock.config import Config
from senddock.loading import load_config
from senddock.config.digest import changed_settings, config_digest, short_digest
from senddock.config.file import file_stamp, rereadable
from senddock.errors import ConfigError, error_line

log = structlog.get_logger(__name__)

_UNSEEN = object()

RESTART = "the node runs with the config it started with: restart the node to apply it"
INVALID = "the node keeps running with the config it started with; a restart would refuse this file"


class ConfigWatch:
    def __init__(self, config: Config) -> None:
        # Compared with secrets and all, in memory only: a secret changed alone changes no digest.
        self._running: Mapping[str, Any] = config.data
        self._digest = config_digest(config)
        # A config from a pipe (-c /dev/stdin) cannot be read again: nothing to watch.
        self._path: Path | None = config.path if config.path is not None and rereadable(config.path) else None
        # As it was when the node loaded it: the file is read again only once it changed since
        # (each start of a node in a process would otherwise validate it again, ~35 ms).
        self._stamp: object = config.file_stamp if config.file_stamp is not None else _UNSEEN
        # What the last warning was about (the file's settings, or its errors): said once.
        self._said: Any = None

    def check(self) -> None:
        """Look at the file; re-read and compare it only when its stat changed."""
        if self._path is None:
            return
        stamp = file_stamp(self._path)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            now = load_config(self._path)
        except Exception as exc:  # noqa: BLE001 - whatever is wrong with the file, the node goes on
            errors = exc.errors if isinstance(exc, ConfigError) else [error_line(exc)]
            self._warn(tuple(errors), valid=False, errors=errors, meaning=INVALID)
            return
        if now.data == self._running:
            if self._said is not None:
                log.info("config_restored", path=str(self._path), config_digest=short_digest(self._digest),
                         meaning="the file holds the config the node runs with again: no restart needed")
            self._said = None
            return
        self._warn(now.data, valid=True, restart_needed=list(changed_settings(self._running, now.data)),
                   running_digest=short_digest(self._digest), file_digest=short_digest(config_digest(now)),
                   meaning=RESTART)

    def _warn(self, about: Any, **fields: Any) -> None:
        """Once per change: a file saved again as it was, or touched, says nothing new."""
        if about != self._said:
            self._said = about
            log.warning("config_changed", path=str(self._path), **fields)

