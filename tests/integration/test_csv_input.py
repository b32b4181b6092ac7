"""CSV files as they come: another encoding, a byte order mark, CRLF line ends, the same file twice."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "senddock.yaml"
    path.write_text("workers: 1\n", encoding="utf-8")
    return path


@pytest.fixture
def news(cli, config_file: Path) -> None:
    assert cli("lists", "create", "news", "-c", config_file).exit_code == 0


def people(cli, config_file: Path) -> list[tuple[str, str, dict]]:
    rows = cli("subscribers", "ls", "-c", config_file, "--json").json["subscribers"]
    return [(r["email"], r["name"], r["attributes"]) for r in rows]


def test_a_byte_that_is_not_utf8_is_reported_on_its_own_line(cli, config_file, tmp_path, news):
    csv = tmp_path / "people.csv"
    csv.write_bytes("email,name\nada@example.com,Ad\xe9le\nbob@example.com,Bob\n".encode("cp1252"))
    result = cli("subscribers", "import", csv, "--list", "news", "-c", config_file)
    assert result.exit_code == 1
    assert result.stderr == (f"senddock: error: {csv}:2: not UTF-8 text, byte 0xe9: invalid continuation byte "
                             "(try --encoding cp1252)\n")
    assert people(cli, config_file) == [], "nothing is imported from a file that cannot be read whole"
    # Far past the first block the decoder reads ahead: still the right line.
    long = tmp_path / "long.csv"
    long.write_bytes(b"email,name\n" + b"".join(b"p%d@example.com,P\n" % i for i in range(2000))
                     + b"late@example.com,Ren\xe9e\n")
    late = cli("subscribers", "import", long, "--list", "news", "-c", config_file)
    assert late.stderr.startswith(f"senddock: error: {long}:2002: not UTF-8 text, byte 0xe9")


def test_encoding_reads_a_windows_file(cli, config_file, tmp_path, news):
    csv = tmp_path / "people.csv"
    csv.write_bytes("email,name,city\r\nada@example.com,Adèle,Zürich\r\n".encode("cp1252"))
    result = cli("subscribers", "import", csv, "--list", "news", "--encoding", "cp1252", "-c", config_file, "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json == {"imported": 1, "updated": 0, "unchanged": 0, "rejected": 0, "normalised": 0}
    assert people(cli, config_file) == [("ada@example.com", "Adèle", {"city": "Zürich"})]


@pytest.mark.parametrize(("name", "message"), [
    ("klingon", "unknown encoding 'klingon' (e.g. utf-8, cp1252, latin-1, utf-16)"),
    ("base64", "'base64' is not a text encoding (e.g. utf-8, cp1252, latin-1, utf-16)"),
])
@pytest.mark.parametrize("command", [["subscribers", "import", "x.csv", "--list", "news"],
                                     ["suppressions", "import", "x.csv"]])
def test_an_unknown_encoding_is_a_usage_error(cli, config_file, command, name, message):
    result = cli(*command, "--encoding", name, "-c", config_file)
    assert result.exit_code == 2
    assert result.stderr == (f"senddock: error: senddock {' '.join(command[:2])}: argument --encoding: {message}\n")


def test_a_bom_and_crlf_line_ends_are_read_as_plain_text(cli, config_file, tmp_path, news):
    csv = tmp_path / "excel.csv"
    csv.write_bytes(b"\xef\xbb\xbfemail,name,plan\r\nada@example.com,Ada,pro\r\n"
                    b"not-an-address,Bob,free\r\ngrace@example.com,\"Grace\r\nHopper\",free\r\n")
    result = cli("subscribers", "import", csv, "--list", "news", "-c", config_file, "--json")
    assert result.exit_code == 1  # the bad address and the line break in a name, each on its own line:
    assert result.stderr.splitlines() == [
        f"{csv}:3: invalid address 'not-an-address': An email address must have an @-sign.",
        f"{csv}:4: name contained a line break; stored as 'Grace Hopper'",
    ]
    assert result.json == {"imported": 2, "updated": 0, "unchanged": 0, "rejected": 1, "normalised": 1}
    assert people(cli, config_file) == [("ada@example.com", "Ada", {"plan": "pro"}),
                                        ("grace@example.com", "Grace Hopper", {"plan": "free"})]


def test_reimporting_the_same_rows_reports_them_unchanged(cli, config_file, tmp_path, news):
    csv = tmp_path / "people.csv"
    csv.write_text("email,name,plan\nada@example.com,Ada,pro\nbob@example.com,Bob,free\ncy@example.com,Cy,free\n",
                   encoding="utf-8")
    first = cli("subscribers", "import", csv, "--list", "news", "-c", config_file)
    assert (first.exit_code, first.stdout) == (0, "imported 3, updated 0, unchanged 0, rejected 0\n")
    again = cli("subscribers", "import", csv, "--list", "news", "-c", config_file)
    assert (again.exit_code, again.stdout) == (0, "imported 0, updated 0, unchanged 3, rejected 0\n")
    as_json = cli("subscribers", "import", csv, "--list", "news", "-c", config_file, "--json")
    assert as_json.json == {"imported": 0, "updated": 0, "unchanged": 3, "rejected": 0, "normalised": 0}

    # Only what really changes counts: a name, an attribute (merged), a list newly joined.
    assert cli("lists", "create", "vip", "-c", config_file).exit_code == 0
    changed = tmp_path / "changed.csv"
    changed.write_text("email,name,plan\nada@example.com,Ada L.,pro\nbob@example.com,Bob,pro\n"
                       "cy@example.com,Cy,free\nnew@example.com,New,free\n", encoding="utf-8")
    assert cli("subscribers", "import", changed, "--list", "news", "-c", config_file, "--json").json == {
        "imported": 1, "updated": 2, "unchanged": 1, "rejected": 0, "normalised": 0}
    joined = tmp_path / "joined.csv"
    joined.write_text("email,plan\nada@example.com,pro\n", encoding="utf-8")
    assert cli("subscribers", "import", joined, "--list", "vip", "-c", config_file, "--json").json == {
        "imported": 0, "updated": 1, "unchanged": 0, "rejected": 0, "normalised": 0}
    assert cli("subscribers", "import", joined, "--list", "vip", "-c", config_file, "--json").json == {
        "imported": 0, "updated": 0, "unchanged": 1, "rejected": 0, "normalised": 0}
    assert people(cli, config_file) == [("ada@example.com", "Ada L.", {"plan": "pro"}),
                                        ("bob@example.com", "Bob", {"plan": "pro"}),
                                        ("cy@example.com", "Cy", {"plan": "free"}),
                                        ("new@example.com", "New", {"plan": "free"})]


def test_suppressions_import_reads_encodings_boms_and_crlf_and_names_a_bad_byte_line(cli, config_file, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes("email,reason\nok@example.com,manual\nren\xe9e@example.com,manual\n".encode("cp1252"))
    result = cli("suppressions", "import", bad, "-c", config_file)
    assert result.exit_code == 1
    assert result.stderr == (f"senddock: error: {bad}:3: not UTF-8 text, byte 0xe9: invalid continuation byte "
                             "(try --encoding cp1252)\n")
    assert cli("suppressions", "ls", "-c", config_file, "--json").json["suppressions"] == []

    excel = tmp_path / "excel.csv"
    excel.write_bytes("\ufeffemail,reason\r\nrenée@example.com,manual\r\nbad address,manual\r\n".encode("utf-8"))
    read = cli("suppressions", "import", excel, "-c", config_file, "--json")
    assert read.exit_code == 1
    # (stderr also carries the log line of the suppression made)
    assert f"{excel}:3: invalid address 'bad address': An email address must have an @-sign." in read.stderr.splitlines()
    assert read.json == {"added": 1, "already": 0, "rejected": 1}
    windows = tmp_path / "windows.csv"
    windows.write_bytes("email\r\nrenée@example.com\r\n".encode("cp1252"))
    again = cli("suppressions", "import", windows, "--encoding", "cp1252", "-c", config_file, "--json")
    assert (again.exit_code, again.json) == (0, {"added": 0, "already": 1, "rejected": 0})


def test_a_utf8_file_with_one_cp1252_line_is_never_told_to_read_as_cp1252(cli, config_file, tmp_path, news):
    """The hint used to say `try --encoding cp1252` for any file that was not UTF-8; following it
    imported every UTF-8 name of a mixed file as mojibake, exit 0. It looks at the file first."""
    mixed = tmp_path / "mixed.csv"
    mixed.write_bytes("email,name\nzoe@example.com,Zoë Ångström\n".encode("utf-8")
                      + "rene@example.com,René\n".encode("cp1252")
                      + "bjorn@example.com,Björn\n".encode("utf-8"))
    refused = cli("subscribers", "import", mixed, "--list", "news", "-c", config_file)
    assert refused.exit_code == 1 and people(cli, config_file) == []
    assert refused.stderr == (
        f"senddock: error: {mixed}:3: not UTF-8 text, byte 0xe9: invalid continuation byte (1 of its lines are "
        "not UTF-8 (line 3) while 2 are UTF-8 text that cp1252 would misread: fix those lines, or --encoding "
        "utf-8,cp1252 reads each line that is not UTF-8 as cp1252 and names it)\n")
    # What it offers reads every name right, and names the line it read as cp1252.
    read = cli("subscribers", "import", mixed, "--list", "news", "--encoding", "utf-8,cp1252", "-c", config_file,
               "--json")
    assert read.exit_code == 0, read.stderr
    assert f"{mixed}:3: not utf-8 text, read as cp1252" in read.stderr.splitlines()
    assert sorted(people(cli, config_file)) == [("bjorn@example.com", "Björn", {}), ("rene@example.com", "René", {}),
                                                ("zoe@example.com", "Zoë Ångström", {})]


def test_the_fallback_works_for_suppressions_and_refuses_what_cannot_work_line_by_line(cli, config_file, tmp_path):
    mixed = tmp_path / "mixed.csv"
    mixed.write_bytes("email\nzoë@example.com\n".encode("utf-8") + "renée@example.com\n".encode("cp1252"))
    read = cli("suppressions", "import", mixed, "--encoding", "utf-8,cp1252", "-c", config_file, "--json")
    assert (read.exit_code, read.json) == (0, {"added": 2, "already": 0, "rejected": 0}), read.stderr
    assert f"{mixed}:3: not utf-8 text, read as cp1252" in read.stderr.splitlines()
    for spec, message in (("utf-16,cp1252", "'utf-16,cp1252': a fallback works line by line, between encodings "
                                            "that write ASCII as ASCII (not utf-16)"),
                          ("utf-8,cp1252,latin-1", "'utf-8,cp1252,latin-1': one encoding, or one and a fallback for "
                                                   "the lines not in it (utf-8,cp1252)")):
        refused = cli("suppressions", "import", mixed, "--encoding", spec, "-c", config_file)
        assert refused.exit_code == 2 and message in refused.stderr, refused.stderr
