"""How commands speak: readable text on a terminal, exactly one JSON object on stdout with --json."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from datetime import datetime
from typing import Any, TextIO

from senddock.wording import plural

__all__ = ["Output", "plural", "table", "to_jsonable"]


def to_jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


class Output:
    """Where a command's result and diagnostics go."""

    def __init__(self, *, json_mode: bool, stdout: TextIO | None = None, stderr: TextIO | None = None):
        self.json_mode = json_mode
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr

    @property
    def interactive(self) -> bool:
        """Progress bars only for a person watching a terminal."""
        return not self.json_mode and self.stderr.isatty()

    def result(self, data: Any, human: Callable[[], str] | str | None = None) -> None:
        """The command's one result: ``data`` as JSON, or the human rendering."""
        if self.json_mode:
            self.stdout.write(json.dumps(to_jsonable(data), sort_keys=False) + "\n")
        elif human is not None:
            text = human() if callable(human) else human
            if text:
                self.stdout.write(text.rstrip("\n") + "\n")
        self.stdout.flush()

    def problem(self, line: str) -> None:
        """A diagnostic line (a rejected row...): always on stderr, so stdout stays parseable."""
        self.stderr.write(line + "\n")
        self.stderr.flush()

    def error(self, message: str, exit_code: int, errors: Sequence[str] = ()) -> None:
        for line in errors or message.splitlines():
            self.stderr.write(f"senddock: error: {line}\n" if not errors else f"{line}\n")
        if self.json_mode:
            payload = {"ok": False, "error": message.splitlines()[0] if message else "", "exit_code": exit_code}
            if errors:
                payload["errors"] = list(errors)
            self.stdout.write(json.dumps(payload) + "\n")
        self.stderr.flush()
        self.stdout.flush()


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned table (readable on a terminal, greppable in a pipe)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "-"
    return str(value)
