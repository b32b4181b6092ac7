"""README's console blocks as one story: parse them, run them in order, compare loosely.

Kept apart from the test that runs the story so the parsing and matching rules have fast tests of
their own (tests/unit/test_readme_story.py) and the story test stays about README.

The rules, as README states them above its first block:
- ``$ `` starts a command; a line ending in ``\\`` continues it (bash reads the continuation itself).
- The lines up to the next command are what the command prints on stdout (log lines go to stderr).
- A line ``...`` stands for any number of lines, ``...`` inside a line for any text; every number
  matches any number (ids, counts, times and rates differ from run to run); runs of spaces are one.
- A command shown with no output only has to exit 0; every command has to exit 0.
- A command ending in ``&`` runs in the background until the story ends.
- ``<!-- readme-test: skip ... -->`` just before a block leaves the block out (another setup, a
  terminal-only view, a run of minutes), with the reason said in README's prose as well.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SKIP_MARKER = re.compile(r"<!--\s*readme-test:\s*skip\b")
_BACKGROUND = re.compile(r"(?<![&|])&\s*(#.*)?$")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


@dataclass
class Command:
    line: int                      # README line of the `$ `
    text: str                      # the command as bash gets it (continuations kept)
    expected: list[tuple[int, str]] = field(default_factory=list)  # (README line, text)

    @property
    def background(self) -> bool:
        return bool(_BACKGROUND.search(self.text))

    def foreground_text(self) -> str:
        """The command without its trailing ``&`` (the runner puts it in the background itself)."""
        return _BACKGROUND.sub("", self.text).rstrip()

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0]


@dataclass
class Block:
    line: int                      # README line of the opening fence
    skipped: bool
    commands: list[Command]


def console_blocks(readme: str) -> list[Block]:
    """Every ```console block of README, with its commands and their expected output."""
    lines = readme.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```console":
            i += 1
            continue
        fence = i
        previous = next((lines[j] for j in range(fence - 1, -1, -1) if lines[j].strip()), "")
        i += 1
        commands: list[Command] = []
        while i < len(lines) and lines[i].strip() != "```":
            text = lines[i]
            if text.startswith("$ "):
                command = Command(i + 1, text[2:])
                while command.text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command.text += "\n" + lines[i]
                commands.append(command)
            elif commands:
                commands[-1].expected.append((i + 1, text))
            else:
                raise ValueError(f"README.md:{i + 1}: output before any `$ ` command in the block at line {fence + 1}")
            i += 1
        for command in commands:  # a blank line before the closing fence is not output
            while command.expected and not command.expected[-1][1].strip():
                command.expected.pop()
        blocks.append(Block(fence + 1, bool(SKIP_MARKER.search(previous)), commands))
        i += 1
    return blocks


def _normalise(text: str) -> str:
    return " ".join(text.split())


def line_pattern(expected: str) -> re.Pattern[str]:
    """One expected line as a regex: ``...`` any text, a number any number, spacing ignored."""
    parts = []
    for piece in re.split(r"(\.\.\.)", _normalise(expected)):
        if piece == "...":
            parts.append(".*")
            continue
        last = 0
        for m in _NUMBER.finditer(piece):
            parts.append(re.escape(piece[last:m.start()]))
            parts.append(_NUMBER.pattern)
            last = m.end()
        parts.append(re.escape(piece[last:]))
    return re.compile("".join(parts))


@dataclass
class Mismatch:
    readme_line: int | None        # the expected line that could not be matched (None: actual has extra lines)
    expected: str | None
    actual: str | None             # the actual line found there (None: actual output ended)


def compare(expected: list[tuple[int, str]], actual: str) -> Mismatch | None:
    """None when ``actual`` matches; else where matching got furthest before it failed."""
    got = [line for line in actual.splitlines()]
    while got and not got[-1].strip():
        got.pop()
    patterns = [None if _normalise(text) == "..." else line_pattern(text) for _, text in expected]
    memo: dict[tuple[int, int], bool] = {}
    furthest = (0, 0)

    def match(e: int, a: int) -> bool:
        nonlocal furthest
        key = (e, a)
        if key in memo:
            return memo[key]
        if (e, a) > furthest:
            furthest = (e, a)
        if e == len(patterns):
            result = a == len(got)
        elif patterns[e] is None:
            result = match(e + 1, a) or (a < len(got) and match(e, a + 1))
        else:
            result = a < len(got) and bool(patterns[e].fullmatch(_normalise(got[a]))) and match(e + 1, a + 1)
        memo[key] = result
        return result

    if match(0, 0):
        return None
    e, a = furthest
    if e < len(expected):
        return Mismatch(expected[e][0], expected[e][1], got[a] if a < len(got) else None)
    return Mismatch(None, None, got[a] if a < len(got) else None)
