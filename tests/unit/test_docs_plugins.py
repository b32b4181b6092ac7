"""docs/plugins.md against the code: every field of the value types with its type, every enum
member, every helper and fixture of senddock.testing."""

from __future__ import annotations

import dataclasses
import enum
import inspect
from pathlib import Path

import pytest

from senddock import outcome, testing

DOC = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text(encoding="utf-8")


def _section(heading: str) -> str:
    """The text under ``## heading`` up to the next such heading; empty when there is none."""
    _, found, rest = DOC.partition(f"\n## {heading}\n")
    return rest.split("\n## ", 1)[0] if found else ""


VALUES = _section("The value types")
TESTING = _section("Testing a plugin")
DATACLASSES = [c for c in vars(outcome).values()
               if inspect.isclass(c) and c.__module__ == outcome.__name__ and dataclasses.is_dataclass(c)]
ENUMS = [c for c in vars(outcome).values()
         if inspect.isclass(c) and c.__module__ == outcome.__name__ and issubclass(c, enum.Enum)]


def _table_after(name: str) -> dict[str, str]:
    """The rows ``| `field` | `type` | meaning |`` of the table that follows the paragraph about ``name``."""
    blocks = VALUES.split("\n\n")
    start = next((i for i, b in enumerate(blocks) if b.startswith(f"`{name}`")), None)
    assert start is not None, f"docs/plugins.md's value types have no paragraph starting with `{name}`"
    table = next(b for b in blocks[start + 1:] if b.startswith("| field |"))
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.replace("\\|", "\0").strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1].strip("`").replace("\0", "|")
    return rows


@pytest.mark.parametrize("cls", DATACLASSES, ids=lambda c: c.__name__)
def test_every_field_of_a_value_type_is_documented_with_its_type(cls):
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    assert _table_after(cls.__name__) == fields


@pytest.mark.parametrize("cls", ENUMS, ids=lambda c: c.__name__)
def test_every_member_of_an_enum_is_documented_with_its_value(cls):
    for member in cls:
        assert f'`{member.name}` (`"{member.value}"`' in VALUES, f"{cls.__name__}.{member.name}"


def test_the_protocols_and_the_suppression_reasons_are_documented():
    for name in ("MessageSigner", "SuppressionList", "PluginConfig", "EventError", "SUPPRESSION_REASONS"):
        assert f"`{name}`" in VALUES, name
    assert all(f"`{reason}`" in VALUES for reason in outcome.SUPPRESSION_REASONS)


def test_every_helper_and_fixture_of_senddock_testing_is_documented():
    ours = {name: value for name, value in vars(testing).items() if not name.startswith("_")
            and getattr(getattr(value, "_fixture_function", value), "__module__", None) == testing.__name__}
    fixtures = {name for name, value in ours.items() if hasattr(value, "_fixture_function_marker")}
    helpers = {name for name, value in ours.items() if inspect.isfunction(value)}
    # Fixtures the fixtures below are built on: not for a plugin's tests.
    assert fixtures - {"template_database", "database_pool"} == {
        "postgres_server_dsn", "database_dsn", "make_config", "senddock_app", "smtp_sink", "own_server"}
    for name in fixtures - {"template_database", "database_pool"}:
        assert f"| `{name}` |" in TESTING, f"docs/plugins.md's testing section has no row for the fixture {name}"
    assert helpers, "no helper found: the test would pass on nothing"
    for name in helpers:
        assert f"| `{name}(" in TESTING, f"docs/plugins.md's testing section has no row for {name}"
        row = TESTING.split(f"| `{name}(", 1)[1].split("\n", 1)[0]
        for parameter in inspect.signature(ours[name]).parameters.values():
            shown = parameter.name if parameter.default is inspect.Parameter.empty else f"{parameter.name}="
            assert shown in row, f"{name}'s row does not show its parameter {parameter.name}"
