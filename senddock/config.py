"""YAML -> JSON Schema validation (as written) -> environment secrets -> validation again -> settings.

Every problem is collected and reported as ``FILE::$.json.path: message``; unknown keys are errors at
every level, so a typo never falls back silently to a default.
"""

from __future__ import annotations

import copy
import difflib
import ipaddress
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy
import yaml

from senddock.config_file import config_folder, read_config
from senddock.durations import is_duration, parse_duration
from senddock.errors import ConfigError
from senddock.pacing.limits import PacingSettings, pacing_problems, pacing_settings
from senddock.redact import MASK, is_secret_key, redact
from senddock.retry import RetrySettings, retry_settings
from senddock.sizes import is_size, parse_size
from senddock.webhooks.settings import webhook_problems

ENV_CONFIG = "SENDDOCK_CONFIG"
ENV_DATABASE_URL = "SENDDOCK_DATABASE_URL"
# Sends in flight per node when neither concurrency nor its former name workers is set.
DEFAULT_CONCURRENCY = 50
DEFAULT_CONFIG_PATHS = (Path("config/senddock.yaml"), Path("senddock.yaml"))

_ENV_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")
# Errors that a value written as ${ENV} may legitimately raise before it is substituted.
_DEFERRED_VALIDATORS = {"type", "enum", "const", "duration", "size", "pattern", "minLength", "maxLength", "anyOf", "oneOf"}


# jsonschema takes ~50 ms to import: loaded by the first load_config, not by importing this module
# (the CLI imports it to parse argv, and `senddock --help` loads no config).
if TYPE_CHECKING:
    import jsonschema


def _duration_keyword(validator: Any, enabled: bool, instance: Any, schema: Mapping) -> Iterator[Any]:
    if enabled and isinstance(instance, str) and not is_duration(instance):
        from jsonschema import ValidationError

        yield ValidationError(_not_a_duration(instance))


def _not_a_duration(value: Any) -> str:
    """A number without its unit (``lease: 30``, or ``"30"`` from the environment) is the usual
    slip: say which unit to add rather than what type YAML made of it."""
    number = value.strip() if isinstance(value, str) else value
    if isinstance(number, str) and re.fullmatch(r"\d+(\.\d+)?", number):
        return f"{value!r} is not a duration: add a unit, e.g. {number}s"
    if isinstance(number, (int, float)) and not isinstance(number, bool):
        return f"{value!r} is not a duration: add a unit, e.g. {number}s"
    return f"{value!r} is not a duration (e.g. 30s, 2m, 1h30m)"


def _size_keyword(validator: Any, enabled: bool, instance: Any, schema: Mapping) -> Iterator[Any]:
    if enabled and isinstance(instance, (str, int)) and not is_size(instance):
        from jsonschema import ValidationError

        yield ValidationError(f"{instance!r} is not a size (e.g. 256KiB, 1MiB, or a number of bytes)")


@cache
def _validator_class() -> Any:
    """Draft 2020-12 with senddock's ``duration`` and ``size`` keywords."""
    import jsonschema

    return jsonschema.validators.extend(
        jsonschema.Draft202012Validator, {"duration": _duration_keyword, "size": _size_keyword})


def base_schema() -> dict[str, Any]:
    text = resources.files("senddock").joinpath("config_schema.json").read_text(encoding="utf-8")
    return json.loads(text)


@dataclass(frozen=True)
class DatabaseSettings:
    dsn: str | None
    direct_dsn: str | None
    embedded_path: Path
    pool_size: int
    connect_timeout: float
    auto_migrate: bool
    result_commit: str = "async"
    pool_mode: str = "auto"  # what dsn reaches: auto, transaction (a pooler in transaction mode) or session
    stuck_after: float = 10.0  # a node's statement waiting longer is reported (senddock.core.waits)


@dataclass(frozen=True)
class BreakerSettings:
    bounce_rate: float
    bounce_window: int
    early_bounces: int
    early_window: int
    probe_interval: float
    probe_max_interval: float


@dataclass(frozen=True)
class RecoverySettings:
    heartbeat: float
    lease: float
    in_doubt: str
    max_rescues: int
    failover_window: float = 10.0


@dataclass(frozen=True)
class LoggingSettings:
    level: str
    format: str


@dataclass(frozen=True)
class Config:
    """The validated configuration and the plugin manager whose plugins contributed to its schema."""

    path: Path | None
    data: Mapping[str, Any]
    plugin_manager: pluggy.PluginManager = field(repr=False)
    plugin_origins: Mapping[str, str] = field(repr=False)
    transport_providers: Mapping[str, str] = field(repr=False)
    #: The absolute folder that relative paths in the config resolve against (see config_file.config_folder).
    folder: Path = field(default_factory=Path.cwd)

    @property
    def transport(self) -> str:
        return transport_name(self.data["transport"])

    @property
    def max_consecutive_failures(self) -> int:
        setting = self.data["transport"]
        return setting.get("max_consecutive_failures", 20) if isinstance(setting, dict) else 20

    @property
    def poll_interval(self) -> float:
        return parse_duration(self.data["poll_interval"])

    @property
    def shutdown_timeout(self) -> float:
        return parse_duration(self.data["shutdown_timeout"])

    @property
    def concurrency(self) -> int:
        """Sends in flight per node: ``concurrency``, or its former name ``workers``."""
        data = self.data
        return data.get("concurrency") or data.get("workers") or DEFAULT_CONCURRENCY

    @property
    def workers(self) -> int:
        """The former name of ``concurrency``."""
        return self.concurrency

    @property
    def claim_batch(self) -> int:
        return self.data["claim_batch"]

    @property
    def node_name(self) -> str | None:
        """The configured node name; None: the first free of HOST, HOST-2... (see core.node_names)."""
        return self.data["node"]["name"]

    @property
    def database(self) -> DatabaseSettings:
        db = self.data["database"]
        return DatabaseSettings(
            dsn=db["dsn"],
            direct_dsn=db["direct_dsn"],
            embedded_path=(self.folder / db["embedded"]["path"]).resolve(),
            pool_size=db["pool_size"],
            connect_timeout=parse_duration(db["connect_timeout"]),
            auto_migrate=db["auto_migrate"],
            result_commit=db["result_commit"],
            pool_mode=db["pool_mode"],
            stuck_after=parse_duration(db["stuck_after"]),
        )

    @property
    def retry(self) -> RetrySettings:
        return retry_settings(self.data["retry"])

    @property
    def recovery(self) -> RecoverySettings:
        r = self.data["recovery"]
        return RecoverySettings(
            heartbeat=parse_duration(r["heartbeat"]),
            lease=parse_duration(r["lease"]),
            in_doubt=r["in_doubt"],
            max_rescues=r["max_rescues"],
            failover_window=parse_duration(r["failover_window"]),
        )

    @property
    def breaker(self) -> BreakerSettings:
        b = self.data["breaker"]
        return BreakerSettings(
            bounce_rate=float(b["bounce_rate"]),
            bounce_window=b["bounce_window"],
            early_bounces=b["early_bounces"],
            early_window=b["early_window"],
            probe_interval=parse_duration(b["probe_interval"]),
            probe_max_interval=parse_duration(b["probe_max_interval"]),
        )

    @property
    def pacing(self) -> PacingSettings:
        """The ``pacing`` section, typed (the section's types live with the limits they make:
        senddock.pacing.limits)."""
        return pacing_settings(self.data["pacing"])

    @property
    def logging(self) -> LoggingSettings:
        return LoggingSettings(**self.data["logging"])

    def section(self, name: str) -> Mapping[str, Any]:
        return self.data.get(name) or {}

    def redacted(self) -> dict[str, Any]:
        """The effective configuration with every secret masked, safe to print or log."""
        return redact(copy.deepcopy(dict(self.data)))


def find_config_path(explicit: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> Path | None:
    """``-c FILE``, else ``$SENDDOCK_CONFIG``, else ``config/senddock.yaml`` or ``senddock.yaml`` if present."""
    if explicit:
        return Path(explicit)
    if environ.get(ENV_CONFIG):
        return Path(environ[ENV_CONFIG])
    return next((p for p in DEFAULT_CONFIG_PATHS if p.is_file()), None)


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
    validator = _validator_class()(schema)

    # 1. As written: a value such as ${SMTP_PORT} stands in for whatever the environment gives.
    problems = [_describe(e) for e in _errors(validator, raw) if not _is_deferred(e)]
    problems += list(_secrets_written_in_file(raw))
    data, whole_refs, env_errors = _substitute(raw, environ)
    problems += env_errors
    errors += [f"{label}::{p}: {m}" for p, m in sorted(problems)]
    if errors:
        raise ConfigError(errors)

    # 2. With the environment substituted, validated again (so `port: ${SMTP_PORT}` must be an integer).
    if environ.get(ENV_DATABASE_URL):
        data.setdefault("database", {})["dsn"] = environ[ENV_DATABASE_URL]
    _coerce_env_values(validator, data, whole_refs)
    errors = [f"{label}::{p}: {_env_message(e, whole_refs, m)}" for e in _errors(validator, data) for p, m in [_describe(e)]]
    if errors:
        raise ConfigError(errors)

    _fill_defaults(schema, data, schema)
    errors = [f"{label}::{p}: {m}" for p, m in _semantic_errors(data, pm_build.transports)]
    for found in pm_build.pm.hook.config_problems(config=data):
        errors += [f"{label}::{p}: {m}" for p, m in found or ()]
    if errors:
        raise ConfigError(errors)
    return Config(
        path=config_path,
        data=data,
        plugin_manager=pm_build.pm,
        plugin_origins=pm_build.origins,
        transport_providers=pm_build.transports,
        folder=config_folder(config_path),
    )


def _str_list(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _errors(validator: Any, instance: Any) -> list[jsonschema.ValidationError]:
    return sorted(validator.iter_errors(instance), key=lambda e: (list(map(str, e.absolute_path)), e.message))


def _is_deferred(error: jsonschema.ValidationError) -> bool:
    # A mistyped reference (`${URL` unclosed) is deferred too: _bad_references reports it, once.
    return (
        error.validator in _DEFERRED_VALIDATORS
        and isinstance(error.instance, str)
        and "${" in error.instance
    )


def _env_message(error: jsonschema.ValidationError, whole_refs: Mapping[tuple, str], message: str) -> str:
    name = whole_refs.get(tuple(error.absolute_path))
    return f"{message} (from ${{{name}}})" if name else message


def transport_name(setting: str | Mapping[str, Any]) -> str:
    """``transport: smtp`` and ``transport: {name: smtp, ...}`` name the same transport."""
    return setting if isinstance(setting, str) else setting["name"]


def _describe(error: jsonschema.ValidationError) -> tuple[str, str]:
    """(json path, message); an unknown key is reported at its own path, with a suggestion."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        # "x is not valid under any of the given schemas" helps nobody: say what the closest branch wants.
        # The branch whose type matched is the one the writer meant.
        meant = [e for e in error.context if e.validator != "type"] or list(error.context)
        return _describe(max(meant, key=lambda e: len(e.absolute_path)))
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = list(error.schema.get("properties", {}))
        extra = [k for k in error.instance if k not in known]
        if len(extra) == 1:
            key = extra[0]
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(known)})"
            return _json_path(tuple(error.absolute_path) + (key,)), f"unknown key {key!r}{hint}"
    if _is_secret_path(tuple(error.absolute_path)):
        # Whatever is wrong with a secret, its value is not printed.
        if error.validator == "minLength":
            return error.json_path, f"is too short: at least {error.validator_value} characters"
        if error.validator == "type":
            kind = {int: "number", float: "number", bool: "boolean", list: "list", dict: "mapping"}.get(
                type(error.instance), type(error.instance).__name__)
            return error.json_path, f"must be text from the environment (${{NAME}}), not a {kind}"
        return error.json_path, error.message.replace(repr(error.instance), MASK)
    if error.validator == "type" and error.schema.get("duration"):
        return error.json_path, _not_a_duration(error.instance)
    if error.validator == "pattern":
        return error.json_path, _pattern_message(error)
    if error.validator == "type" and error.schema.get("patternMessage") and not isinstance(error.instance, (dict, list)):
        # `global: 200` is a rate without its unit, not "200 is not of type 'string'".
        return error.json_path, f"{error.instance!r} is not {error.schema['patternMessage']}"
    return error.json_path, error.message


def _is_secret_path(parts: tuple) -> bool:
    return is_secret_key(next((p for p in reversed(parts) if isinstance(p, str)), ""))


def _pattern_message(error: jsonschema.ValidationError) -> str:
    """A pattern's refusal in words: the schema's ``patternMessage`` (what the value is not), never
    the regular expression itself, which tells a reader nothing they can act on."""
    wanted = error.schema.get("patternMessage")
    if wanted:
        return f"{error.instance!r} is not {wanted}"
    described = error.schema.get("description")
    return f"{error.instance!r} is not in the form this setting takes" + (f" ({described})" if described else "")


def _json_path(parts: tuple) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _walk(value: Any, parts: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    yield parts, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, parts + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, parts + (i,))


def _substitute(raw: Any, environ: Mapping[str, str]) -> tuple[Any, dict[tuple, str], list[tuple[str, str]]]:
    """Replace ``${NAME}`` / ``${NAME:-default}``; report unset variables by key path."""
    errors: list[tuple[str, str]] = []
    whole_refs: dict[tuple, str] = {}

    def resolve(value: Any, parts: tuple) -> Any:
        if isinstance(value, dict):
            return {k: resolve(v, parts + (k,)) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v, parts + (i,)) for i, v in enumerate(value)]
        if not isinstance(value, str):
            return value
        whole = _ENV_REF.fullmatch(value)
        if whole:
            whole_refs[parts] = whole["name"]

        def one(m: re.Match[str]) -> str:
            if m["name"] in environ:
                return environ[m["name"]]
            if m["default"] is not None:
                return m["default"]
            errors.append((_json_path(parts), f"environment variable {m['name']} is not set"))
            return ""

        return _ENV_REF.sub(one, value)

    return resolve(raw, ()), whole_refs, errors


def _coerce_env_values(validator: Any, data: Any, whole_refs: Mapping[tuple, str]) -> None:
    """Environment values are strings: turn ``"2525"`` into 2525 where the schema wants a number."""
    for error in _errors(validator, data):
        parts = tuple(error.absolute_path)
        if error.validator != "type" or parts not in whole_refs or not isinstance(error.instance, str):
            continue
        try:
            parsed = yaml.safe_load(error.instance)
        except yaml.YAMLError:
            continue
        wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        if any(validator.is_type(parsed, t) for t in wanted):
            parent = data
            for p in parts[:-1]:
                parent = parent[p]
            parent[parts[-1]] = parsed


def _secrets_written_in_file(raw: Any) -> Iterator[tuple[str, str]]:
    for parts, value in _walk(raw):
        if not parts or not isinstance(value, str) or not value:
            continue
        if "${" in value:
            # A reference, or one mistyped (reported as such: it is not a secret written out).
            yield from _bad_references(parts, value)
            continue
        key = next((p for p in reversed(parts) if isinstance(p, str)), "")
        if is_secret_key(key):
            yield _json_path(parts), f"secrets must not be written in the file: use ${{{secret_env_name(parts)}}}"
        elif parts in (("database", "dsn"), ("database", "direct_dsn")) and redact(value, "dsn") != value:
            yield _json_path(parts), "the DSN holds a password: take it from the environment (${PGPASSWORD} or SENDDOCK_DATABASE_URL)"


# Secrets whose variable has a name of its own, as the docs give it.
_SECRET_ENV_NAMES = {("serve", "admin", "password_hash"): "SENDDOCK_ADMIN_PASSWORD_HASH"}


def secret_env_name(parts: tuple) -> str:
    """The variable a secret at ``parts`` is suggested to come from: SENDDOCK_ and its path,
    as the shipped config names them (unsubscribe.secret: SENDDOCK_UNSUBSCRIBE_SECRET)."""
    named = tuple(p for p in parts if isinstance(p, str))
    return _SECRET_ENV_NAMES.get(named) or "_".join(["SENDDOCK", *(p.upper() for p in named)])


def _bad_references(parts: tuple, value: str) -> Iterator[tuple[str, str]]:
    """Each ``${`` that does not start a whole ``${NAME}`` or ``${NAME:-default}``: left alone it
    would be taken literally (a secret written out, a host named ``${SMTP_HOST``)."""
    start = 0
    while (start := value.find("${", start)) != -1:
        found = _ENV_REF.match(value, start)
        if found is not None:
            start = found.end()
            continue
        end = value.find("}", start)
        if end == -1:
            yield _json_path(parts), "unterminated ${...}: write ${NAME}"
            return
        yield _json_path(parts), (f"{value[start:end + 1]!r} is not a reference to the environment: write ${{NAME}} "
                                  "(letters, digits and _, not starting with a digit)")
        start = end + 1


def _fill_defaults(schema: Mapping[str, Any], instance: Any, root: Mapping[str, Any]) -> None:
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
    if isinstance(instance, list) and "items" in schema:  # a list of mappings: webhooks
        for item in instance:
            _fill_defaults(schema["items"], item, root)
        return
    if not isinstance(instance, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            _fill_defaults(sub, instance[key], root)


def _semantic_errors(data: Mapping[str, Any], transports: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    name = transport_name(data["transport"])
    if name not in transports:
        installed = ", ".join(sorted(transports)) or "none"
        where = "$.transport" if isinstance(data["transport"], str) else "$.transport.name"
        yield where, f"{name!r} is not an installed transport (installed: {installed})"
    heartbeat = parse_duration(data["recovery"]["heartbeat"])
    lease = parse_duration(data["recovery"]["lease"])
    if lease < 3 * heartbeat:
        yield "$.recovery.lease", (
            f"must be at least three heartbeats ({data['recovery']['lease']} < 3 x {data['recovery']['heartbeat']})"
        )
    if heartbeat <= 0:
        yield "$.recovery.heartbeat", "must be longer than 0s"
    breaker = data["breaker"]
    if breaker["early_bounces"] >= breaker["early_window"]:
        yield "$.breaker.early_bounces", (
            f"must be less than breaker.early_window ({breaker['early_bounces']} >= {breaker['early_window']}): "
            "more bounces than results can never happen")
    if parse_duration(breaker["probe_interval"]) > parse_duration(breaker["probe_max_interval"]):
        yield "$.breaker.probe_interval", "must not be longer than breaker.probe_max_interval"
    yield from pacing_problems(data["pacing"], transports)
    if "concurrency" in data and "workers" in data:
        yield "$.workers", "the former name of concurrency: set concurrency alone"
    unsubscribe = data["unsubscribe"]
    if (unsubscribe["url"] or unsubscribe["mailto"]) and not unsubscribe["secret"]:
        yield "$.unsubscribe.secret", "required with unsubscribe.url or unsubscribe.mailto: the links are signed with it"
    serve = data["serve"]
    if bool(serve["tls_cert_file"]) != bool(serve["tls_key_file"]):
        yield "$.serve", "tls_cert_file and tls_key_file go together"
    for where, networks in (("metrics.allow", serve["metrics"]["allow"]), ("trusted_proxies", serve["trusted_proxies"])):
        for i, network in enumerate(networks):
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                yield f"$.serve.{where}[{i}]", f"{network!r} is not an IP address or network (e.g. 10.0.0.0/8)"
    if parse_size(data["bounces"]["max_message_size"]) < 1024:
        yield "$.bounces.max_message_size", (f"must be at least 1KiB ({data['bounces']['max_message_size']!r}): "
                                             "a delivery status notification alone is larger")
    if parse_size(serve["max_body"]) < 1024:
        yield "$.serve.max_body", f"must be at least 1KiB ({serve['max_body']!r}): an SNS notification alone is larger"
    if parse_duration(data["database"]["stuck_after"]) <= 0:
        yield "$.database.stuck_after", "must be longer than 0s"
    for key in ("body_timeout", "header_timeout", "keep_alive_timeout", "sns_certificate_timeout"):
        if parse_duration(serve[key]) <= 0:
            yield f"$.serve.{key}", "must be longer than 0s"
    yield from _admin_problems(serve["admin"])
    yield from webhook_problems(data)


def _admin_problems(admin: Mapping[str, Any] | None) -> Iterator[tuple[str, str]]:
    """The dashboard's account: a hash it can verify (the value itself is never shown: a secret)."""
    from senddock.web.dashboard.passwords import is_password_hash

    if admin is None:
        return
    if not is_password_hash(admin["password_hash"]):
        yield "$.serve.admin.password_hash", ("is not an argon2 password hash ($argon2id$v=19$m=...): make one with "
                                              "`senddock admin hash-password` and pass it from the environment")
    if parse_duration(admin["session_lifetime"]) <= 0:
        yield "$.serve.admin.session_lifetime", "must be longer than 0s"
