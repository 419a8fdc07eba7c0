"""The operator's status sync under its supervisor, in process against a real PostgreSQL: a
sync that dies of an error it does not handle (here its Kubernetes client raising what it never
should) is logged, restarted with back-off, ``/readyz`` fails meanwhile naming it, and the
restarted sync still brings the outcome to the object's status."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from schedlock.core.aio import Supervisor, restart_backoff
from schedlock.core.logs import Event
from schedlock.operator.process import Readiness
from schedlock.operator.sync import StatusSync
from schedlock.store import open_store
from testbed.rows import fetch, insert_rows


class FlakyApi:
    """A Kubernetes API whose first status PATCH raises a bug, not a KubeError."""

    def __init__(self, uids: dict[str, str]) -> None:
        self.uids = uids  # name -> uid
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.failures = 0

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        uid = self.uids.get(name)
        return None if uid is None else self.indexed(uid)

    def indexed(self, uid: str) -> dict[str, Any] | None:
        """The object as kopf's index holds it (the sync reads it there, no GET)."""
        names = [name for name, known in self.uids.items() if known == uid]
        if not names:
            return None
        meta = {"namespace": "default", "name": names[0], "uid": uid, "generation": 1}
        return {"metadata": meta, "spec": {}, "status": {}}

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        if self.failures == 0:
            self.failures += 1
            raise RuntimeError("a bug in the client")
        self.patched.append((name, status))

    async def post_event(
        self, obj: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        pass


def test_a_dead_status_sync_is_restarted_and_readyz_shows_it_meanwhile(
    migrated_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    [uid] = insert_rows(migrated_database, 1, start_in=3600, prefix="obj")
    fetch(
        migrated_database,
        "UPDATE schedlock_publishes SET state = 'published', attempts = 1, fired_at = now() "
        "WHERE uid = %s RETURNING id",
        uid,
    )
    [(name,)] = fetch(migrated_database, "SELECT name FROM schedlock_publishes WHERE uid = %s", uid)
    api = FlakyApi({str(name): uid})
    said: list[tuple[bool, str]] = []

    async def body() -> None:
        store = open_store(migrated_database)
        readiness = Readiness()
        readiness.report_schema(None)
        readiness.kopf_ready.set()
        stopping = asyncio.Event()
        sync = StatusSync(
            store,
            api,
            sweep_seconds=60,
            catch_up_seconds=3600,
            holder="op-test",
            known=api.indexed,
        )
        sync.listed.set()  # kopf has listed the objects: its index is whole
        try:
            async with Supervisor("operator", stopping=stopping, stop_timeout=5) as tasks:
                readiness.tasks = tasks
                tasks.supervise("status-sync", lambda: sync.run(stopping), restart_backoff())
                async with asyncio.timeout(30):
                    while not api.patched:
                        said.append(readiness())
                        await asyncio.sleep(0.05)
                said.append(readiness())
                stopping.set()
        finally:
            await store.close()

    asyncio.run(body())
    down = [text for ok, text in said if not ok]
    assert down and down[0].startswith(
        "background task down: task status-sync failed (RuntimeError), restart 1 in "
    ), said[:3]
    assert said[-1] == (True, "ready"), "ready again once restarted"
    assert [n for n, _ in api.patched] == [name]
    assert api.patched[0][1]["phase"] == "Published", "the restarted sync synced the outcome"
    events = [getattr(r, "event", None) for r in caplog.records]
    assert Event.TASK_FAILED in events and Event.TASK_RESTARTED in events
