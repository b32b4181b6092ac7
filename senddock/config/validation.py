"""YAML -> JSON Schema validation (as written) -> environment secrets -> validation again -> checks.

Every problem is collected and reported as ``FILE::$.json.path: message``; unknown keys are errors at
every level, so a typo never falls back silently to a default.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from senddock.config import checks
from senddock.config.environment import (ENV_DATABASE_URL, coerce_env_values, errors_in, json_path,
                                         secrets_written_in_file, substitute)
from senddock.config.schema import _not_a_duration, _validator_class
from senddock.errors import ConfigError
from senddock.redact import MASK, is_secret_key

# Errors that a value written as ${ENV} may legitimately raise before it is substituted.
_DEFERRED_VALIDATORS = {"type", "enum", "const", "duration", "size", "pattern", "minLength", "maxLength", "anyOf", "oneOf"}


# jsonschema takes ~50 ms to import: loaded by the first load_config, not by importing this module
# (the CLI imports it to parse argv, and `senddock --help` loads no config).
if TYPE_CHECKING:
    import jsonschema



def validate(raw: Any, schema: dict[str, Any], *, label: str, environ: Mapping[str, str],
             transports: Mapping[str, str], earlier: Sequence[str] = (),
             more_problems: Callable[[Mapping[str, Any]], Iterable[tuple[str, str]]] | None = None) -> dict[str, Any]:
    """``raw`` (a file's mapping) checked against ``schema``, the environment substituted, defaults
    filled in and every registered check run, then ``more_problems`` (the plugins' own checks).
    Raises :class:`ConfigError` listing every problem, ``earlier`` ones first (the plugins')."""
    validator = _validator_class()(schema)
    # 1. As written: a value such as ${SMTP_PORT} stands in for whatever the environment gives.
    problems = [_describe(e) for e in errors_in(validator, raw) if not _is_deferred(e)]
    problems += list(secrets_written_in_file(raw))
    data, whole_refs, env_errors = substitute(raw, environ)
    problems += env_errors
    errors = [*earlier, *(f"{label}::{p}: {m}" for p, m in sorted(problems))]
    if errors:
        raise ConfigError(errors)

    # 2. With the environment substituted, validated again (so `port: ${SMTP_PORT}` must be an integer).
    if environ.get(ENV_DATABASE_URL):
        data.setdefault("database", {})["dsn"] = environ[ENV_DATABASE_URL]
    coerce_env_values(validator, data, whole_refs)
    errors = [f"{label}::{p}: {_env_message(e, whole_refs, m)}" for e in errors_in(validator, data)
              for p, m in [_describe(e)]]
    if errors:
        raise ConfigError(errors)

    _fill_defaults(schema, data, schema)
    found = [*checks.problems(data, transports), *(more_problems(data) if more_problems else ())]
    errors = [f"{label}::{p}: {m}" for p, m in found]
    if errors:
        raise ConfigError(errors)
    return data


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
            return json_path(tuple(error.absolute_path) + (key,)), f"unknown key {key!r}{hint}"
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


