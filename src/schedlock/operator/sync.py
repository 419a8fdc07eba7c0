"""Status sync: outcomes flow from the database back into ``.status`` and Events.

The sidecars NOTIFY ``schedlock_outcomes`` with the row ids of every batch of outcomes; the
sync LISTENs, reads those rows, computes each object's status (``schedlock.operator.mapping``),
patches it when it changed and posts the Event the change deserves.  A periodic sweep re-reads
every row changed since the last sweep, so a lost notification or an operator restart only
delays a status, never loses it.  Events are decided by comparing with the status already in
the API, so replays and sweeps do not post twice.

Exactly one operator replica syncs at a time: the one holding the advisory lock
``(SCHEDLOCK_CLASS_ID, 1)`` on its own session; the others wait in ``pg_advisory_lock``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from datetime import UTC, datetime
from typing import Any, Protocol

from schedlock.core.identities import Scheduler, schedule_uid_of
from schedlock.core.logs import Event
from schedlock.operator import mapping
from schedlock.operator.kube import Kube, KubeError
from schedlock.store import Channel, HeldLock, PublishRecord, Store, StoreError

log = logging.getLogger("schedlock.operator.sync")
SYNC_LOCK_OBJID = 1
SYNC_CONCURRENCY = 6  # objects synced at once (the official client runs each call in a thread)


class KubeApi(Protocol):
    async def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...
    async def post_event(
        self, obj: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None: ...


def object_uid(record: PublishRecord) -> str:
    """The ScheduledPublish uid behind a row (a recurring slot's uid is ``<uid>@<slot>``)."""
    return schedule_uid_of(record.uid) if record.scheduler == Scheduler.RECURRING else record.uid


class StatusSync:
    def __init__(
        self, store: Store, kube: KubeApi | None, *, sweep_seconds: float, holder: str
    ) -> None:
        self.store = store
        self._kube = kube
        self.sweep_seconds = sweep_seconds
        self.holder = holder
        self.active = False
        self._pending: set[int] = set()
        self._wake = asyncio.Event()
        self._watermark: datetime | None = None

    @property
    def kube(self) -> KubeApi:
        if self._kube is None:
            self._kube = Kube()
        return self._kube

    async def run(self, stopping: asyncio.Event) -> None:
        delay = 1.0
        while not stopping.is_set():
            held: HeldLock | None = None
            try:
                acquire = asyncio.create_task(
                    self.store.hold_lock(SYNC_LOCK_OBJID, f"{self.holder}-sync")
                )
                stop = asyncio.create_task(stopping.wait())
                await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if not acquire.done():
                    acquire.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StoreError):
                        held = await acquire
                    break
                held = acquire.result()
                log.info(
                    "status sync active",
                    extra={"event": Event.STATUS_SYNC_ACTIVE, "holder": self.holder},
                )
                self.active = True
                delay = 1.0
                await self._active(held, stopping)
            except StoreError as exc:
                log.warning(
                    "status sync interrupted, retrying",
                    extra={"event": Event.STATUS_SYNC_INTERRUPTED, "error": str(exc)},
                )
            finally:
                self.active = False
                if held is not None:
                    await held.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)
            delay = min(delay * 2, 10.0)

    def _on_outcomes(self, payload: str) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            self._pending.update(int(i) for i in json.loads(payload)["ids"])
            self._wake.set()

    async def _active(self, held: HeldLock, stopping: asyncio.Event) -> None:
        ready = asyncio.Event()
        listener = asyncio.create_task(
            self.store.listen(Channel.OUTCOMES, self._on_outcomes, ready), name="sync-listen"
        )
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), 5)
            next_sweep = 0.0
            loop = asyncio.get_running_loop()
            while not stopping.is_set():
                if listener.done():
                    listener.result()  # re-raise StoreError: reconnect everything
                if loop.time() >= next_sweep:
                    await self.sweep()
                    await held.ping()
                    next_sweep = loop.time() + self.sweep_seconds
                ids, self._pending = self._pending, set()
                self._wake.clear()
                if ids:
                    await self.sync_records(await self.store.publishes_by_id(sorted(ids)))
                waiters = {
                    asyncio.ensure_future(self._wake.wait()),
                    asyncio.ensure_future(stopping.wait()),
                }
                timeout = max(0.0, next_sweep - loop.time())
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for waiter in waiters:
                    waiter.cancel()
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def sweep(self) -> None:
        """Re-sync every row changed since the last sweep (all rows on the first one)."""
        while True:
            records, watermark = await self.store.changed_since(self._watermark)
            await self.sync_records(records)
            self._watermark = watermark
            if len(records) < 500:
                return

    async def sync_records(self, records: list[PublishRecord]) -> None:
        latest: dict[str, PublishRecord] = {}
        for record in records:
            uid = object_uid(record)
            if uid.startswith("cli-"):
                continue  # rows written by `schedlock publish`/`schedule` have no object
            latest[uid] = record
        slots = asyncio.Semaphore(SYNC_CONCURRENCY)

        async def sync(uid: str, record: PublishRecord) -> None:
            async with slots:
                try:
                    await self.sync_one(uid, record)
                except KubeError as exc:
                    log.warning(
                        "could not sync a status",
                        extra={
                            "event": Event.STATUS_SYNC_FAILED,
                            "object": f"{record.namespace}/{record.name}",
                            "error": str(exc),
                        },
                    )

        # one task per object (so one object's GET, PATCH and Event stay in order), a few
        # objects at a time: a burst of outcomes is not synced one round trip after another
        await asyncio.gather(*(sync(uid, record) for uid, record in latest.items()))

    async def sync_one(self, uid: str, record: PublishRecord) -> None:
        obj = await self.kube.get(record.namespace, record.name)
        if obj is None or obj["metadata"].get("uid") != uid:
            return  # deleted, or re-created under the same name (a different object)
        old = obj.get("status") or {}
        now = datetime.now(UTC)
        if record.scheduler == Scheduler.RECURRING:
            schedule = await self.store.get_schedule(uid)
            if schedule is None:
                return
            last_slot = await self.store.latest_slot(uid)
            new = mapping.status_for_schedule(schedule, last_slot, old, schedule.generation, now)
        else:
            new = mapping.status_for_publish(record, old, record.generation, now)
        if not mapping.status_changed(old, new):
            return
        await self.kube.patch_status(record.namespace, record.name, new)
        event = mapping.event_for(old, new)
        if event is not None:
            await self.kube.post_event(
                obj, type_=event.type, reason=event.reason, message=event.message
            )
