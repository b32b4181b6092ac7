"""Campaign content for the senders, read once per campaign and shared by every send of the node.

The claimer loads what its claims need on its own connection before it hands jobs out, so a send
holds no connection; a sender asks the database itself only to re-read a campaign whose template
failed (it may have been fixed and the campaign resumed since this node read it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from senddock.store.jobs import JobQueue
from senddock.outcome import CampaignContent


class ContentCache:
    def __init__(self, queue_for: Callable[[], AbstractContextManager[JobQueue]]) -> None:
        self._queue_for = queue_for  # a pooled connection's queue, for a reload
        self._content: dict[int, CampaignContent] = {}
        self._lock = threading.Lock()

    def load(self, queue: JobQueue, campaign_ids: Iterable[int]) -> None:
        """Read the campaigns not read yet (on the caller's connection)."""
        for campaign_id in set(campaign_ids):
            with self._lock:
                if campaign_id in self._content:
                    continue
            self._store(campaign_id, queue)

    def get(self, campaign_id: int) -> CampaignContent:
        with self._lock:
            cached = self._content.get(campaign_id)
        if cached is not None:
            return cached
        with self._queue_for() as queue:
            return self._store(campaign_id, queue)

    def reload(self, campaign_id: int) -> CampaignContent:
        """Read a campaign again: its template failed with what this node had read."""
        with self._queue_for() as queue:
            return self._store(campaign_id, queue)

    def _store(self, campaign_id: int, queue: JobQueue) -> CampaignContent:
        content = CampaignContent(**queue.campaign_content(campaign_id))
        with self._lock:
            self._content[campaign_id] = content
        return content
