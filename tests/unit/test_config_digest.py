"""A config's digest holds no secret, and changes with every other setting."""

from __future__ import annotations

from pathlib import Path

from senddock.config import load_config
from senddock.config_digest import changed_settings, config_digest, short_digest

SECRETS = "unsubscribe:\n  url: https://mail.example.com\n  secret: ${%s}\ndatabase:\n  dsn: ${DSN}\n"
ENV = {"S1": "first-secret-of-32-characters-xx", "S2": "other-secret-of-32-characters-yy",
       "DSN": "postgresql://app:hunter2@db.example.com/mail"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "senddock.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_digest_depends_on_every_setting_but_no_secret(tmp_path: Path):
    path = write(tmp_path, SECRETS % "S1")
    digest = config_digest(load_config(path, environ=ENV))
    assert len(digest) == 64 and short_digest(digest) == digest[:12] and short_digest(None) == "-"
    # Other secrets, another DSN password: the same digest, so it cannot tell anything about them.
    other = {**ENV, "S1": ENV["S2"], "DSN": "postgresql://app:other@db.example.com/mail"}
    assert config_digest(load_config(path, environ=other)) == digest
    # Anything else that differs, the DSN's host included, makes another digest.
    assert config_digest(load_config(path, environ={**ENV, "DSN": "postgresql://app:hunter2@db2.example.com/mail"})) \
        != digest
    write(tmp_path, SECRETS % "S1" + "retry:\n  schedule: [1m]\n")
    assert config_digest(load_config(path, environ=ENV)) != digest


def test_changed_settings_names_paths_and_never_values():
    old = {"retry": {"schedule": ["1s"], "max_retries": 2}, "unsubscribe": {"secret": "x"}, "concurrency": 5}
    new = {"retry": {"schedule": ["1s", "1m"], "max_retries": 2}, "unsubscribe": {"secret": "y"}, "workers": 5}
    assert list(changed_settings(old, new)) == ["concurrency", "retry.schedule", "unsubscribe.secret", "workers"]
