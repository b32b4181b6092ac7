"""The text of a CSV file in a named encoding, line by line, for ``csv.reader``.

Decoded here rather than by ``io.TextIOWrapper``, which decodes ahead in 8 KiB blocks: a byte that
does not decode is then reported on the line the reader had reached (line 1 for a bad byte on
line 2). Lines end as ``open(newline="")`` would end them (``\\r\\n``, ``\\r`` or ``\\n``, kept),
which is what the csv module expects; a byte order mark at the start is dropped.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import BinaryIO

from senddock.errors import InvalidInput

DEFAULT_ENCODING = "utf-8"
# A line and its end; a lone \r at the very end of the text decoded so far may yet be a \r\n.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r(?=.)|\n)", re.DOTALL)


def check_encoding(name: str) -> str:
    """``name`` if Python can decode text with it; ValueError saying why not."""
    try:
        info = codecs.lookup(name)
    except LookupError:
        raise ValueError(f"unknown encoding {name!r} (e.g. utf-8, cp1252, latin-1, utf-16)") from None
    if not getattr(info, "_is_text_encoding", True):  # base64, rot13, zlib...: not a character set
        raise ValueError(f"{name!r} is not a text encoding (e.g. utf-8, cp1252, latin-1, utf-16)")
    return name


def decoded_lines(raw: BinaryIO, encoding: str, label: str) -> Iterator[str]:
    """The lines of ``raw`` decoded from ``encoding``; a byte that does not decode is InvalidInput
    ``LABEL:LINE: not ENCODING text, ...`` on the line that holds it."""
    decoder = codecs.getincrementaldecoder(encoding)()
    lines_done, pending, start = 0, "", True
    # Read a line of bytes at a time: in every ASCII-compatible encoding a bad byte is then on the
    # line being decoded. (In UTF-16, a line of bytes is only a piece; the count of lines still holds.)
    for chunk in _chunks(raw):
        try:
            text = pending + decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{label}:{lines_done + 1}: {_not_text(exc, encoding)}") from None
        if start and text:
            text, start = text.removeprefix("\ufeff"), False
        if text.endswith("\n") and text.find("\n") == len(text) - 1 and text.find("\r") in (-1, len(text) - 2):
            yield text  # the common case, one line whole: no need to look for line ends
            lines_done, pending = lines_done + 1, ""
            continue
        end = 0
        for match in _LINE.finditer(text):
            yield match.group()
            lines_done += 1
            end = match.end()
        pending = text[end:]
    if pending:
        yield pending


def _chunks(raw: BinaryIO) -> Iterator[bytes]:
    yield from raw
    yield b""  # the end: the decoder is told, so a sequence cut short there is reported


def _not_text(exc: UnicodeDecodeError, encoding: str) -> str:
    bad = exc.object[exc.start:exc.end]
    shown = " ".join(f"0x{b:02x}" for b in bad[:4])
    what = f"not {'UTF-8' if codecs.lookup(encoding).name == 'utf-8' else encoding} text"
    hint = " (try --encoding cp1252)" if codecs.lookup(encoding).name == "utf-8" else ""
    return f"{what}, {'byte' if len(bad) == 1 else 'bytes'} {shown}: {exc.reason}{hint}"
