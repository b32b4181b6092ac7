"""The example plugins, driven through a real senddock on a real Postgres."""

from __future__ import annotations

import mailbox
import threading
from email import message_from_bytes

from senddock.api import Senddock
from senddock.testing import drain, fast_settings, send_broadcast
from senddock_maildir.transport import open_maildir


def test_every_recipient_gets_one_message_in_the_maildir(make_config, tmp_path):
    app = Senddock(make_config(fast_settings(transport="maildir", maildir={"path": str(tmp_path / "mail")})))
    emails = [f"reader{i}@example.com" for i in range(25)]
    campaign_id = send_broadcast(app, emails, subject="Hello {{ subscriber.email }}")
    drain(app.config)
    assert app.campaign_status(campaign_id).sent == 25
    messages = [message_from_bytes(m.as_bytes()) for m in mailbox.Maildir(tmp_path / "mail", create=False)]
    assert sorted(m["To"] for m in messages) == sorted(emails)
    assert all(m["Subject"] == f"Hello {m['To']}" for m in messages)
    assert len({m["Message-ID"] for m in messages}) == 25
    app.close()


def test_steady_backoff_retries_at_its_own_pace(make_config, tmp_path):
    unwritable = tmp_path / "file-not-a-folder"
    unwritable.write_text("")  # a Maildir cannot be created here: every send fails with an OSError
    settings = fast_settings(transport="maildir", maildir={"path": str(unwritable)},
                             steady_backoff={"delay": "1s", "max_retries": 2}, retry={"max_retries": 10})
    app = Senddock(make_config(settings))
    campaign_id = send_broadcast(app, ["a@example.com"])
    drain(app.config, timeout=30)
    status = app.campaign_status(campaign_id)
    assert status.failed_by_reason == {"retries_exhausted": 1}
    with app.db.connection() as conn:
        attempts = conn.execute("SELECT attempts FROM broadcast_jobs").fetchone()[0]
    assert attempts == 3  # the first send and steady_backoff's two retries (not senddock's ten)
    app.close()


def test_workers_opening_a_new_maildir_at_once_all_get_it(tmp_path):
    # Every worker opens the folder on its first send, at the same moment: none may fail.
    for attempt in range(10):
        path, errors = tmp_path / f"mail{attempt}", []
        start = threading.Barrier(16)

        def open_it() -> None:
            start.wait()
            try:
                open_maildir(path).add(b"Subject: hi\r\n\r\nhello\r\n")
            except OSError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_it) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == [] and len(mailbox.Maildir(path, create=False)) == 16
