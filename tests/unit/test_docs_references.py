"""Every file and Python name README.md and docs/ point a reader to exists: a module moved or
renamed takes its mentions with it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]  # the checkout: CI tests an installed copy
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_PATH = re.compile(r"(?<![\w/.])senddock/[\w/]+\.(?:py|sql|json)\b")
# A dotted name: senddock.mail.verp.read_token. Not a file name (senddock.yaml) or a version.
_NAME = re.compile(r"(?<![\w/.-])senddock(?:\.[A-Za-z_]\w*)+")
_NOT_NAMES = {"senddock.yaml"}


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_and_name_a_page_gives_exists(page: Path):
    text = page.read_text(encoding="utf-8")
    missing = [m for m in _PATH.findall(text) if not (ROOT / m).exists()]
    missing += [m for m in _NAME.findall(text) if m not in _NOT_NAMES and not _resolves(m)]
    assert missing == []
