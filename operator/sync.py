"""Status sync: outcomes flow from the database back into ``.status`` and Events.

docs/architecture.md ("Status sync") has the flow and its costs.  What this module keeps:

* A status is delayed, never lost: a notification (``schedlock_outcomes``) syncs its rows at
  once, and a sweep from a durable cursor (never from the epoch) makes up for any lost one.
* Events are decided against the status already in the API (the index of the objects, or the
  sync's own last write until the watch shows it), so replays and sweeps never post twice.
* Requests are bounded: no GET once the operator has listed the objects (:func:`lookup`), at
  most ``UNLISTED_GETS`` per pass before.
* A row back in ``scheduled`` under a status that records its outcome for the same generation
  is never reflected: the status keeps the outcome and the re-assertion is woken to restore it.
* One operator replica syncs at a time: the holder of the advisory lock
  ``(SCHEDLOCK_CLASS_ID, SYNC_LOCK_OBJID)`` on its own session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, Protocol

from schedlock.core.aio import Backoff, Companion, RateLimit, sleep_unless, unless_set, utcnow
from schedlock.core.identities import Scheduler, is_cli_uid, schedule_uid_of
from schedlock.core.logs import Event
from schedlock.operator import mapping, reassert
from schedlock.operator.kube import KubeError
from schedlock.store import (
    SWEEP_PAGE,
    SYNC_LOCK_OBJID,
    Channel,
    HeldLock,
    PublishRecord,
    Store,
    StoreError,
    SweepPosition,
    SyncCursor,
)
from schedlock.store.notices import GARBLED_LOG_SECONDS, parse_outcomes

log = logging.getLogger("schedlock.operator.sync")
RETRY_FIRST = 1.0  # seconds: after an interrupted sync, doubling to RETRY_CAP (with jitter)
RETRY_CAP = 10.0
LISTEN_READY_SECONDS = 5.0  # how long the first sweep waits for LISTEN to be in place
SYNC_CONCURRENCY = 6  # objects synced at once (the official client runs each call in a thread)
SYNC_CURSOR = "status-sync"  # the cursor's name in schedlock_sync_cursors
# How long the process's first sweep waits for the operator's listing of the objects (seconds):
# a listing takes seconds; one the API server does not answer is retried, and the sweep goes on
# without it meanwhile (a GET per object the index lacks, bounded below).
LISTING_WAIT_SECONDS = 30.0
# GETs a pass may make for objects the index lacks before the listing (or outside the
# namespaces it covers): bounded, whatever the history it reads; the rest of such rows wait.
UNLISTED_GETS = 100
# A notification not understood may hide outcomes: the sweep that makes up for it runs at most
# this often (seconds), so a flood of garbage costs one cheap sweep a second, not one each.
GARBLED_SWEEP_SECONDS = 1.0


class KubeApi(Protocol):
    async def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...
    async def post_event(
        self, obj: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None: ...


def object_uid(record: PublishRecord) -> str:
    """The ScheduledPublish uid behind a row (a recurring slot's uid is ``<uid>@<slot>``)."""
    return schedule_uid_of(record.uid) if record.scheduler == Scheduler.RECURRING else record.uid


class Lookup(StrEnum):
    """How the sync reads the status of the object behind a row."""

    INDEX = "index"  # kopf's snapshot: no request
    GET = "get"  # one GET
    GONE = "gone"  # the object no longer exists: nothing to sync
    DEFERRED = "deferred"  # the pass spent its GETs: skipped (see UNLISTED_GETS)


def lookup(
    *, indexed: bool, listed: bool, covered: bool, seen_gone: bool, gets_left: int
) -> Lookup:
    """Where an object's status comes from.  ``listed``: the operator has listed the objects;
    ``covered``: its index watches the row's namespace; ``seen_gone``: a GET of this pass
    found the object gone."""
    if indexed:
        return Lookup.INDEX
    if seen_gone or (listed and covered):
        return Lookup.GONE
    return Lookup.GET if gets_left > 0 else Lookup.DEFERRED


def start_from(cursor: SyncCursor, catch_up_seconds: float) -> SweepPosition:
    """Where a sync run starts: its stored cursor, or (none) a bounded catch-up before now."""
    if cursor.watermark_at is not None:
        return SweepPosition(cursor.watermark_at)
    return SweepPosition(cursor.now - timedelta(seconds=catch_up_seconds))


@dataclass
class Pass:
    """What one pass (a sweep, or one batch of notified outcomes) learns as it goes."""

    gets_left: int = UNLISTED_GETS
    gone: set[str] = field(default_factory=set)
    deferred: int = 0


@dataclass(eq=False)
class StatusSync:
    """The sync: rows in ``store`` -> status and Events through ``kube``."""

    store: Store
    kube: KubeApi
    _: KW_ONLY
    sweep_seconds: float
    holder: str
    catch_up_seconds: float
    known: Callable[[str], dict[str, Any] | None] = field(default=lambda _uid: None)
    # set once the operator has listed the objects (the index then holds every object there is)
    listed: asyncio.Event = field(default_factory=asyncio.Event)
    # the namespaces the index covers (an operator may serve only some)
    covers: Callable[[str], bool] = field(default=lambda _namespace: True)
    # called when a row lost the outcome its object's status records (the re-assertion's job)
    lost: Callable[[], None] = field(default=lambda: None)
    active: bool = field(default=False, init=False)
    _pending: set[int] = field(default_factory=set, init=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _position: SweepPosition | None = field(default=None, init=False)
    _listing_awaited: bool = field(default=False, init=False)
    garbled: int = field(default=0, init=False)  # notifications not understood, ever
    _sweep_soon: bool = field(default=False, init=False)
    _swept_at: float = field(default=-GARBLED_SWEEP_SECONDS, init=False)
    _garbled_said: RateLimit = field(
        default_factory=lambda: RateLimit(GARBLED_LOG_SECONDS), init=False
    )
    # uid -> (the index's snapshot when the sync patched, the status it wrote)
    _written: dict[str, tuple[object, dict[str, Any]]] = field(default_factory=dict, init=False)

    async def run(self, stopping: asyncio.Event) -> None:
        backoff = Backoff(RETRY_FIRST, RETRY_CAP)
        while not stopping.is_set():
            held: HeldLock | None = None
            try:
                granted = await unless_set(
                    self.store.hold_lock(SYNC_LOCK_OBJID, f"{self.holder}-sync"),
                    stopping,
                    abandon=lambda late: late.close(),
                    suppress=(StoreError,),
                )
                if granted is None:
                    break
                held = granted.value
                log.info(
                    "status sync active",
                    extra={"event": Event.STATUS_SYNC_ACTIVE, "holder": self.holder},
                )
                self.active = True
                backoff.reset()
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
            await backoff.sleep(stopping)

    def _on_outcomes(self, payload: str | bytes) -> None:
        # Anyone who can connect may NOTIFY this channel: a payload is a stranger's input.
        notice = parse_outcomes(payload)
        if notice.garbled:
            # It may stand for outcomes we will not hear of otherwise: sweep soon (once per
            # GARBLED_SWEEP_SECONDS however many arrive), and say so at debug, rate-limited.
            self._sweep_soon = True
            self.garbled += 1
            if self._garbled_said.ready(asyncio.get_running_loop().time()):
                log.debug(
                    "notification not understood, sweeping",
                    extra={
                        "event": Event.NOTIFICATION_GARBLED,
                        "channel": str(Channel.OUTCOMES),
                        "garbled_total": self.garbled,
                    },
                )
        if notice.ids or notice.garbled:
            self._pending.update(notice.ids)
            self._wake.set()

    async def _active(self, held: HeldLock, stopping: asyncio.Event) -> None:
        ready = asyncio.Event()
        async with Companion(
            "sync-listen",
            self.store.listen(Channel.OUTCOMES, self._on_outcomes, ready),
            logger=log,
        ) as listener:
            await sleep_unless(LISTEN_READY_SECONDS, ready)
            if not self._listing_awaited:
                await sleep_unless(LISTING_WAIT_SECONDS, self.listed, stopping)
                self._listing_awaited = True
            self._position = None  # the cursor: another replica may have synced meanwhile
            next_sweep = 0.0
            loop = asyncio.get_running_loop()
            while not stopping.is_set():
                listener.check()  # re-raise StoreError: reconnect everything
                if self._sweep_soon:
                    self._sweep_soon = False
                    next_sweep = min(next_sweep, self._swept_at + GARBLED_SWEEP_SECONDS)
                if loop.time() >= next_sweep:
                    self._swept_at = loop.time()
                    await self.sweep()
                    await held.ping()
                    next_sweep = loop.time() + self.sweep_seconds
                ids, self._pending = self._pending, set()
                self._wake.clear()
                if ids:
                    await self.sync_records(await self.store.publishes_by_id(sorted(ids)))
                await sleep_unless(next_sweep - loop.time(), self._wake, stopping)

    async def sweep(self) -> None:
        """Re-sync every row changed since the last sweep (or the cursor), then store where
        the next one starts."""
        self._written = {
            uid: written
            for uid, written in self._written.items()
            if self.known(uid) is written[0]  # the watch has not shown the write yet
        }
        if self._position is None:
            cursor = await self.store.sync_cursor(SYNC_CURSOR)
            self._position = start_from(cursor, self.catch_up_seconds)
            log.info(
                "status sync resumed",
                extra={
                    "event": Event.STATUS_SYNC_RESUMED,
                    "since": self._position.at.isoformat(),
                    "cursor": cursor.watermark_at is not None,
                },
            )
        pass_ = Pass()
        while True:
            records, position = await self.store.changed_since(self._position)
            await self.sync_records(records, pass_)
            self._position = position
            if len(records) < SWEEP_PAGE:
                break
        await self.store.store_sync_cursor(SYNC_CURSOR, self._position.at, self.holder)
        self._report(pass_)

    def _report(self, pass_: Pass) -> None:
        if pass_.deferred:
            log.warning(
                "status sync skipped rows of objects it could not look up",
                extra={
                    "event": Event.STATUS_SYNC_LOOKUPS_BOUNDED,
                    "skipped": pass_.deferred,
                    "gets": UNLISTED_GETS,
                },
            )

    async def sync_records(self, records: list[PublishRecord], pass_: Pass | None = None) -> None:
        """Sync each object's latest row among ``records`` (one pass of its own unless
        ``pass_`` is the sweep's)."""
        alone = pass_ is None
        pass_ = pass_ or Pass()
        latest: dict[str, PublishRecord] = {}
        for record in records:
            uid = object_uid(record)
            if is_cli_uid(uid):
                continue  # rows written by `schedlock publish`/`schedule` have no object
            latest[uid] = record
        slots = asyncio.Semaphore(SYNC_CONCURRENCY)

        async def sync(uid: str, record: PublishRecord) -> None:
            async with slots:
                try:
                    await self.sync_one(uid, record, pass_)
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
        if alone:
            self._report(pass_)

    async def sync_one(self, uid: str, record: PublishRecord, pass_: Pass) -> None:
        snapshot = self.known(uid)
        how = lookup(
            indexed=snapshot is not None,
            listed=self.listed.is_set(),
            covered=self.covers(record.namespace),
            seen_gone=uid in pass_.gone,
            gets_left=pass_.gets_left,
        )
        if how is Lookup.GONE:
            return
        if how is Lookup.DEFERRED:
            pass_.deferred += 1
            return
        obj = snapshot
        if how is Lookup.GET:
            pass_.gets_left -= 1
            obj = await self.kube.get(record.namespace, record.name)
        if obj is None or obj["metadata"].get("uid") != uid:
            pass_.gone.add(uid)
            return  # deleted, or re-created under the same name (a different object)
        old = obj.get("status") or {}
        written = self._written.get(uid)
        if written is not None and written[0] is snapshot:
            old = {**old, **written[1]}  # our last write, not on the watch yet
        else:
            self._written.pop(uid, None)  # the watch has shown it (or something newer)
        now = utcnow()
        if record.scheduler == Scheduler.RECURRING:
            schedule = await self.store.get_schedule(uid)
            if schedule is None:
                return
            last_slot = await self.store.latest_slot(uid)
            new = mapping.status_for_schedule(schedule, last_slot, old, schedule.generation, now)
        elif reassert.lost_outcome({**obj, "status": old}, record.generation, record.state):
            # The row went back in time (a restore, a lost transaction): the status keeps the
            # outcome and the re-assertion puts the row back in it, before it can fire again.
            self.lost()
            return
        else:
            new = mapping.status_for_publish(record, old, record.generation, now)
        if not mapping.status_changed(old, new):
            return
        await self.kube.patch_status(record.namespace, record.name, new)
        if snapshot is not None:
            self._written[uid] = (snapshot, new)
        event = mapping.event_for(old, new)
        if event is not None:
            await self.kube.post_event(
                obj, type_=event.type, reason=event.reason, message=event.message
            )
