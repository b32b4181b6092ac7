"""The one factory that builds senddock's plugin manager.

Order of registration: hook specs, the built-in defaults (``trylast``, so any plugin overrides them),
every plugin of the ``senddock`` entry-point group (the built-in transports are registered there too,
exactly as a third-party plugin is), then the modules named in ``plugins.load``, minus the names in
``plugins.disable``. A module that holds a :class:`~senddock.transport.Transport` instance is
registered as that instance.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy
import structlog

from senddock import defaults, hooks
from senddock.transport import Transport

log = structlog.get_logger(__name__)

ENTRY_POINT_GROUP = "senddock"
DEFAULTS_NAME = "senddock.defaults"
BUILTIN_DISTRIBUTION = "senddock"


@dataclass
class PluginManagerBuild:
    """A built manager plus what the config loader needs to know about it."""

    pm: pluggy.PluginManager
    origins: dict[str, str] = field(default_factory=dict)  # plugin name -> built-in / entry point / config
    transports: dict[str, str] = field(default_factory=dict)  # transport name -> plugin name
    config_schemas: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # "$.json.path: message"


def build_plugin_manager(
    *,
    load: Iterable[str] = (),
    disable: Iterable[str] = (),
    extra: Iterable[tuple[str, object]] = (),
) -> PluginManagerBuild:
    """Build a manager; problems are returned in ``errors`` with the config path they belong to.

    :param load: dotted module paths from ``plugins.load``.
    :param disable: plugin names from ``plugins.disable``.
    :param extra: ``(name, plugin)`` pairs registered last (tests, embedding applications).
    """
    pm = pluggy.PluginManager(hooks.PROJECT_NAME)
    pm.add_hookspecs(hooks)
    build = PluginManagerBuild(pm=pm)
    disable = list(disable)
    for name in disable:
        pm.set_blocked(name)

    _register(build, DEFAULTS_NAME, defaults, "built-in")
    entry_points = _entry_points()  # scans every installed distribution's metadata: once per build
    for ep in entry_points:
        if pm.is_blocked(ep.name) or pm.get_plugin(ep.name) is not None:
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken third-party package must be named, not crash the loader
            build.errors.append(f"$.plugins: entry point {ep.name!r} ({ep.value}) cannot be loaded: {exc}")
            continue
        dist = ep.dist.name if ep.dist is not None else "?"
        origin = "built-in" if dist == BUILTIN_DISTRIBUTION else f"entry point ({dist})"
        _register(build, ep.name, plugin, origin)

    for index, module_path in enumerate(load):
        try:
            module = importlib.import_module(module_path)
        except Exception as exc:
            build.errors.append(f"$.plugins.load[{index}]: cannot import {module_path!r}: {exc}")
            continue
        if not pm.is_blocked(module_path):
            _register(build, module_path, module, "config (plugins.load)")

    for name, plugin in extra:
        _register(build, name, plugin, "registered by the application")

    known = set(build.origins) | {ep.name for ep in entry_points} | set(load)
    for index, name in enumerate(disable):
        if name not in known:
            build.errors.append(
                f"$.plugins.disable[{index}]: no plugin is named {name!r} (known: {', '.join(sorted(known))})"
            )

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        build.errors.append(f"$.plugins: {exc}")

    _collect_contributions(build)
    return build


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def _register(build: PluginManagerBuild, name: str, plugin: object, origin: str) -> None:
    plugin = _transport_of(build, name, plugin)
    if plugin is None:
        return
    try:
        build.pm.register(plugin, name=name)
    except (ValueError, pluggy.PluginValidationError) as exc:
        build.errors.append(f"$.plugins: plugin {name!r} cannot be registered: {exc}")
        return
    build.origins[name] = origin


def _transport_of(build: PluginManagerBuild, name: str, plugin: object) -> object | None:
    """The plugin to register for what an entry point or ``plugins.load`` named: a module that holds
    a Transport at top level is that Transport (its hooks are methods; the module's functions are
    not hooks), so entry points keep naming modules as they always have."""
    if not isinstance(plugin, ModuleType):
        return plugin
    transports = [value for value in vars(plugin).values() if isinstance(value, Transport)]
    if not transports:
        return plugin
    stray = sorted(attr for attr in dir(plugin) if build.pm.parse_hookimpl_opts(plugin, attr) is not None)
    if len(transports) > 1 or stray:
        what = (f"{len(transports)} transports: give each a module of its own" if len(transports) > 1 else
                f"module-level hooks ({', '.join(stray)}) beside its {type(transports[0]).__name__}: "
                f"make them its methods (@hookimpl), or move them to a module of their own")
        build.errors.append(f"$.plugins: plugin {name!r} ({plugin.__name__}) holds {what}")
        return None
    return transports[0]


def call_each(hook: pluggy.HookCaller, **kwargs: Any) -> None:
    """Call every implementation of a hook whose results are ignored, even after one raises.

    pluggy stops at the first exception, so one plugin's bug would skip every implementation after
    it: another transport's warm-up in ``worker_started``, the ``worker_stopped`` that closes its
    connections. Each failure is logged with the plugin's name and the next one is called, in
    pluggy's order (``tryfirst`` first, ``trylast`` last). Hook wrappers are not called.
    """
    for impl in reversed(hook.get_hookimpls()):  # pluggy calls the last registered first, as here
        if impl.hookwrapper or impl.wrapper:
            continue
        try:
            impl.function(*[kwargs[argname] for argname in impl.argnames])
        except Exception as exc:  # noqa: BLE001 - one plugin's bug, logged; the others still run
            log.error("plugin_failed", hook=hook.name, plugin=impl.plugin_name, error=repr(exc))


def _collect_contributions(build: PluginManagerBuild) -> None:
    """Gather each plugin's transports and config sections, remembering who contributed what."""
    for impl in build.pm.hook.transport_names.get_hookimpls():
        for transport in _call_safely(build, impl, default=()):
            owner = build.transports.setdefault(transport, impl.plugin_name)
            if owner != impl.plugin_name:
                build.errors.append(
                    f"$.transport: transport {transport!r} is provided by both {owner!r} and "
                    f"{impl.plugin_name!r}; disable one of them in plugins.disable"
                )
    for impl in build.pm.hook.config_schema.get_hookimpls():
        for section, schema in dict(_call_safely(build, impl, default={})).items():
            if build.config_schemas.setdefault(section, schema) is not schema:
                build.errors.append(f"$.{section}: config section claimed by two plugins (second: {impl.plugin_name!r})")


def _call_safely(build: PluginManagerBuild, impl: Any, default: Any) -> Any:
    try:
        return impl.function() or default
    except Exception as exc:
        build.errors.append(f"$.plugins: plugin {impl.plugin_name!r} failed in {impl.function.__name__}(): {exc}")
        return default


def describe(build_pm: pluggy.PluginManager, origins: Mapping[str, str]) -> list[dict[str, Any]]:
    """Each registered plugin with its origin and the hooks it implements (for ``senddock plugins``)."""
    hooks_by_plugin: dict[str, list[str]] = {}
    for hook_name in sorted(build_pm.hook.__dict__):
        caller = getattr(build_pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            hooks_by_plugin.setdefault(impl.plugin_name, []).append(hook_name)
    return [
        {"name": name, "origin": origins.get(name, "?"), "hooks": sorted(hooks_by_plugin.get(name, []))}
        for name, _ in sorted(build_pm.list_name_plugin(), key=lambda item: item[0])
    ]
