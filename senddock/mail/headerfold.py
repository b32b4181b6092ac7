"""Header lines as receivers read them: folded under 78 characters, encoded-words of at most 75,
and structured headers (List-Unsubscribe, List-Id, Message-ID...) never encoded.

Why not the ``email`` package's folder: on Python 3.11 it writes encoded-words of 76-77
characters (RFC 2047 section 2 caps them at 75), and a structured header that does not fit on one
line is made an encoded-word, so ``List-Unsubscribe: <https://...>`` went out as
``=?utf-8?q?=3Chttps=3A...?=``, a header with no URI in it. RFC 2369 and RFC 5322 section 3.2.2
allow folding only at whitespace in such headers; an encoded-word is text, never a URI or an id.

:data:`POLICY` is the ``email`` package's SMTP policy with its ``fold`` replaced for the headers
senddock writes: Subject (RFC 2047 where a word is not ASCII), From/To/Reply-To (display names as
atoms, a quoted-string or encoded-words), List-Id (its phrase likewise) and every other header that
is ASCII (folded at its whitespace, left long where it has none, as RFC 5322 section 2.1.1
allows up to 998). MIME headers (Content-*) stay the ``email`` package's.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Iterable
from email.headerregistry import HeaderRegistry, MessageIDHeader, UniqueAddressHeader, UnstructuredHeader
from email.policy import EmailPolicy
from typing import Any

LIMIT = 78  # RFC 5322 2.1.1: a line SHOULD be at most 78 characters
MAX_ENCODED_WORD = 75  # RFC 2047 2
_PREFIX_Q, _PREFIX_B, _SUFFIX = "=?utf-8?q?", "=?utf-8?b?", "?="
_OVERHEAD = len(_PREFIX_Q) + len(_SUFFIX)
# Q encoding leaves only these bytes as they are: RFC 2047 5(3)'s set, safe in a phrase too.
_Q_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!*+-/")
_Q_BYTE = {b: chr(b) if b in _Q_SAFE else "_" if b == 0x20 else f"={b:02X}" for b in range(256)}
_WORDS = re.compile(r"([ \t]*)([^ \t]+)")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")
# RFC 5322 atext: a display name of these words (and single spaces) needs no quotes.
_ATOMS = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+( [A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
_LIST_ID = re.compile(r'"((?:[^"\\]|\\.)*)" (<[^<>]*>)')
_ADDRESS_HEADERS = frozenset({"from", "to", "cc", "reply-to", "sender"})


def printable_ascii(text: str) -> bool:
    """Whether ``text`` is printable ASCII alone (no tab): such a value is never encoded."""
    return _PRINTABLE.fullmatch(text) is not None


def _q_length(text: str) -> int:
    return sum(1 if b in _Q_SAFE or b == 0x20 else 3 for b in text.encode("utf-8"))


def _b_length(text: str) -> int:
    return 4 * -(-len(text.encode("utf-8")) // 3)


def _encode(text: str, q: bool) -> str:
    data = text.encode("utf-8")
    if q:
        return _PREFIX_Q + "".join(_Q_BYTE[b] for b in data) + _SUFFIX
    return _PREFIX_B + base64.b64encode(data).decode("ascii") + _SUFFIX


def _fits(text: str, room: int, q: bool) -> int:
    """How many characters of ``text`` one encoded-word of at most ``room`` characters holds.

    Whole code points only: each encoded-word must decode on its own (RFC 2047 5)."""
    used = nbytes = 0
    for count, char in enumerate(text):
        if q:
            used += _q_length(char)
        else:
            nbytes += len(char.encode("utf-8"))
            used = 4 * -(-nbytes // 3)
        if _OVERHEAD + used > room:
            return count
    return len(text)


def _quoted(text: str) -> str:
    """An RFC 5322 quoted-string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Lines:
    """Lays out a header's words, breaking the line before the whitespace ahead of a word."""

    def __init__(self, name: str) -> None:
        self.done: list[str] = []
        self.line = name + ":"
        self.fresh = True  # nothing on this line yet but the name or the fold's whitespace

    def _break(self) -> None:
        self.done.append(self.line)
        self.line, self.fresh = "", True

    def word(self, space: str, word: str) -> None:
        if not self.fresh and len(self.line) + len(space) + len(word) > LIMIT:
            self._break()
        self.line += space + word
        self.fresh = False

    def encoded(self, space: str, text: str) -> None:
        """``text`` as encoded-words sized to the room left on each line; the whitespace between
        two of them is not part of the decoded text (RFC 2047 6.2), so the whole run decodes back."""
        q = _q_length(text) <= _b_length(text)
        while text:
            room = min(MAX_ENCODED_WORD, LIMIT - len(self.line) - len(space))
            count = _fits(text, room, q)
            # Rather a new line than two encoded-words where one would do: a few decoders
            # (CPython's address parser among them) put a space between two in a display name.
            if count < len(text) and not self.fresh and (
                    count == 0 or _fits(text, min(MAX_ENCODED_WORD, LIMIT - len(space)), q) == len(text)):
                self._break()
                continue
            count = max(count, 1)  # only a header name of 60+ characters leaves no room at all
            self.line += space + _encode(text[:count], q)
            text, space, self.fresh = text[count:], " ", False

    def phrase(self, space: str, name: str, *, quote: bool = False) -> None:
        """A display name (RFC 5322 phrase): atoms, else (or with ``quote``) a quoted-string;
        with words that are not ASCII, those as encoded-words and the others as they are."""
        words = _WORDS.findall(name)
        if _PRINTABLE.fullmatch(name) and "=?" not in name:
            if quote or not _ATOMS.fullmatch(name):
                words = _WORDS.findall(_quoted(name))
            if all(len(w) < LIMIT - 1 for _, w in words):
                for i, (ws, w) in enumerate(words):  # folding inside a quoted-string is allowed (FWS)
                    self.word(space if i == 0 else ws, w)
                return
        elif name == " ".join(w for _, w in words):  # single spaces: receivers keep those between words
            for i, (ws, w, encode) in enumerate(_runs(words, LIMIT - 3)):
                ws = space if i == 0 else ws
                if encode:
                    self.encoded(ws, w)
                else:
                    self.word(ws, w if _ATOMS.fullmatch(w) else _quoted(w))
            return
        self.encoded(space, name)  # odd spacing, or a word too long to fold: encoded-words keep it

    def text(self) -> str:
        return "\r\n".join([*self.done, self.line]) + "\r\n"


def _needs_encoding(word: str, room: int) -> bool:
    """Not printable ASCII, mistakable for an encoded-word, or too long to fold (one encoded can)."""
    return not _PRINTABLE.fullmatch(word) or "=?" in word or len(word) > room


def _runs(words: list[tuple[str, str]], room: int, first_room: int | None = None) -> list[tuple[str, str, bool]]:
    """(whitespace before, text, encode?) with neighbouring words to encode made one run: the
    whitespace between two encoded-words is dropped by decoders (RFC 2047 6.2), so the whitespace
    between such words must be encoded with them."""
    runs: list[tuple[str, str, bool]] = []
    for i, (ws, w) in enumerate(words):
        encode = _needs_encoding(w, first_room if i == 0 and first_room is not None else room)
        if encode and runs and runs[-1][2]:
            runs[-1] = (runs[-1][0], runs[-1][1] + ws + w, True)
        else:
            runs.append((ws, w, encode))
    return runs


def fold_unstructured(name: str, value: str) -> str:
    """Subject and the like: ASCII words as they are; runs of words that are not ASCII (or look
    like an encoded-word, or are too long to fold) as encoded-words."""
    lines = _Lines(name)
    for i, (ws, w, encode) in enumerate(_runs(_WORDS.findall(value), LIMIT - 1, LIMIT - len(name) - 2)):
        space = (ws or " ") if i == 0 else ws
        if encode:
            lines.encoded(space, w)
        else:
            lines.word(space, w)
    if lines.fresh:
        lines.line += " "  # an empty subject
    return lines.text()


def fold_addresses(name: str, addresses: Iterable[Any]) -> str:
    """``Display Name <addr-spec>`` for each address, comma separated."""
    lines = _Lines(name)
    addresses = list(addresses)
    for i, address in enumerate(addresses):
        comma = "," if i + 1 < len(addresses) else ""
        if address.display_name:
            lines.phrase(" ", address.display_name)
            lines.word(" ", f"<{address.addr_spec}>{comma}")
        else:
            lines.word(" ", address.addr_spec + comma)
    return lines.text()


def fold_structured(name: str, value: str) -> str:
    """An ASCII header folded only at its own whitespace: RFC 2369's ``<uri>, <uri>`` lists fold
    between entries, ids and URIs stay whole."""
    lines = _Lines(name)
    match = _LIST_ID.fullmatch(value) if name.lower() == "list-id" else None
    if match:  # RFC 2919: a phrase (encoded where needed) and the list's id
        lines.phrase(" ", re.sub(r"\\(.)", r"\1", match[1]), quote=True)
        lines.word(" ", match[2])
        return lines.text()
    for i, (ws, w) in enumerate(_WORDS.findall(value)):
        lines.word((ws or " ") if i == 0 else ws, w)
    return lines.text()


def fold(name: str, value: Any) -> str | None:
    """The header's lines (CRLF ended), or None where the ``email`` package's folding is kept."""
    lower = name.lower()
    if lower.startswith("content-"):
        return None
    if lower in _ADDRESS_HEADERS:
        groups = getattr(value, "groups", ())
        if not groups or any(g.display_name is not None for g in groups) \
                or not all(a.addr_spec.isascii() for a in value.addresses):
            # Groups, or a local part that needs SMTPUTF8: nothing senddock sends (the SMTP
            # transport refuses the latter per job), left to the email package.
            return None
        return fold_addresses(name, value.addresses)
    text = str(value)
    if lower == "subject":
        return fold_unstructured(name, text)
    if _PRINTABLE.fullmatch(text.replace("\t", " ")):
        return fold_structured(name, text)
    if lower == "list-id" and _LIST_ID.fullmatch(text):
        return fold_structured(name, text)  # a list name that is not ASCII: its phrase is encoded
    return None


class _ParsedWhenFolded:
    """A header whose value is printable ASCII is written by :func:`fold` from its text alone, so
    the ``email`` package's parse of it (a Message-ID's was a quarter of a sender's CPU at
    concurrency 200: its parser, then a walk of the tree for defects) waits until that package
    folds it, which for such a value it never does."""

    @classmethod
    def parse(cls, value: Any, kwds: dict[str, Any]) -> None:
        if isinstance(value, str) and _PRINTABLE.fullmatch(value):
            kwds["parse_tree"] = None
            kwds["decoded"] = value
            return
        super().parse(value, kwds)  # type: ignore[misc]  # the header class this is mixed into

    def fold(self, *, policy: Any) -> str:
        if self._parse_tree is None:  # type: ignore[has-type]
            self._parse_tree = self.value_parser(str(self))  # type: ignore[attr-defined]
        return super().fold(policy=policy)  # type: ignore[misc]


class _Verbatim(_ParsedWhenFolded, UnstructuredHeader):
    """A header value kept as given: the ``email`` package decodes whatever looks like an
    encoded-word when a header is set, so a subject reading ``=?utf-8?q?x?=`` would become ``x``."""

    @classmethod
    def parse(cls, value: str, kwds: dict[str, Any]) -> None:
        super().parse(value, kwds)
        kwds["decoded"] = value


class _MessageID(_ParsedWhenFolded, MessageIDHeader):
    """Message-ID (unique, as the ``email`` package's): senddock writes it as ``<local@domain>``."""


class _UniqueVerbatim(_Verbatim):
    max_count = 1


class _AddressHeader(UniqueAddressHeader):
    """From, To, Reply-To. Given Address objects (as build_email sets them), the ``email`` package
    writes their text and parses it back only for its own folder, which :func:`fold` replaces for
    every header senddock writes: that parse (most of the cost of a To) waits until it is needed."""

    @classmethod
    def parse(cls, value: Any, kwds: dict[str, Any]) -> None:
        if isinstance(value, str):
            super().parse(value, kwds)
            return
        kwds["parse_tree"] = None  # AddressHeader.parse leaves a parse tree it finds alone
        super().parse(value, kwds)
        kwds["unparsed"] = kwds["decoded"]

    def init(self, *args: Any, unparsed: str | None = None, **kwargs: Any) -> None:
        self._unparsed = unparsed
        super().init(*args, **kwargs)

    def fold(self, *, policy: Any) -> str:
        if self._parse_tree is None:
            self._parse_tree = self.value_parser(self._unparsed)
        return super().fold(policy=policy)


class FoldingPolicy(EmailPolicy):
    """``policy.SMTP`` (CRLF, 78 columns) whose header folding is :func:`fold`'s."""

    def fold(self, name: str, value: Any) -> str:
        return fold(name, value) or super().fold(name, value)

    def fold_binary(self, name: str, value: Any) -> bytes:
        # A header object the registry shares between messages (see _ClassCachingRegistry) is
        # folded once per policy and name: the folding depends on nothing else. "Policy" by its
        # settings, not its identity: the generator clones the policy for every part of a
        # multipart message (the parts' Content-Type was folded again for every message). Read
        # afresh each time: clone() copies an instance's cached attributes too.
        key = (type(self), self.linesep, self.max_line_length, self.utf8, self.refold_source, self.cte_type,
               self.header_factory, name)
        memo = getattr(value, "_senddock_folded", None)
        if memo is not None and memo[0] == key:
            return memo[1]
        folded = fold(name, value)
        data = folded.encode("ascii") if folded is not None else super().fold_binary(name, value)
        if hasattr(value, "_defects"):  # a header object (a plain str takes no attributes)
            value._senddock_folded = (key, data)
        return data


class _ClassCachingRegistry(HeaderRegistry):
    """The ``email`` package's registry builds a new header class with ``type()`` for every header
    set; a message has a dozen, and that was a tenth of a sender's CPU. The class depends on the
    name alone, so each is built once.

    Parsing a header's text is most of the rest (Content-Type alone ~50 us), and most headers of a
    campaign's messages repeat (From, Subject, Content-Type, MIME-Version, List-Id, Date within a
    second...): a header object is immutable, so one built from a given name and text is shared by
    every message that sets the same (a small LRU: the headers unique to each message, such as To
    and Message-ID, only pass through it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._built: dict[str, type] = {}
        self._parsed = functools.lru_cache(maxsize=256)(self._parse)

    def map_to_type(self, name: str, cls: type) -> None:
        super().map_to_type(name, cls)
        self._built.clear()
        self._parsed.cache_clear()

    def _parse(self, name: str, value: str) -> Any:
        return super().__call__(name, value)

    def __call__(self, name: str, value: Any) -> Any:
        if type(value) is str:  # noqa: E721 - not a header object or an Address: those are built as given
            return self._parsed(name, value)
        return super().__call__(name, value)

    def __getitem__(self, name: str) -> type:
        key = name.lower()
        built = self._built.get(key)
        if built is None:
            built = self._built[key] = super().__getitem__(name)
        return built


def _header_factory() -> HeaderRegistry:
    registry = _ClassCachingRegistry(default_class=_Verbatim)  # List-*, Feedback-ID, X-*
    registry.map_to_type("subject", _UniqueVerbatim)
    registry.map_to_type("message-id", _MessageID)
    for name in ("from", "to", "reply-to"):
        registry.map_to_type(name, _AddressHeader)
    return registry


POLICY = FoldingPolicy(linesep="\r\n", header_factory=_header_factory())  # linesep: as policy.SMTP
