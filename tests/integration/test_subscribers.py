from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from senddock.errors import InvalidInput, NotFound


def write_csv(tmp_path: Path, text: str, name: str = "people.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_import_reports_each_bad_row_by_line_and_imports_the_rest(senddock_app, tmp_path: Path):
    senddock_app.create_list("news")
    path = write_csv(tmp_path, (
        "email,name,city\n"
        "ada@example.com,Ada,London\n"
        "not-an-address,Bob,Paris\n"
        ",Nobody,Rome\n"
        "ADA@example.com,Ada again,Leeds\n"
        "grace@example.com,Grace\n"
        "\n"
        "linus@example.com,Linus,Helsinki\n"
    ))
    rejected = []
    summary = senddock_app.import_subscribers(path, "news", on_reject=lambda r: rejected.append(str(r)))
    assert (summary.imported, summary.updated, summary.rejected) == (2, 0, 4)
    assert rejected == [
        f"{path}:3: invalid address 'not-an-address': An email address must have an @-sign.",
        f"{path}:4: missing email",
        f"{path}:6: has 2 fields, the header has 3",
        f"{path}:5: duplicate of line 2 (ADA@example.com)",
    ]
    with senddock_app.db.connection() as conn:
        rows = conn.execute("SELECT email, name, attributes FROM subscribers ORDER BY id").fetchall()
    assert rows == [("ada@example.com", "Ada", {"city": "London"}), ("linus@example.com", "Linus", {"city": "Helsinki"})]
    assert [(x.name, x.members) for x in senddock_app.lists()] == [("news", 2)]


def test_reimport_updates_and_never_duplicates(senddock_app, tmp_path: Path):
    senddock_app.create_list("news")
    senddock_app.import_subscribers(write_csv(tmp_path, "email,name,plan\nada@example.com,Ada,free\n"), "news")
    summary = senddock_app.import_subscribers(
        write_csv(tmp_path, "Email,plan,team\nAda@Example.com,pro,core\nnew@example.com,free,x\n", "again.csv"), "news"
    )
    assert (summary.imported, summary.updated, summary.rejected) == (1, 1, 0)
    with senddock_app.db.connection() as conn:
        rows = conn.execute("SELECT email, name, attributes FROM subscribers ORDER BY id").fetchall()
    # No name column the second time: the name is kept; attributes are merged.
    assert rows == [("ada@example.com", "Ada", {"plan": "pro", "team": "core"}), ("new@example.com", "", {"plan": "free", "team": "x"})]


def test_import_never_resubscribes(senddock_app, tmp_path: Path):
    senddock_app.create_list("news")
    senddock_app.add_subscriber("ada@example.com", lists=["news"])
    with senddock_app.db.connection() as conn:
        conn.execute("UPDATE subscribers SET status = 'unsubscribed'")
    senddock_app.import_subscribers(write_csv(tmp_path, "email\nada@example.com\n"), "news")
    with senddock_app.db.connection() as conn:
        assert conn.execute("SELECT status FROM subscribers").fetchone() == ("unsubscribed",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the file is empty"),
        ("name,city\nAda,London\n", ":1: the header has no 'email' column"),
        ("email,name,Email\na@example.com,A,b\n", ":1: column 'Email' appears twice"),
    ],
)
def test_unusable_files_are_refused_whole(senddock_app, tmp_path: Path, text: str, message: str):
    senddock_app.create_list("news")
    with pytest.raises(InvalidInput, match=message):
        senddock_app.import_subscribers(write_csv(tmp_path, text), "news")


def test_a_file_that_is_not_utf8_applies_nothing(senddock_app, tmp_path: Path):
    senddock_app.create_list("news")
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"email,name\nada@example.com,Ada\nbob@example.com,Jos\xe9\n")
    with pytest.raises(InvalidInput, match="not UTF-8"):
        senddock_app.import_subscribers(path, "news")
    with senddock_app.db.connection() as conn:
        assert conn.execute("SELECT count(*) FROM subscribers").fetchone() == (0,)


def test_import_into_a_missing_list(senddock_app, tmp_path: Path):
    with pytest.raises(NotFound, match="no list named 'nope'"):
        senddock_app.import_subscribers(write_csv(tmp_path, "email\na@example.com\n"), "nope")


def test_a_large_file_streams_through(senddock_app, tmp_path: Path):
    senddock_app.create_list("big")
    path = tmp_path / "big.csv"
    with path.open("w", encoding="utf-8") as f:
        f.write("email,name,n\n")
        for i in range(50_000):
            f.write(f"user{i}@example.com,User {i},{i}\n")
    progress = []
    summary = senddock_app.import_subscribers(path, "big", on_progress=lambda done, total: progress.append((done, total)))
    assert (summary.imported, summary.rejected) == (50_000, 0)
    assert progress[-1] == (path.stat().st_size, path.stat().st_size)
    assert len(progress) > 5  # reported as it streams, not once at the end


def test_add_subscriber_rejects_bad_addresses(senddock_app):
    with pytest.raises(InvalidInput, match="invalid address"):
        senddock_app.add_subscriber("nobody@")


def test_addresses_are_unique_whatever_their_case(senddock_app):
    first = senddock_app.add_subscriber("Ada@Example.com")
    assert senddock_app.add_subscriber("ada@example.COM", name="Ada") == first
    with pytest.raises(psycopg.errors.UniqueViolation), senddock_app.db.connection() as conn:
        conn.execute("INSERT INTO subscribers (email) VALUES ('ADA@EXAMPLE.COM')")


def test_a_name_with_a_line_break_or_control_character_is_made_one_line_and_reported(senddock_app, tmp_path: Path):
    senddock_app.create_list("news")
    path = tmp_path / "people.csv"
    path.write_bytes((
        'email,name,city\n'
        'ada@example.com,"Ada\nLovelace",London\n'              # a quoted field over two lines
        'bob@example.com,"Bob\r\nBcc: victim@example.com",Paris\r\n'
        'nul@example.com,"Nul\x00 Byte",Rome\n'
        'bell@example.com,Bell\x07\tTab,Oslo\n'
        'fine@example.com,  Fine  Name ,Bern\n'
        'dup@example.com,"Dup\nOne",Oslo\n'
        'DUP@example.com,"Dup\nTwo",Oslo\n'                     # a duplicate: rejected, so not stored either
        'zero@example.com,Zero,"Ro\x00me"\n'                   # Postgres cannot store a NUL: the row is refused
    ).encode())
    rejected, normalised = [], []
    summary = senddock_app.import_subscribers(path, "news", on_reject=lambda r: rejected.append(str(r)),
                                              on_normalise=lambda n: normalised.append(str(n)))
    assert (summary.imported, summary.updated, summary.rejected, summary.normalised) == (6, 0, 2, 5)
    assert normalised == [
        f"{path}:2: name contained a line break; stored as 'Ada Lovelace'",
        f"{path}:4: name contained a line break; stored as 'Bob Bcc: victim@example.com'",
        f"{path}:6: name contained a control character; stored as 'Nul Byte'",
        f"{path}:7: name contained a control character; stored as 'Bell Tab'",
        f"{path}:9: name contained a line break; stored as 'Dup One'",
    ]
    assert rejected == [f"{path}:13: attribute 'city' contains a NUL character",
                        f"{path}:11: duplicate of line 9 (DUP@example.com)"]
    with senddock_app.db.connection() as conn:
        names = dict(conn.execute("SELECT email, name FROM subscribers").fetchall())
    assert names == {"ada@example.com": "Ada Lovelace", "bob@example.com": "Bob Bcc: victim@example.com",
                     "nul@example.com": "Nul Byte", "bell@example.com": "Bell Tab",
                     "fine@example.com": "Fine  Name", "dup@example.com": "Dup One"}


@pytest.mark.parametrize("name", ["Ada\r\nBcc: victim@example.com", "Ada\x00", "Ada\x07"])
def test_add_subscriber_refuses_a_name_that_cannot_go_into_a_header(senddock_app, name: str):
    with pytest.raises(InvalidInput, match="contains a (line break|control character): give it on one line"):
        senddock_app.add_subscriber("ada@example.com", name=name)
    assert senddock_app.subscribers() == []


def test_adding_many_at_once_is_one_transaction_that_a_bad_address_refuses_whole(senddock_app, database_dsn):
    senddock_app.create_list("news")
    senddock_app.add_subscriber("ada@example.com", name="Ada", lists=["news"])
    with pytest.raises(InvalidInput, match="not-an-address"):
        senddock_app.add_subscribers(["grace@example.com", "not-an-address"], lists=["news"])
    ids = senddock_app.add_subscribers(["grace@example.com", "ADA@example.com", "linus@example.com"], lists=["news"])
    with psycopg.connect(database_dsn) as conn:
        rows = conn.execute("SELECT s.id, s.email, s.name FROM subscribers s JOIN list_members m ON m.subscriber_id = s.id "
                            "ORDER BY s.id").fetchall()
    assert [email for _, email, _ in rows] == ["ada@example.com", "grace@example.com", "linus@example.com"]
    assert ids == [rows[1][0], rows[0][0], rows[2][0]]  # in the order given; Ada's row kept, name and all
    assert rows[0][2] == "Ada"
