"""One in-memory store for the in-process tests: :class:`MemoryStore` implements
``schedlock.store.Store`` and its sessions implement ``LockSession`` (mypy checks both, so a
change of the contract fails the unit tier), the way procrastinate's ``InMemoryConnector``
implements its connector.  :class:`MemoryApp` is the app as the sidecar sees it: its presence
(``AppPresence``, ``firing.AppCheck``) and its deliveries (``firing.Deliveries``).

What the store keeps is what PostgreSQL keeps for the elector, the firing loop and the
operator's status sync:

- the target's leadership lock and its queue of waiters, granted in order, at once, when the
  holder's session ends or unlocks; a key's own lock on the holder's session is always free
  (``lock_key``).  ``squat`` is a session of a foreign role holding it: the waiters hear of it
  as the ``lock`` statement's notices would tell them;
- the term counter and the release record; the standby places (try-locks); the reserve roster,
  whose entries expire on the loop's clock; the open sessions and refused connections
  (``refuse``); :meth:`MemoryStore.end` is the server ending a session (its lease ran out, it
  was killed, ``pg_terminate_backend``);
- the key's due rows (``add_due``, ``claim_due``, ``complete``) and NOTIFY (``listen``,
  :meth:`MemoryStore.notify`);
- locks by object id (``hold_lock``), the sync cursors and the publish records the sync reads.

Each session's ``beats`` says what its heartbeats do: ``ok``, ``hang`` (a frozen network) or
``fail``.  ``steps`` lists what the sessions did, as ``holder:step``.  Verbs no in-process
test needs raise :class:`NotImplementedError` naming the verb: the integration tier runs them
on PostgreSQL and SQLite.

Time is the running loop's (``schedlock.core.aio.now``; the database's clock, ``db_clock``,
follows it unless a test fixes the database's time): on ``testbed.virtual_time`` the tests are
exact and instant.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import InitVar, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NoReturn

from schedlock.core.aio import Toggle, now
from schedlock.core.scheduling import AttemptResult
from schedlock.sidecar.delivery import Delivery
from schedlock.sidecar.firing import AppCheck, Deliveries
from schedlock.sidecar.lock import AppPresence
from schedlock.store import models
from schedlock.store.contract import HeldLock, LockSession, Maintenance, Store
from schedlock.store.errors import ConnectionsExhausted, StoreUnavailable, UnlockFailed
from schedlock.store.keys import LockKey, TargetLock
from schedlock.store.verbs import SWEEP_OVERLAP

KEY = LockKey("publish", "default", "demo")
DB_EPOCH = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _not_kept(verb: str) -> NoReturn:
    raise NotImplementedError(f"{verb}: not kept in memory (the integration tier runs it)")


def _db_clock() -> datetime:
    return DB_EPOCH + timedelta(seconds=now())


def publish_record(
    id_: int, uid: str, *, state: str = "published", generation: int = 1, at: datetime = DB_EPOCH
) -> models.PublishRecord:
    """A one-shot row of namespace ``ns``, named as its uid, that fired once at ``at``."""
    return models.PublishRecord(
        id=id_, scheduler="publish", namespace="ns", name=uid, uid=uid, generation=generation,
        target="demo", due_at=at, next_attempt_at=at, payload={}, state=state, attempts=1,
        max_attempts=5, term=1, holder="h", last_status=200, last_error=None, fired_at=at,
        finished_at=at,
    )  # fmt: skip


@dataclass(eq=False)
class MemoryHeldLock:
    """A lock by object id on a session of its own (``Store.hold_lock``)."""

    store: MemoryStore
    objid: int
    holder: str
    fails_ping: bool = False
    pings: list[float] = field(default_factory=list)
    closed: bool = False

    async def ping(self) -> None:
        self.pings.append(now())
        if self.fails_ping:
            raise StoreUnavailable("the lock's session ended")

    async def close(self) -> None:
        self.closed = True
        if self.store.object_locks.get(self.objid) is self:
            del self.store.object_locks[self.objid]
        self.store.object_lock_freed.set()


@dataclass
class MemoryStore:
    db_clock: Callable[[], datetime] = _db_clock
    dialect: str = "memory"
    notifies: bool = True  # :meth:`notify` reaches the listeners, as NOTIFY does
    url: str = "memory://"
    # connections
    refuse: bool = False
    connects: int = 0
    refusals: int = 0
    sessions: set[MemorySession] = field(default_factory=set)
    steps: list[str] = field(default_factory=list)
    # the target's leadership lock
    holder: MemorySession | None = None
    queue: list[tuple[MemorySession, asyncio.Future[None]]] = field(default_factory=list)
    foreign: models.ForeignHolder | None = None  # what the waiters hear of a foreign holder
    term: int = 0
    last_holder: str | None = None
    released_at: float | None = None
    released: bool = False
    places: dict[int, MemorySession] = field(default_factory=dict)
    roster: dict[str, float] = field(default_factory=dict)  # holder -> expires (the loop's clock)
    # the key's rows: (due at the loop's now(), row)
    due: list[tuple[float, models.FireRow]] = field(default_factory=list)
    claims: list[tuple[float, int]] = field(default_factory=list)  # (when, limit)
    completed: list[tuple[float, models.Completion]] = field(default_factory=list)
    listeners: dict[str, list[models.OnPayload]] = field(default_factory=dict)
    # the operator's side
    object_locks: dict[int, MemoryHeldLock] = field(default_factory=dict)
    object_lock_freed: asyncio.Event = field(default_factory=asyncio.Event)
    held: list[MemoryHeldLock] = field(default_factory=list)
    next_held_fails_ping: bool = False
    cursors: dict[str, datetime] = field(default_factory=dict)
    cursor_reads: list[models.SyncCursor] = field(default_factory=list)
    publishes: dict[int, models.PublishRecord] = field(default_factory=dict)
    changed_at: dict[int, datetime] = field(default_factory=dict)  # id -> updated_at
    schedules: dict[str, models.ScheduleRecord] = field(default_factory=dict)
    sweeps: list[tuple[float, models.SweepPosition]] = field(default_factory=list)
    reads: list[tuple[float, str, object]] = field(default_factory=list)  # (when, verb, args)
    # a pruning pass's session (``maintenance``), its verbs as the test scripts them
    maintenance_session: Maintenance | None = None

    # -- what a test does to the database ------------------------------------------------------

    def occupied_by(self, holder: str) -> MemorySession:
        """Another replica (not under test) holds the lock until it unlocks or ends."""
        session = MemorySession(self, KEY, holder)
        self.sessions.add(session)
        self.holder = session
        return session

    def squat(self, foreign: models.ForeignHolder | None) -> None:
        """The lock's holder is (or is no longer, None) a session of a foreign role: every
        waiter hears it, once per change, as the ``lock`` statement's notices would say."""
        if foreign == self.foreign:
            return
        self.foreign = foreign
        for waiter, _granted in self.queue:
            if waiter.on_holder is not None:
                waiter.on_holder(foreign)

    def unlock(self, session: MemorySession, *, released: bool) -> None:
        if self.holder is not session:
            return
        self.holder, self.released_at, self.released = None, now(), released
        self.foreign = None
        while self.queue and self.holder is None:
            waiter, granted = self.queue.pop(0)
            if not granted.done():
                self.holder = waiter
                granted.set_result(None)

    def end(self, session: MemorySession) -> None:
        """The server ends a session (its lease ran out, it was killed): its locks go, and a
        statement waiting on it fails."""
        waiting = session.waiting
        self._drop(session)
        session.ended.set()
        if waiting is not None and not waiting.done():
            waiting.set_exception(StoreUnavailable("terminating connection"))

    def _drop(self, session: MemorySession) -> None:
        session.dead = True
        self.sessions.discard(session)
        for place in [p for p, s in self.places.items() if s is session]:
            del self.places[place]
        self.queue = [(s, f) for s, f in self.queue if s is not session]
        self.unlock(session, released=False)

    def live_roster(self) -> list[str]:
        return sorted(h for h, expires in self.roster.items() if expires > now())

    def add_due(self, row: models.FireRow, in_seconds: float = 0.0) -> None:
        self.due.append((now() + in_seconds, row))

    def outcomes(self) -> dict[int, str]:
        return {c.id: c.outcome for _, c in self.completed}

    def notify(self, channel: str, payload: str | bytes) -> None:
        """NOTIFY ``channel``: every listener hears ``payload`` (anyone may send anything)."""
        for listener in self.listeners.get(channel, []):
            listener(payload)

    def put(self, record: models.PublishRecord, changed_at: datetime | None = None) -> None:
        """A row as the sidecars left it, changed at ``changed_at`` (default: now, database
        clock)."""
        self.publishes[record.id] = record
        self.changed_at[record.id] = self.db_clock() if changed_at is None else changed_at

    def _read(self, verb: str, args: object) -> None:
        self.reads.append((now(), verb, args))

    def read(self, verb: str) -> list[object]:
        """The arguments of each call of the read ``verb``, in order."""
        return [args for _, name, args in self.reads if name == verb]

    # -- Sessions -------------------------------------------------------------------------------

    async def close(self) -> None:
        for session in list(self.sessions):
            self._drop(session)

    async def grant(self, request: models.GrantRequest) -> models.GrantReport:
        _not_kept("grant")

    async def missing_privileges(self, component: str) -> tuple[str, list[str]]:
        return "memory", []

    async def served_namespaces(self) -> models.ServedNamespaces:
        _not_kept("served_namespaces")

    def lock_session(
        self, key: LockKey, holder: str, lease_seconds: float, target: TargetLock | None = None
    ) -> MemorySession:
        self.steps.append(f"{holder}:session")
        return MemorySession(self, key, holder)

    async def listen(
        self,
        channel: str,
        on_payload: models.OnPayload,
        ready: asyncio.Event | None = None,
    ) -> None:
        """A dedicated listening session: listens until cancelled."""
        self.listeners.setdefault(channel, []).append(on_payload)
        if ready is not None:
            ready.set()
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            self.listeners[channel].remove(on_payload)

    async def hold_lock(self, objid: int, holder: str) -> MemoryHeldLock:
        while objid in self.object_locks:
            self.object_lock_freed.clear()
            await self.object_lock_freed.wait()
        held = MemoryHeldLock(self, objid, holder, fails_ping=self.next_held_fails_ping)
        self.next_held_fails_ping = False
        self.object_locks[objid] = held
        self.held.append(held)
        return held

    # -- Store ----------------------------------------------------------------------------------

    async def migrate(self, *, to: int | None = None, force: bool = False) -> list[int]:
        return []

    async def schema_status(self) -> models.SchemaStatus:
        _not_kept("schema_status")

    async def upsert_publish(self, spec: models.PublishSpec) -> models.UpsertResult:
        _not_kept("upsert_publish")

    async def upsert_schedule(self, spec: models.ScheduleSpec) -> models.UpsertResult:
        _not_kept("upsert_schedule")

    async def upsert_many(
        self, specs: Sequence[models.PublishSpec | models.ScheduleSpec]
    ) -> list[models.UpsertResult]:
        _not_kept("upsert_many")

    async def cancel_publish(self, uid: str) -> bool:
        _not_kept("cancel_publish")

    async def cancel_schedule(self, uid: str) -> int:
        _not_kept("cancel_schedule")

    async def key_status(self) -> list[models.KeyStatus]:
        _not_kept("key_status")

    async def session_budget(self) -> models.SessionBudget:
        _not_kept("session_budget")

    async def get_publish(self, uid: str) -> models.PublishRecord | None:
        self._read("get_publish", uid)
        return next((r for r in self.publishes.values() if r.uid == uid), None)

    async def get_schedule(self, uid: str) -> models.ScheduleRecord | None:
        self._read("get_schedule", uid)
        return self.schedules.get(uid)

    async def latest_slot(self, schedule_uid: str) -> models.PublishRecord | None:
        self._read("latest_slot", schedule_uid)
        slots = [r for r in self.publishes.values() if r.uid.startswith(f"{schedule_uid}@")]
        return max(slots, key=lambda r: r.due_at, default=None)

    async def changed_since(
        self, since: models.SweepPosition, limit: int = models.SWEEP_PAGE
    ) -> tuple[list[models.PublishRecord], models.SweepPosition]:
        """Rows changed since ``since``, as :mod:`schedlock.store.verbs` pages them."""
        self.sweeps.append((now(), since))
        db_now = self.db_clock()
        changed = sorted(
            (at, id_)
            for id_, at in self.changed_at.items()
            if at > since.at or (at == since.at and id_ > since.after_id)
        )[:limit]
        records = [self.publishes[id_] for _, id_ in changed]
        if len(changed) == limit:
            return records, models.SweepPosition(*changed[-1])
        return records, models.SweepPosition(db_now - SWEEP_OVERLAP)

    async def publishes_by_id(self, ids: Sequence[int]) -> list[models.PublishRecord]:
        self._read("publishes_by_id", list(ids))
        return [self.publishes[i] for i in ids if i in self.publishes]

    async def row_versions(self, uids: Sequence[str]) -> list[models.RowVersion]:
        self._read("row_versions", list(uids))
        wanted = set(uids)
        versions = [
            models.RowVersion("publish", r.uid, r.generation, r.state)
            for r in self.publishes.values()
            if r.uid in wanted
        ]
        versions += [
            models.RowVersion("schedule", s.uid, s.generation, s.state)
            for s in self.schedules.values()
            if s.uid in wanted
        ]
        return versions

    async def restore_publish(
        self, spec: models.PublishSpec, outcome: models.RecordedOutcome
    ) -> models.UpsertResult:
        _not_kept("restore_publish")

    @asynccontextmanager
    async def maintenance(self) -> AsyncIterator[Maintenance]:
        if self.maintenance_session is None:
            _not_kept("maintenance")
        yield self.maintenance_session

    async def sync_cursor(self, name: str) -> models.SyncCursor:
        self.cursor_reads.append(models.SyncCursor(self.cursors.get(name), self.db_clock()))
        return self.cursor_reads[-1]

    async def store_sync_cursor(self, name: str, watermark_at: datetime, holder: str) -> None:
        self.cursors[name] = watermark_at


@dataclass(eq=False)
class MemorySession:
    """A lock session (``LockSession``); ``owner``: a key's session on its target's session
    (``lock_key``), whose term verbs go to the one lock and whose release only records it."""

    store: MemoryStore
    key: LockKey
    holder: str
    owner: MemorySession | None = None
    dead: bool = False
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # the server ended it
    # What the next heartbeats do: "ok", "hang" (a frozen network) or "fail" (an error).
    beats: str = "ok"
    on_holder: models.OnHolder | None = None
    waiting: asyncio.Future[None] | None = None

    @property
    def root(self) -> MemorySession:
        return self.owner or self

    @property
    def connected(self) -> bool:
        return self.root in self.store.sessions

    def _say(self, step: str) -> None:
        self.store.steps.append(f"{self.holder}:{step}")

    def _alive(self) -> None:
        if self.root.dead:
            raise StoreUnavailable("server closed the connection unexpectedly")

    async def connect(self) -> None:
        self._say("connect")
        if self.store.refuse:
            self.store.refusals += 1
            raise ConnectionsExhausted("FATAL: sorry, too many clients already")
        self.store.connects += 1
        self.store.sessions.add(self)

    async def close(self) -> None:
        self._say("close")
        self.store._drop(self.root)

    async def try_acquire(self) -> bool:
        self._say("try_acquire")
        self._alive()
        return self._take_if_free()

    def _take_if_free(self) -> bool:
        store = self.store
        if store.holder is None and not store.queue:
            store.holder = self
            return True
        return False

    async def acquire(self, on_holder: models.OnHolder | None = None) -> None:
        self._say("acquire")
        self._alive()
        if self._take_if_free():
            return
        store = self.store
        self.on_holder = on_holder
        self.waiting = asyncio.get_running_loop().create_future()
        store.queue.append((self, self.waiting))
        if on_holder is not None and store.foreign is not None:
            on_holder(store.foreign)
        await self.waiting

    async def lock_key(
        self, key: LockKey, on_holder: models.OnHolder | None = None
    ) -> MemorySession:
        """The key's own lock, on this session (leading its target): always free here."""
        self._alive()
        return MemorySession(self.store, key, self.holder, owner=self.root)

    async def begin_term(self) -> models.TermStart:
        self._alive()
        store = self.store
        store.term += 1
        gap = None if store.released_at is None else now() - store.released_at
        start = models.TermStart(store.term, store.last_holder, gap, store.released)
        store.last_holder = self.holder
        self._say(f"term:{store.term}")
        return start

    async def heartbeat(self, term: int) -> models.Heartbeat:
        self._alive()
        if self.root.beats == "hang":
            await asyncio.get_running_loop().create_future()
        if self.root.beats == "fail":
            raise StoreUnavailable("heartbeat failed: connection reset")
        backlog = sum(1 for at, _ in self.store.due if at <= now())
        return models.Heartbeat(alive=True, backlog=backlog, oldest_due_age=None)

    async def release(self, term: int | None) -> None:
        self._alive()
        if term is not None:
            self._say(f"release:{term}")
        if self.owner is not None:
            return  # a key's lock: the target session's release unlocks
        if self.store.holder is not self:
            raise UnlockFailed("unlock returned false")
        self.store.unlock(self, released=True)

    async def listen(self, channel: str, on_payload: models.OnPayload) -> None:
        self.store.listeners.setdefault(channel, []).append(on_payload)

    async def take_standby_place(self, places: int) -> int | None:
        for place in range(places):
            if place not in self.store.places:
                self.store.places[place] = self
                return place
        return None

    async def leave_standby_place(self) -> None:
        for place in [p for p, s in self.store.places.items() if s is self]:
            del self.store.places[place]

    async def reserve_roster(self) -> models.ReserveRoster:
        others = [h for h in self.store.live_roster() if h != self.holder]
        rank = sum(1 for h in others if h < self.holder)
        return models.ReserveRoster(db_now=now(), rank=rank, reserves=len(others) + 1)

    async def enlist_reserve(self, next_check_in: float, grace: float) -> None:
        self.store.roster[self.holder] = now() + next_check_in + grace

    async def leave_reserves(self) -> None:
        self.store.roster.pop(self.holder, None)

    async def adopt_orphans(self, term: int) -> list[models.FireRow]:
        return []  # a claimed row is completed in the same term here

    async def claim_due(self, term: int, limit: int) -> models.ClaimResult:
        store, at = self.store, now()
        store.claims.append((at, limit))
        ready = sorted((r for r in store.due if r[0] <= at), key=lambda r: r[0])[:limit]
        store.due = [r for r in store.due if r not in ready]
        later = [due - at for due, _ in store.due]
        return models.ClaimResult([r for _, r in ready], min(later) if later else None)

    async def complete(self, term: int, completions: Sequence[models.Completion]) -> int:
        self.store.completed.extend((now(), c) for c in completions)
        return len(completions)

    async def due_schedules(self, limit: int) -> list[models.DueSchedule]:
        return []

    async def next_slot_in(self) -> float | None:
        return None

    async def insert_slot(
        self, term: int, schedule_id: int, slot_uid: str, slot_at: datetime
    ) -> bool:
        _not_kept("insert_slot")

    async def advance_schedule(
        self, term: int, schedule_id: int, advance: models.ScheduleAdvance
    ) -> None:
        _not_kept("advance_schedule")


@dataclass
class MemoryApp:
    """The app as the sidecar sees it: reachable or not, never both (the elector's
    ``AppPresence``; the firing loop's ``AppCheck``), and its deliveries (``Deliveries``), each
    taking ``takes`` seconds and answering ``status``."""

    present: InitVar[bool] = True
    takes: float = 0.0
    status: int = 200
    reason: str = "connection refused"
    reachable: Toggle = field(default_factory=Toggle)
    started: list[tuple[float, int]] = field(default_factory=list)  # (when, row id)
    inflight: int = 0
    most_inflight: int = 0

    def __post_init__(self, present: bool) -> None:
        self.set(present)

    def set(self, up: bool) -> None:
        self.reachable.turn(up)

    @property
    def up(self) -> bool:
        return self.reachable.is_on()

    def worth_confirming(self, *, connection_lost: bool, status: int | None) -> bool:
        return False

    async def confirm(self, failure: str = "") -> bool:
        return self.up

    async def deliver(self, row: models.FireRow, term: int) -> Delivery:
        self.started.append((now(), row.id))
        self.inflight += 1
        self.most_inflight = max(self.most_inflight, self.inflight)
        try:
            await asyncio.sleep(self.takes)
        finally:
            self.inflight -= 1
        return Delivery(AttemptResult(status=self.status))


def _check_contract(store: MemoryStore, session: MemorySession, app: MemoryApp) -> None:
    """Never called: here mypy checks that the fakes implement the product's protocols."""
    _store: Store = store
    _session: LockSession = session
    _held: HeldLock = MemoryHeldLock(store, 0, "")
    _presence: AppPresence = app
    _check: AppCheck = app
    _deliveries: Deliveries = app
    del _store, _session, _held, _presence, _check, _deliveries
