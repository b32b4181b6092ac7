"""Cells of the CSV files senddock writes, safe to open in a spreadsheet.

A spreadsheet program evaluates a cell that starts with ``=``, ``+``, ``-`` or ``@`` (and a tab or
carriage return before one) as a formula: ``=HYPERLINK(...)`` in a bounce's diagnostic, an address
``=cmd|calc!A1@example.com`` that an import accepted. Such a cell is written with a ``'`` before
it, as OWASP's "CSV Injection" advises: shown as text, read back by a person as it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """``value`` as a CSV cell: text that a spreadsheet would run as a formula gets a leading ``'``."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def csv_row(values: Iterable[Any]) -> list[Any]:
    return [csv_cell(v) for v in values]
