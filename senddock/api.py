"""The public Python API for applications that embed senddock; the CLI is a thin layer over it.

    with Senddock.open("config/senddock.yaml") as sd:
        sd.create_list("news")
        sd.add_subscriber("ada@example.com", name="Ada", lists=["news"])
        cid = sd.create_campaign(name="Hello", lists=["news"], subject="Hi", from_addr="me@example.com",
                                 text_body="Hello!")
        sd.send_campaign(cid)
        print(sd.campaign_status(cid).sent)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from senddock.config import Config, load_config
from senddock.core import campaigns, lists, migrations, subscribers
from senddock.core.campaigns import Campaign, CampaignStatus, CampaignSummary, EnqueueResult
from senddock.core.db import Database
from senddock.core.lists import MailingList
from senddock.core.subscribers import ImportSummary, Rejection
from senddock.core.suppressions import Suppressions
from senddock.errors import DatabaseError

__all__ = [
    "Senddock",
    "Campaign",
    "CampaignStatus",
    "CampaignSummary",
    "EnqueueResult",
    "ImportSummary",
    "MailingList",
    "Rejection",
]


class Senddock:
    """senddock opened on one configuration and its database."""

    def __init__(self, config: Config, *, database: Database | None = None) -> None:
        self.config = config
        self.db = database or Database(config.database)
        self.suppressions = Suppressions(self.db)
        self._schema_checked = False

    @classmethod
    def open(cls, config_path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None) -> Senddock:
        return cls(load_config(config_path, environ=environ))

    def __enter__(self) -> Senddock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    # -- schema ----------------------------------------------------------------------------------

    def migrate(self) -> list[migrations.Migration]:
        """Apply pending migrations (idempotent, safe to run from several nodes at once)."""
        with self.db.connect() as conn:
            applied = migrations.migrate(conn)
        self._schema_checked = True
        return applied

    def ensure_schema(self) -> None:
        """Migrate when ``database.auto_migrate`` allows it; otherwise refuse a database that needs it."""
        if self._schema_checked:
            return
        with self.db.connection() as conn:
            todo = migrations.pending(conn)
        if todo:
            if not self.config.database.auto_migrate:
                names = ", ".join(f"{m.version:04d}_{m.name}" for m in todo)
                raise DatabaseError(f"the database needs migrations ({names}): run `senddock migrate`")
            self.migrate()
        self._schema_checked = True

    def _conn(self):
        self.ensure_schema()
        return self.db.connection()

    # -- lists and subscribers -------------------------------------------------------------------

    def create_list(self, name: str) -> int:
        with self._conn() as conn:
            return lists.create_list(conn, name)

    def lists(self) -> list[MailingList]:
        with self._conn() as conn:
            return lists.all_lists(conn)

    def add_subscriber(
        self,
        email: str,
        *,
        name: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        lists: Sequence[str] = (),
    ) -> int:
        with self._conn() as conn:
            return subscribers.add_subscriber(conn, email, name=name, attributes=attributes, lists=lists)

    def import_subscribers(
        self,
        path: str | os.PathLike[str],
        list_name: str,
        *,
        on_reject: Callable[[Rejection], None] = lambda r: None,
        on_progress: Callable[[int, int], None] = lambda done, total: None,
    ) -> ImportSummary:
        with self._conn() as conn:
            return subscribers.import_csv(conn, path, list_name, on_reject=on_reject, on_progress=on_progress)

    # -- campaigns -------------------------------------------------------------------------------

    def create_campaign(
        self,
        *,
        name: str,
        lists: Sequence[str],
        subject: str,
        from_addr: str,
        reply_to: str | None = None,
        text_body: str | None = None,
        html_body: str | None = None,
    ) -> int:
        with self._conn() as conn:
            return campaigns.create_campaign(
                conn,
                name=name,
                lists=lists,
                subject=subject,
                from_addr=from_addr,
                reply_to=reply_to,
                text_body=text_body,
                html_body=html_body,
            )

    def campaign(self, campaign_id: int) -> Campaign:
        with self._conn() as conn:
            return campaigns.get_campaign(conn, campaign_id)

    def campaigns(self) -> list[CampaignSummary]:
        with self._conn() as conn:
            return campaigns.all_campaigns(conn)

    def send_campaign(self, campaign_id: int) -> EnqueueResult:
        with self._conn() as conn:
            return campaigns.send_campaign(conn, campaign_id)

    def resume_campaign(self, campaign_id: int) -> None:
        """Put a paused campaign back to sending (after fixing what paused it)."""
        with self._conn() as conn:
            campaigns.resume_campaign(conn, campaign_id)

    def campaign_status(self, campaign_id: int) -> CampaignStatus:
        with self._conn() as conn:
            return campaigns.campaign_status(conn, campaign_id)

    # -- suppressions ----------------------------------------------------------------------------

    def suppress(self, email: str, *, reason: str = "manual") -> bool:
        self.ensure_schema()
        return self.suppressions.add(email, reason=reason)
