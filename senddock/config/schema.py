"""The config's JSON Schema (schema.json) and senddock's own keywords: ``duration`` and ``size``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any

from senddock.durations import is_duration
from senddock.sizes import is_size


def _duration_keyword(validator: Any, enabled: bool | str, instance: Any, schema: Mapping) -> Iterator[Any]:
    """``"duration": true``; ``"duration": "or forever"`` also takes the word ``forever``."""
    if not enabled or not isinstance(instance, str) or is_duration(instance):
        return
    if enabled == "or forever" and instance == "forever":
        return
    from jsonschema import ValidationError

    message = _not_a_duration(instance)
    yield ValidationError(message + (", or forever" if enabled == "or forever" else ""))


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
    text = resources.files("senddock.config").joinpath("schema.json").read_text(encoding="utf-8")
    return json.loads(text)
