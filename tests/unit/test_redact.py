"""Passwords never shown: DSNs as written (key=value and URL), and psycopg's own error text."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from senddock.config import DatabaseSettings
from senddock.store.db import Database
from senddock.errors import DatabaseError, error_line
from senddock.redact import dsn_secrets, redact_dsn


@pytest.mark.parametrize(("dsn", "shown"), [
    # key=value (libpq): spaces around "=", quoted values with escaped quotes and backslashes
    ("host=db port=5432 password=secret dbname=mail", "host=db port=5432 password=*** dbname=mail"),
    ("host=db sslpassword=keypass sslkey=/k.pem dbname=mail", "host=db sslpassword=*** sslkey=/k.pem dbname=mail"),
    ("host=db password = 'two words' dbname=mail", "host=db password = *** dbname=mail"),
    (r"host=db password='it\'s mine' sslpassword='a\\' dbname=mail", "host=db password=*** sslpassword=*** dbname=mail"),
    ("host=db password='never closed dbname=mail", "host=db password=***"),
    ("password=secret", "password=***"),
    ("host=db passfile=/home/app/.pgpass sslkey=/k.pem dbname=mail",
     "host=db passfile=/home/app/.pgpass sslkey=/k.pem dbname=mail"),
    # URLs: libpq takes the password up to the first "@" before a "/", so ":" and "?" may be in
    # it; an unencoded "@" or "/" is a mistake libpq refuses or misreads, masked all the same.
    ("postgresql://u:p@ss@db.internal/mail", "postgresql://u:***@db.internal/mail"),
    ("postgresql://u:pa:ss@db.internal:5433/mail", "postgresql://u:***@db.internal:5433/mail"),
    ("postgresql://u:pa?ss@db.internal/mail", "postgresql://u:***@db.internal/mail"),
    ("postgresql://u:pa?s=s@db.internal/mail", "postgresql://u:***@db.internal/mail"),
    ("postgresql://u:pa/ss@db.internal/mail", "postgresql://u:***@db.internal/mail"),
    ("postgresql://u:p%40ss@db.internal/mail", "postgresql://u:***@db.internal/mail"),
    ("postgresql://u:pw@[::1]:5432/mail", "postgresql://u:***@[::1]:5432/mail"),
    ("postgresql://u:pw@h1:5432,h2:5433/mail", "postgresql://u:***@h1:5432,h2:5433/mail"),
    ("postgresql://u:pw@db.internal/mail?sslpassword=k&password=q&sslmode=require",
     "postgresql://u:***@db.internal/mail?sslpassword=***&password=***&sslmode=require"),
    ("postgres://db.internal/mail?password=q", "postgres://db.internal/mail?password=***"),
    ("postgresql://u:pw@db.internal/mail?application_name=a@b", "postgresql://u:***@db.internal/mail?application_name=a@b"),
    ("postgresql://u:pw@db.internal?application_name=a@b", "postgresql://u:***@db.internal?application_name=a@b"),
    ("https://user:token@hooks.example/x", "https://user:***@hooks.example/x"),
    # nothing secret: unchanged
    ("postgresql://db.internal:5432/mail?sslmode=require", "postgresql://db.internal:5432/mail?sslmode=require"),
    ("postgresql://app@db.internal/mail", "postgresql://app@db.internal/mail"),
    ("postgresql://app:@db.internal/mail", "postgresql://app:@db.internal/mail"),
    ("postgresql://db.internal:5432/mail?options=a@b", "postgresql://db.internal:5432/mail?options=a@b"),
    ("postgresql://[::1]:5432/mail?application_name=a@b", "postgresql://[::1]:5432/mail?application_name=a@b"),
    ("postgresql:///mail?host=/run/postgresql", "postgresql:///mail?host=/run/postgresql"),
    ('connection to server at "127.0.0.1", port 5432 failed: FATAL:  password authentication failed for user "app"',
     'connection to server at "127.0.0.1", port 5432 failed: FATAL:  password authentication failed for user "app"'),
    # inside a sentence
    ('bad URI: "postgresql://u:s3cret@[::1/mail"', 'bad URI: "postgresql://u:***@[::1/mail"'),
])
def test_redact_dsn(dsn: str, shown: str):
    assert redact_dsn(dsn) == shown


def test_secrets_of_a_dsn():
    assert dsn_secrets("host=db password='it\\'s mine' sslpassword=k") >= {"it's mine", "k"}
    assert dsn_secrets("postgresql://u:p%40ss@db/mail?sslpassword=k%21") >= {"p%40ss", "p@ss", "ss", "k%21", "k!"}
    assert dsn_secrets("postgresql://app@db/mail") == set()


def test_error_line_masks_what_psycopg_echoes_of_the_password():
    # libpq ends the password at its first "@": the rest becomes part of the host it reports.
    dsn = "postgresql://u:p@ss@db.invalid/mail"
    exc = psycopg.OperationalError("failed to resolve host 'ss@db.invalid': [Errno -2] Name or service not known")
    assert error_line(exc, dsns=[dsn]) == "failed to resolve host '***@db.invalid': [Errno -2] Name or service not known"
    exc = psycopg.ProgrammingError('invalid percent-encoded token: "sec%zzret"\n')
    assert error_line(exc, dsns=["postgresql://u:sec%zzret@db/mail"]) == 'invalid percent-encoded token: "***"'
    # a short password is masked as a whole word, never inside the words of the error
    exc = psycopg.OperationalError('connection to server at "db", port 5432 failed: password authentication failed')
    assert error_line(exc, dsns=["postgresql://u:pass@db/mail"]) == str(exc)


@pytest.mark.parametrize(("dsn", "secret"), [
    ("postgresql://u:p@ss@127.0.0.1:1/mail", "ss"),           # the host libpq then resolves is "ss@127.0.0.1"
    ("postgresql://u:sec%zzret@127.0.0.1:1/mail", "zzret"),   # psycopg's ProgrammingError quotes the token
    ("postgresql://u:p ss@127.0.0.1:1/mail", "p ss"),         # "unexpected spaces found in ..."
    ("host=127.0.0.1 port=1 password='unterminated", "unterminated"),
])
def test_a_failed_connection_never_shows_the_password(dsn: str, secret: str):
    settings = DatabaseSettings(dsn=dsn, direct_dsn=None, embedded_path=Path("/nonexistent"), pool_size=2,
                                connect_timeout=1, auto_migrate=False)
    db = Database(settings)
    for attempt in (db.connect, lambda: db.pool):
        with pytest.raises(DatabaseError) as caught:
            attempt()
        assert "cannot connect to the database" in str(caught.value)
        assert secret not in str(caught.value)
        assert db._pool is None
