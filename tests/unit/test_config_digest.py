"""A config's digest holds no secret; a node's watch on its file names what changed, secrets included, once."""

from __future__ import annotations

import os
from pathlib import Path

from structlog.testing import capture_logs

from senddock.loading import load_config
from senddock.config.digest import changed_settings, config_digest, short_digest
from senddock.core.config_watch import ConfigWatch

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


def test_the_watch_names_a_secret_changed_alone_once_and_says_when_the_file_is_back(tmp_path: Path, monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    path = write(tmp_path, SECRETS % "S1")
    watch = ConfigWatch(load_config(path))
    with capture_logs() as logs:
        watch.check()  # the first look reads the file: as the node loaded it, nothing to say
        write(tmp_path, "# a comment changes no setting\n" + SECRETS % "S1")
        watch.check()
        assert logs == []
        write(tmp_path, SECRETS % "S2")
        watch.check()
        watch.check()  # the file did not change again: not read again, nothing said again
        write(tmp_path, SECRETS % "S1")
        watch.check()
    changed, restored = logs
    assert changed["event"] == "config_changed" and changed["restart_needed"] == ["unsubscribe.secret"]
    # Its digest is the running one (secrets are masked in it), and no secret is in the line.
    assert changed["running_digest"] == changed["file_digest"]
    assert not any(value in repr(changed) for value in ENV.values())
    assert restored["event"] == "config_restored" and restored["log_level"] == "info"


def test_a_config_from_a_pipe_is_not_read_again(tmp_path: Path):
    """A pipe read again is empty (the defaults): the first look would call that a change."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"concurrency: 7\n")
    os.close(write_end)
    try:
        watch = ConfigWatch(load_config(f"/proc/self/fd/{read_end}"))
        with capture_logs() as logs:
            watch.check()
    finally:
        os.close(read_end)
    assert logs == []
