"""The text of a CSV file in a named encoding, line by line, for ``csv.reader``.

Decoded here rather than by ``io.TextIOWrapper``, which decodes ahead in 8 KiB blocks: a byte that
does not decode is then reported on the line the reader had reached (line 1 for a bad byte on
line 2). Lines end as ``open(newline="")`` would end them (``\\r\\n``, ``\\r`` or ``\\n``, kept),
which is what the csv module expects; a byte order mark at the start is dropped.

An encoding may name a fallback for the lines that are not in it: ``utf-8,cp1252`` reads every
line as UTF-8 and only a line that is not UTF-8 as cp1252, and says which lines those were. That
is what a UTF-8 export with one line pasted from an old Windows program needs; reading the whole
file as cp1252 would turn every other accented name into mojibake (``ZoÃ«``), so the error for a
line that is not UTF-8 suggests cp1252 alone only when no line of the file is UTF-8 beyond ASCII.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable, Iterator
from typing import BinaryIO

from senddock.errors import InvalidInput

DEFAULT_ENCODING = "utf-8"
# A line and its end; a lone \r at the very end of the text decoded so far may yet be a \r\n.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r(?=.)|\n)", re.DOTALL)
_EXAMPLES = "e.g. utf-8, cp1252, latin-1, utf-16"
SHOWN_LINES = 5  # lines named in a hint or a note; more are counted


def check_encoding(name: str) -> str:
    """``name`` (one encoding, or ``PRIMARY,FALLBACK``) if Python can decode text with it;
    ValueError saying why not."""
    parts = [p.strip() for p in name.split(",")]
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"{name!r}: one encoding, or one and a fallback for the lines not in it (utf-8,cp1252)")
    for part in parts:
        _text_codec(part)
    if len(parts) == 2 and not all(_ascii_compatible(p) for p in parts):
        # Line by line works only where a line end is the byte 0x0a in both.
        raise ValueError(f"{name!r}: a fallback works line by line, between encodings that write ASCII as ASCII "
                         f"(not {next(p for p in parts if not _ascii_compatible(p))})")
    return name


def decoded_lines(raw: BinaryIO, encoding: str, label: str,
                  on_fallback: Callable[[int], None] = lambda line: None) -> Iterator[str]:
    """The lines of ``raw`` decoded from ``encoding``; a byte that does not decode is InvalidInput
    ``LABEL:LINE: not ENCODING text, ...`` on the line that holds it. With a fallback
    (``utf-8,cp1252``) such a line is read in the fallback instead, and ``on_fallback(LINE)`` told."""
    primary, _, fallback = encoding.partition(",")
    texts = _by_line(raw, primary.strip(), fallback.strip(), label, on_fallback) if fallback \
        else _incremental(raw, primary.strip(), label)
    lines_done, pending, start = 0, "", True
    for text in texts:
        text = pending + text
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


def _incremental(raw: BinaryIO, encoding: str, label: str) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder(encoding)()
    # Read a line of bytes at a time: in every ASCII-compatible encoding a bad byte is then on the
    # line being decoded. (In UTF-16, a line of bytes is only a piece; the count of lines still holds.)
    lines_read = 0
    for chunk in _chunks(raw):
        try:
            text = decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{label}:{lines_read + 1}: {_not_text(exc, encoding)}{_hint(raw, encoding)}") from None
        lines_read += text.count("\n") + text.count("\r") - text.count("\r\n")
        yield text


def _by_line(raw: BinaryIO, primary: str, fallback: str, label: str,
             on_fallback: Callable[[int], None]) -> Iterator[str]:
    """Each line of bytes (both encodings write a line end as 0x0a) in ``primary``, else ``fallback``."""
    for number, line in enumerate(raw, 1):
        try:
            yield line.decode(primary)
        except UnicodeDecodeError:
            try:
                text = line.decode(fallback)
            except UnicodeDecodeError as exc:
                raise InvalidInput(f"{label}:{number}: neither {primary} nor {fallback} text, "
                                   f"{_not_text(exc, fallback, named=False)}") from None
            on_fallback(number)
            yield text


def _chunks(raw: BinaryIO) -> Iterator[bytes]:
    yield from raw
    yield b""  # the end: the decoder is told, so a sequence cut short there is reported


def _not_text(exc: UnicodeDecodeError, encoding: str, *, named: bool = True) -> str:
    bad = exc.object[exc.start:exc.end]
    shown = " ".join(f"0x{b:02x}" for b in bad[:4])
    what = f"not {'UTF-8' if _is_utf8(encoding) else encoding} text, " if named else ""
    return f"{what}{'byte' if len(bad) == 1 else 'bytes'} {shown}: {exc.reason}"


def _hint(raw: BinaryIO, encoding: str) -> str:
    """What reads the file, checked on the file itself when it can be read again: cp1252 alone only
    when no line is UTF-8 beyond ASCII (it would misread those), else the fallback line by line."""
    if not _is_utf8(encoding):
        return ""
    per_line = "{=encoding} utf-8,cp1252 reads each line that is not UTF-8 as cp1252 and names it"
    try:
        raw.seek(0)
    except (OSError, ValueError):  # a pipe: it cannot be read again to look
        return f" (if only some lines are cp1252: {per_line})"
    utf8_beyond_ascii, not_utf8, whole_cp1252 = 0, [], True
    for number, line in enumerate(raw, 1):
        try:
            line.decode("utf-8")
            utf8_beyond_ascii += not line.isascii()
        except UnicodeDecodeError:
            not_utf8.append(number)
            try:
                line.decode("cp1252")
            except UnicodeDecodeError:
                whole_cp1252 = False
    if not utf8_beyond_ascii:
        return " (try {=encoding} cp1252)" if whole_cp1252 else " (try {=encoding} latin-1)"
    shown = ", ".join(map(str, not_utf8[:SHOWN_LINES])) + (", ..." if len(not_utf8) > SHOWN_LINES else "")
    return (f" ({len(not_utf8)} of its lines are not UTF-8 (line {shown}) while {utf8_beyond_ascii} are UTF-8 "
            f"text that cp1252 would misread: fix those lines, or {per_line})")


def _text_codec(name: str) -> codecs.CodecInfo:
    try:
        info = codecs.lookup(name)
    except LookupError:
        raise ValueError(f"unknown encoding {name!r} ({_EXAMPLES})") from None
    if not getattr(info, "_is_text_encoding", True):  # base64, rot13, zlib...: not a character set
        raise ValueError(f"{name!r} is not a text encoding ({_EXAMPLES})")
    return info


def _ascii_compatible(name: str) -> bool:
    sample = "email,name\r\n"
    try:
        return sample.encode(name) == sample.encode("ascii")
    except (UnicodeError, LookupError):
        return False


def _is_utf8(name: str) -> bool:
    return codecs.lookup(name).name == "utf-8"
