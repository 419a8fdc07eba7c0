"""Leadership of one lock key — the state machine every sidecar replica runs per key.

A lock key is (scheduler, namespace, target).  Exactly one replica per key leads::

  ┌─────────────────┐ app reachable  ┌──────────────┐ session opened, ┌───────────┐
  │ WAITING_FOR_APP │ (success ────▶ │ DISCONNECTED │ lease set, key ▶│ FOLLOWING │
  │  (no session)   │  threshold)    └──────────────┘ registered      └───────────┘
  └─────────────────┘                     ▲                             │       │
     ▲        ▲  app unreachable: close   │ session died / heartbeat    │       │ lock granted
     │        └─ the session (no lock) ───┼─────────────────────────────┘       │ + affinity
     │                                    │ late: close, back off               │ + term bumped
     │                                    │                                     ▼
     │  app unreachable: stop claiming,   └───────────────────────────────┌─────────┐
     └─ return unsent rows, finish or abandon in-flight, checked unlock ──│ LEADING │
                                                                          └─────────┘
                             SIGTERM: finish or abandon in-flight, checked      │
                             unlock, exit 0 ──────────────▶ RELEASED ◀──────────┘

Invariants (DESIGN.md "Leadership"):

1. One dedicated connection per lock; the lock, its heartbeat and every row transition of
   the key go through it.  An unlock that returns false raises :class:`UnlockFailed`.
2. Fenced by construction: transitions run on the lock session and re-check the term; a
   session only loses the lock by ending, after which its statements fail.
3. Right after acquiring, the term is bumped on the lock session; rows left ``firing`` by an
   earlier term are adopted and fired again with the same idempotency key.
4. Followers block in ``pg_advisory_lock`` (no polling, no queries): the server grants the lock
   to the next waiter within milliseconds of the holder's session ending.  The session's
   ``idle_session_timeout`` is a server-side lease: a frozen or partitioned leader loses its
   session after the lease whatever the network does.  The leader heartbeats every
   ``heartbeat_seconds`` and steps down when no heartbeat succeeded for lease minus a margin.
5. Keys use the two-int4 advisory lock form with a fixed class id (``schedlock.store.keys``).
6. After acquiring, a second transaction must see the lock in ``pg_locks`` for this backend;
   a transaction-mode pooler fails that check and the process exits with a clear error.
7. SQLite: single process, leadership always granted, the same loop.
8. Leadership follows the app (``schedlock.sidecar.target``): no session — so no place in
   the lock queue — while the app is unreachable; a follower whose app goes away closes its
   session; a leader whose app goes away ends its term like a graceful stop (rows not sent go
   back to ``scheduled`` with their attempt not counted; in-flight ones finish within the
   grace or stay ``firing`` for the next term to adopt with the same idempotency key), records
   the release and unlocks (checked), so the next waiter is granted at once.  A lock granted
   just as the app went away is unlocked before any term starts.  Competing again needs the
   success threshold of passing checks in a row: no flapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from schedlock.sidecar.metrics import SidecarMetrics
from schedlock.store import (
    LeadershipLost,
    LockKey,
    LockKeyCollision,
    LockSession,
    Store,
    StoreError,
    StoreUnavailable,
    TermStart,
    UnlockFailed,
    UnsafeConnection,
)

log = logging.getLogger("schedlock.lock")

# Errors that no retry can fix: the process must stop and say why.
FATAL = (UnsafeConnection, LockKeyCollision, UnlockFailed)


class Role(enum.Enum):
    WAITING_FOR_APP = "waiting_for_app"
    DISCONNECTED = "disconnected"
    FOLLOWING = "following"
    LEADING = "leading"
    RELEASED = "released"


@dataclass
class Leadership:
    """What the leader's work loop may consult: the term and whether the lease still holds."""

    key: LockKey
    session: LockSession
    term: int
    step_down_after: float
    last_heartbeat_ok: float  # time.monotonic() of the last successful heartbeat

    def lease_ok(self) -> bool:
        """False once no heartbeat succeeded within lease minus margin (e.g. after a freeze)."""
        return time.monotonic() - self.last_heartbeat_ok < self.step_down_after


LeaderWork = Callable[[Leadership, asyncio.Event], Awaitable[None]]


class AppPresence(Protocol):
    """Whether this sidecar's own app can take fires (``schedlock.sidecar.target``).

    Exactly one of the two events is set at any time.
    """

    reachable: asyncio.Event
    unreachable: asyncio.Event
    reason: str


class KeyElector:
    """Runs the state machine for one key until ``stopping`` is set, calling ``work`` as leader."""

    def __init__(
        self,
        store: Store,
        key: LockKey,
        *,
        holder: str,
        lease_seconds: float,
        heartbeat_seconds: float,
        step_down_after: float,
        metrics: SidecarMetrics,
        work: LeaderWork,
        app: AppPresence,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.key = key
        self.holder = holder
        self.lease_seconds = lease_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.step_down_after = step_down_after
        self.metrics = metrics
        self.work = work
        self.app = app
        self.rng = rng or random.Random()
        self.role = Role.DISCONNECTED
        self.last_error: str | None = None  # why the last session ended (for /readyz)
        self.labels = (key.scheduler, key.namespace, key.target)
        metrics.init_key(*self.labels)

    @property
    def connected(self) -> bool:
        return self.role in (Role.FOLLOWING, Role.LEADING)

    @property
    def waiting_for_app(self) -> bool:
        return self.role is Role.WAITING_FOR_APP

    async def run(self, stopping: asyncio.Event) -> None:
        backoff = 0.2
        while not stopping.is_set():
            if not self.app.reachable.is_set():
                # No session at all while the app is away: a waiter in pg_advisory_lock could
                # be granted leadership it cannot use.
                self._set_role(Role.WAITING_FOR_APP)
                if not await _first(self.app.reachable, stopping) or stopping.is_set():
                    break
            session = self.store.lock_session(self.key, self.holder, self.lease_seconds)
            failed = False
            try:
                await session.connect()
                self._set_role(Role.FOLLOWING)
                self.last_error = None
                self.metrics.database_up.set(1)
                backoff = 0.2
                if await _until(session.acquire(), stopping, self.app.unreachable):
                    await self._lead(session, stopping)
            except FATAL:
                raise
            except (StoreUnavailable, LeadershipLost, StoreError) as exc:
                failed = True
                self.last_error = str(exc)
                if isinstance(exc, StoreUnavailable):
                    self.metrics.database_up.set(0)
                level = logging.WARNING if self.role is Role.LEADING else logging.INFO
                log.log(
                    level,
                    "lock session lost, reconnecting",
                    extra={"key": str(self.key), "role": self.role.value, "error": str(exc)},
                )
            finally:
                if self.role is Role.LEADING:
                    self._lost()
                await session.close()
                if self.role not in (Role.RELEASED, Role.WAITING_FOR_APP):
                    self._set_role(Role.DISCONNECTED)
            if stopping.is_set():
                break
            if not failed:
                continue  # the app went away: wait for it, no back-off (nothing failed)
            delay = backoff * (0.5 + self.rng.random())
            backoff = min(backoff * 2, 5.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)

    def _set_role(self, role: Role) -> None:
        self.role = role

    def _lost(self, direction: str = "lost") -> None:
        self.metrics.leader.labels(*self.labels).set(0)
        self.metrics.term.labels(*self.labels).set(0)
        self.metrics.backlog.labels(*self.labels).set(0)
        self.metrics.oldest_due_age.labels(*self.labels).set(0)
        self.metrics.transitions.labels(*self.labels, direction).inc()

    async def _lead(self, session: LockSession, stopping: asyncio.Event) -> None:
        if self.app.unreachable.is_set():
            # Granted just as the app went away: hand the lock on before starting a term.
            await session.release(None)
            self._handed_over(None)
            return
        start = await session.begin_term()
        self._set_role(Role.LEADING)
        self._acquired(start)
        leadership = Leadership(
            key=self.key,
            session=session,
            term=start.term,
            step_down_after=self.step_down_after,
            last_heartbeat_ok=time.monotonic(),
        )
        # The term ends gracefully on SIGTERM or when the app stops answering; the work
        # cannot tell the two apart, and need not: both finish or abandon in-flight rows.
        ending = asyncio.Event()

        async def end_term() -> None:
            await _first(stopping, self.app.unreachable)
            ending.set()

        try:
            async with asyncio.TaskGroup() as group:
                beat = group.create_task(self._heartbeat(leadership), name=f"heartbeat:{self.key}")
                ender = group.create_task(end_term(), name=f"term-end:{self.key}")
                await self.work(leadership, ending)
                beat.cancel()
                ender.cancel()
        except BaseExceptionGroup as group:
            raise first_leaf(group) from None
        # Reached only on a graceful end: the work finished or abandoned its in-flight rows.
        await session.release(leadership.term)
        self._lost("released")
        if stopping.is_set():
            self._set_role(Role.RELEASED)
            log.info("released leadership", extra={"key": str(self.key), "term": leadership.term})
        else:
            self._handed_over(leadership.term)

    def _handed_over(self, term: int | None) -> None:
        self._set_role(Role.WAITING_FOR_APP)
        log.warning(
            "app unreachable: handed leadership over",
            extra={
                "event": "leadership_handed_over",
                "key": str(self.key),
                "term": term,
                "error": self.app.reason,
            },
        )

    def _acquired(self, start: TermStart) -> None:
        self.metrics.leader.labels(*self.labels).set(1)
        self.metrics.term.labels(*self.labels).set(start.term)
        self.metrics.transitions.labels(*self.labels, "acquired").inc()
        self.metrics.last_tick.labels(*self.labels).set_to_current_time()
        if start.gap_seconds is not None and start.term > 1:
            self.metrics.handover_gap.labels(*self.labels).observe(max(0.0, start.gap_seconds))
        log.info(
            "acquired leadership",
            extra={
                "key": str(self.key),
                "term": start.term,
                "previous_holder": start.previous_holder,
                "previous_released": start.previous_released,
                "gap_ms": None if start.gap_seconds is None else round(start.gap_seconds * 1000, 1),
            },
        )

    async def _heartbeat(self, leadership: Leadership) -> None:
        """Prove the session alive; raise LeadershipLost when the lease can't be confirmed."""
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            budget = leadership.last_heartbeat_ok + self.step_down_after - time.monotonic()
            if budget <= 0:
                raise LeadershipLost(f"no heartbeat for {self.step_down_after:.1f}s: stepping down")
            try:
                beat = await asyncio.wait_for(leadership.session.heartbeat(leadership.term), budget)
            except TimeoutError as exc:
                raise LeadershipLost(
                    f"heartbeat did not succeed within {self.step_down_after:.1f}s: stepping down"
                ) from exc
            leadership.last_heartbeat_ok = time.monotonic()
            self.metrics.backlog.labels(*self.labels).set(beat.backlog)
            self.metrics.oldest_due_age.labels(*self.labels).set(beat.oldest_due_age or 0.0)
            self.metrics.last_tick.labels(*self.labels).set_to_current_time()


def first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first real exception inside a (nested) exception group."""
    first = group.exceptions[0]
    return first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def _first(*events: asyncio.Event) -> bool:
    """Wait until one of ``events`` is set; True when it is the first one."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return events[0].is_set()


async def _until(call: Awaitable[None], *unless: asyncio.Event) -> bool:
    """Await ``call`` unless one of ``unless`` is set first (then cancel it and return False)."""
    task = asyncio.ensure_future(call)
    stops = [asyncio.ensure_future(event.wait()) for event in unless]
    try:
        await asyncio.wait({task, *stops}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for stop in stops:
            stop.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, StoreError):
        await task
    return False
