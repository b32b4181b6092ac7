"""The messages of the paths given to ``bounces parse`` and ``bounces ingest``: an .eml file, a
Maildir folder (its ``new/`` and ``cur/``) or an mbox file.

Each message comes with its source (``PATH``, or ``PATH#N`` for the N-th message of a folder or an
mbox, counted from 1) and, for a Maildir, a way to file it under ``cur/`` once applied.
"""

from __future__ import annotations

import mailbox
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


class SourceError(ValueError):
    """A path that is no message, folder or mbox: the message says why."""


@dataclass
class SourceMail:
    source: str
    raw: bytes
    done: Callable[[], None] | None = None  # files the message as read (a Maildir's cur/)


def read_paths(paths: list[str], max_size: int, *, read_too: bool = True) -> Iterator[SourceMail | SourceError]:
    """Every message of every path, in order; a path that cannot be read yields its SourceError
    (and the others are still read). A message over ``max_size`` bytes comes cut at max_size + 1:
    enough to say it is too large without holding it. ``read_too``: a Maildir's ``cur/`` as well
    as its ``new/`` (ingest reads ``new/`` alone: what it filed under ``cur/`` is done)."""
    for path in paths:
        try:
            yield from _read(Path(path), path, max_size, read_too)
        except SourceError as exc:
            yield exc
        except OSError as exc:
            yield SourceError(f"{path}: {exc.strerror or exc}")


def _read(path: Path, label: str, max_size: int, read_too: bool) -> Iterator[SourceMail]:
    if path.is_dir():
        if not all((path / sub).is_dir() for sub in ("cur", "new", "tmp")):
            raise SourceError(f"{label}: a folder that is no Maildir (it needs cur/, new/ and tmp/)")
        yield from _maildir(path, label, max_size, read_too)
    elif not path.exists():
        raise SourceError(f"{label}: no such file or folder")
    elif _is_mbox(path):
        yield from _mbox(path, label, max_size)
    else:
        yield SourceMail(label, _head(path, max_size))


def _head(path: Path, max_size: int) -> bytes:
    with path.open("rb") as file:
        return file.read(max_size + 1)


def _is_mbox(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(5) == b"From "


def _maildir(path: Path, label: str, max_size: int, read_too: bool) -> Iterator[SourceMail]:
    # Maildir (maildir(5)): one file per message, delivered into new/; a reader that has seen one
    # renames it into cur/ with an info suffix. Names start with the delivery time: in name order,
    # the same numbering every run.
    folders = ("new", "cur") if read_too else ("new",)
    files = [path / folder / name for folder in folders
             for name in sorted(os.listdir(path / folder)) if not name.startswith(".")]
    for n, file in enumerate(files, 1):
        yield SourceMail(f"{label}#{n}", _head(file, max_size),
                         done=_filer(file) if file.parent.name == "new" else None)


def _filer(file: Path) -> Callable[[], None]:
    def done() -> None:
        # A rename: the message's bytes stay as delivered. ":2,S": seen (maildir(5)).
        os.rename(file, file.parent.parent / "cur" / f"{file.name}:2,S")
    return done


def _mbox(path: Path, label: str, max_size: int) -> Iterator[SourceMail]:
    box = mailbox.mbox(path, create=False)
    try:
        for n, key in enumerate(box.iterkeys(), 1):
            data = box.get_bytes(key)
            yield SourceMail(f"{label}#{n}", data[:max_size + 1])
    finally:
        box.close()
