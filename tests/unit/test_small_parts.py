from __future__ import annotations

import re
from pathlib import Path

import pytest

from senddock.store.queries import all_queries, without_comments
from senddock.durations import format_duration, parse_duration
from senddock.redact import MASK, redact, redact_dsn
from senddock.sizes import format_size, parse_size

PACKAGE = Path(__file__).resolve().parents[2] / "senddock"


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("2m", 120), ("1h", 3600), ("1h30m", 5400),
                                                ("250ms", 0.25), ("1d", 86400), ("1.5s", 1.5)])
def test_durations(text: str, seconds: float):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "", "30", "s", "1 h", "-5s", "1h 30m"])
def test_not_durations(text: str):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


def test_format_duration():
    assert [format_duration(s) for s in (0, 0.25, 30, 90, 5400, 90061)] == ["0s", "250ms", "30s", "1m30s", "1h30m", "1d1h1m1s"]


@pytest.mark.parametrize(("text", "size"), [("256KiB", 262144), ("1MiB", 1048576), ("512B", 512), ("1 GiB", 2**30),
                                            ("1.5KiB", 1536), ("262144", 262144), (4096, 4096)])
def test_sizes(text: str | int, size: int):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["256kb", "256KB", "1M", "", "KiB", "-1KiB", -5, True, "1 2KiB"])
def test_not_sizes(text: str | int):
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


def test_format_size():
    assert [format_size(n) for n in (0, 1000, 1024, 262144, 3 * 2**20, 2**30)] == [
        "0B", "1000B", "1KiB", "256KiB", "3MiB", "1GiB"]


def test_redaction_of_secret_keys_and_dsns():
    shown = redact({
        "smtp": {"password": "pw", "username": "u", "private_key_file": "/k.pem"},
        "ses_like": {"secret_access_key": "abc", "api_key": "k"},
        "database": {"dsn": "postgresql://app:pw@db/mail"},
    })
    assert shown["smtp"] == {"password": MASK, "username": "u", "private_key_file": "/k.pem"}
    assert shown["ses_like"] == {"secret_access_key": MASK, "api_key": MASK}
    assert shown["database"]["dsn"] == "postgresql://app:***@db/mail"
    assert redact_dsn("host=db password='p w' dbname=x") == "host=db password=*** dbname=x"
    assert redact_dsn("postgresql://app@db/mail") == "postgresql://app@db/mail"


def test_every_named_query_is_used_and_every_used_query_exists():
    used = set()
    for path in PACKAGE.rglob("*.py"):
        used |= set(re.findall(r'(?:query|for_broadcasts)\("(\w+)"[,)]', path.read_text(encoding="utf-8")))
    assert used == set(all_queries())


def test_queries_are_sent_without_comments_and_fit_psycopgs_parse_cache():
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    # Over this length psycopg parses a statement's placeholders again at every call.
    too_long = {name: len(sql.encode()) for name, sql in all_queries().items()
                if len(sql.encode()) > MAX_CACHED_STATEMENT_LENGTH}
    assert not too_long, f"queries psycopg will not cache (bytes): {too_long}"


def test_comment_stripping_keeps_what_only_looks_like_a_comment():
    sql = "SELECT '--a' -- gone\n  , \"b--c\", $$ -- kept $$, $t$ x -- y $t$ -- gone too\nFROM t -- and this"
    assert without_comments(sql) == "SELECT '--a'\n, \"b--c\", $$ -- kept $$, $t$ x -- y $t$\nFROM t"


def test_every_package_is_listed_in_pyproject():
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(project["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")}
    assert found <= listed
