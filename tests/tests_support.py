"""Helpers shared by test modules (conftest holds the fixtures)."""

from __future__ import annotations

import sys
from pathlib import Path


def senddock_executable() -> str:
    """The installed console script next to this interpreter."""
    candidate = Path(sys.executable).with_name("senddock")
    return str(candidate) if candidate.exists() else "senddock"
