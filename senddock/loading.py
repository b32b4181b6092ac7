"""Loading a config file with the plugins it names: the one place that knows both.

The plugins contribute to the schema (their own sections) and name the installed transports, so
the plugin manager is built first, then the file validated (:mod:`senddock.config.validation`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The owners whose checks register themselves with senddock.config.checks when imported.
import senddock.passwords  # noqa: F401
from senddock.config.file import config_folder, file_stamp, read_config, rereadable
from senddock.config.schema import base_schema
from senddock.config.sections import Config
from senddock.config.validation import validate
from senddock.errors import ConfigError


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Read, validate and resolve a config file (or the defaults when ``path`` is None).

    Raises :class:`ConfigError` listing every problem found.
    """
    # Imported here: the factory loads importlib.metadata and the defaults (ssl), which `--help`
    # and a usage error do not need.
    from senddock.plugins import build_plugin_manager

    environ = os.environ if environ is None else environ
    config_path = Path(path) if path is not None else None
    label = str(config_path) if config_path else "<defaults>"
    # Stat before reading: a change after this is seen by the running node's watch (core.config_watch).
    stamp = file_stamp(config_path) if config_path and rereadable(config_path) else None
    raw = read_config(config_path) if config_path else {}

    errors: list[str] = []
    if not isinstance(raw, dict):
        raise ConfigError([f"{label}::$: the file must hold a mapping of sections, not {type(raw).__name__}"])

    plugins_section = raw.get("plugins") if isinstance(raw.get("plugins"), dict) else {}
    pm_build = build_plugin_manager(
        load=_str_list(plugins_section.get("load")), disable=_str_list(plugins_section.get("disable"))
    )
    errors += [f"{label}::{e}" for e in pm_build.errors]

    schema = base_schema()
    for section, section_schema in pm_build.config_schemas.items():
        if section in schema["properties"]:
            errors.append(f"{label}::$.{section}: a plugin's schema tries to redefine a core section")
            continue
        schema["properties"][section] = {"default": {}, **section_schema}

    def plugin_problems(data: Mapping[str, Any]) -> list[tuple[str, str]]:
        return [problem for found in pm_build.pm.hook.config_problems(config=data) for problem in found or ()]

    data = validate(raw, schema, label=label, environ=environ, transports=pm_build.transports,
                    earlier=errors, more_problems=plugin_problems)
    return Config(
        path=config_path,
        data=data,
        plugin_manager=pm_build.pm,
        plugin_origins=pm_build.origins,
        transport_providers=pm_build.transports,
        folder=config_folder(config_path),
        file_stamp=stamp,
    )


def _str_list(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

