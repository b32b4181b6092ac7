"""Text that ends up in a header line (a subscriber's name and address, a subject): one line, no
control characters.

A line break in a header value ends the header: at best the message cannot be built (the
standard library refuses CR and LF in an address), at worst the rest becomes a header of its own.
Other control characters (NUL, BEL, C1 codes) pass through ``email`` into the message raw.
Imports normalise such text with :func:`one_line`; the engine refuses what is left.
"""

from __future__ import annotations

import re

# What str.splitlines() ends a line at: CR, LF, VT, FF, the file/group/record separators, NEL,
# and the Unicode line and paragraph separators.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# C0 and C1 control characters and DEL (Unicode category Cc), and the two Unicode separators.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_RUN = re.compile(r"[\s\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def problem(text: str | None) -> str | None:
    """``"a line break"``, ``"a control character"``, or None when ``text`` fits on a header line."""
    if not text or not _UNSAFE.search(text):
        return None
    return "a line break" if any(c in LINE_BREAKS for c in text) else "a control character"


def one_line(text: str) -> str:
    """Every run of whitespace and control characters made one space, and the ends stripped."""
    return _RUN.sub(" ", text).strip()
