"""`senddock admin hash-password`: the hash that goes in ``serve.admin.password_hash``."""

from __future__ import annotations

import argparse
import sys

from senddock.cli.output import Output
from senddock.errors import EXIT_OK, UsageError


def add_commands(admin, command) -> None:
    command(admin, "hash-password", hash_password,
            "read a password on standard input (not echoed on a terminal) and print its argon2id hash, for "
            "serve.admin.password_hash")


def _read_password() -> str:
    if sys.stdin.isatty():
        import getpass

        first = getpass.getpass("password: ")
        if first and getpass.getpass("again: ") != first:
            raise UsageError("the two passwords differ; nothing printed")
        return first
    # Piped: the whole input, less the one line end `echo` or a file adds.
    text = sys.stdin.read()
    return text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")


def hash_password(args: argparse.Namespace, out: Output) -> int:
    from senddock.passwords import MAX_PASSWORD_LENGTH, hash_password as make_hash

    password = _read_password()
    if not password:
        raise UsageError("no password on standard input (e.g. `senddock admin hash-password < password-file`)")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise UsageError(f"the password is longer than {MAX_PASSWORD_LENGTH} characters")
    password_hash = make_hash(password)
    out.result({"password_hash": password_hash}, password_hash)
    return EXIT_OK
