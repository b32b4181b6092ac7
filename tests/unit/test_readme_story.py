"""The rules by which README's console blocks are read and their output compared (tests/readme_story.py)."""

from __future__ import annotations

import pytest

from readme_story import compare, console_blocks

README = """\
# title

```console
$ senddock demo
campaign 1 finished in 4.0s:
  sent        995 of 1000
$ senddock campaign create --name Launch \\
      --text body.txt
1

```

Prose.

<!-- readme-test: skip — another setup -->
```console
$ pytest
```

```python
print("not a console block")
```

```console
$ senddock sink >sink.log &      # in the background
$ a && b
$ senddock run &> run.log
```
"""


def expected(*lines: str) -> list[tuple[int, str]]:
    return [(100 + i, line) for i, line in enumerate(lines)]


def test_blocks_commands_continuations_and_output_with_their_readme_lines():
    blocks = console_blocks(README)
    assert [(b.line, b.skipped, len(b.commands)) for b in blocks] == [(3, False, 2), (16, True, 1), (24, False, 3)]
    demo, create = blocks[0].commands
    assert (demo.line, demo.text) == (4, "senddock demo")
    assert demo.expected == [(5, "campaign 1 finished in 4.0s:"), (6, "  sent        995 of 1000")]
    assert create.line == 7 and create.text == "senddock campaign create --name Launch \\\n      --text body.txt"
    assert create.expected == [(9, "1")]  # the blank line before the fence is not output


def test_background_commands_are_those_ending_in_a_lone_ampersand():
    sink, both, redirect = console_blocks(README)[2].commands
    assert sink.background and sink.foreground_text() == "senddock sink >sink.log"
    assert not both.background
    assert not redirect.background  # `&>` redirects, it does not background


def test_output_before_any_command_is_refused_with_its_line():
    with pytest.raises(ValueError, match=r"README.md:2: output before any"):
        console_blocks("```console\nstray\n$ true\n```\n")


def test_numbers_spacing_and_inline_ellipsis_are_loose():
    assert compare(expected("campaign 1 finished in 4.0s:", "PENDING  SENT", "887      113"),
                   "campaign 12 finished in 17.25s:\nPENDING SENT\n1887     13\n") is None
    assert compare(expected("imported 3, ... rejected 0"), "imported 3, updated 0, unchanged 0, rejected 0") is None
    assert compare(expected('{"id": 1, ..., "sent": 3, ...}'), '{"id": 2, "a": null, "b": 1, "sent": 3, "x": 4}') is None


def test_an_ellipsis_line_stands_for_any_number_of_lines():
    shown = expected("From: a", "...", "--- text/plain ---", "Hello,", "...")
    assert compare(shown, "From: a\n--- text/plain ---\nHello,\n") is None
    assert compare(shown, "From: a\nTo: b\nDate: now\n--- text/plain ---\nHello,\n\nbye\n") is None


def test_words_must_match_and_the_mismatch_names_the_readme_line():
    mismatch = compare(expected("campaign 2: paused (sends in flight end); now paused: 111 sent"),
                       "campaign 2: paused (sends in flight finish); now paused: 134 sent\n")
    assert mismatch is not None
    assert (mismatch.readme_line, mismatch.actual) == (100, "campaign 2: paused (sends in flight finish); now paused: 134 sent")
    mismatch = compare(expected("a", "...", "c", "d"), "a\nx\nc\ne\n")
    assert (mismatch.readme_line, mismatch.expected, mismatch.actual) == (103, "d", "e")


def test_missing_and_extra_lines_fail():
    missing = compare(expected("one", "two"), "one\n")
    assert (missing.readme_line, missing.actual) == (101, None)
    extra = compare(expected("one"), "one\ntwo\n")
    assert (extra.readme_line, extra.actual) == (None, "two")
    assert compare(expected("1"), "") is not None  # a number still needs a line to match
