"""Secrets and other values from the environment: ``${NAME}`` and ``${NAME:-default}`` in the file,
never a secret written out."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from senddock.redact import is_secret_key, redact

ENV_CONFIG = "SENDDOCK_CONFIG"
ENV_DATABASE_URL = "SENDDOCK_DATABASE_URL"

_ENV_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


def json_path(parts: tuple) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def walk(value: Any, parts: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    yield parts, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, parts + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, parts + (i,))


def substitute(raw: Any, environ: Mapping[str, str]) -> tuple[Any, dict[tuple, str], list[tuple[str, str]]]:
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
            errors.append((json_path(parts), f"environment variable {m['name']} is not set"))
            return ""

        return _ENV_REF.sub(one, value)

    return resolve(raw, ()), whole_refs, errors



def coerce_env_values(validator: Any, data: Any, whole_refs: Mapping[tuple, str]) -> None:
    """Environment values are strings: turn ``"2525"`` into 2525 where the schema wants a number."""
    for error in errors_in(validator, data):
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



def secrets_written_in_file(raw: Any) -> Iterator[tuple[str, str]]:
    for parts, value in walk(raw):
        if not parts or not isinstance(value, str) or not value:
            continue
        if "${" in value:
            # A reference, or one mistyped (reported as such: it is not a secret written out).
            yield from _bad_references(parts, value)
            continue
        key = next((p for p in reversed(parts) if isinstance(p, str)), "")
        if is_secret_key(key):
            yield json_path(parts), f"secrets must not be written in the file: use ${{{secret_env_name(parts)}}}"
        elif parts in (("database", "dsn"), ("database", "direct_dsn")) and redact(value, "dsn") != value:
            yield json_path(parts), "the DSN holds a password: take it from the environment (${PGPASSWORD} or SENDDOCK_DATABASE_URL)"


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
            yield json_path(parts), "unterminated ${...}: write ${NAME}"
            return
        yield json_path(parts), (f"{value[start:end + 1]!r} is not a reference to the environment: write ${{NAME}} "
                                  "(letters, digits and _, not starting with a digit)")
        start = end + 1




def errors_in(validator: Any, instance: Any) -> list[Any]:
    """Every jsonschema error of ``instance``, in a stable order (by path, then message)."""
    return sorted(validator.iter_errors(instance), key=lambda e: (list(map(str, e.absolute_path)), e.message))
