"""Leadership of one target's lock keys — the state machine every sidecar replica runs.

A lock key is (scheduler, namespace, target); a sidecar runs the keys of its target on ONE
session.  A session can wait for one lock at a time, so replicas wait for the target's
leadership lock (``schedlock.store.keys.TargetLock``); its holder takes each key's own lock on
the same session without waiting (``LockSession.lock_key``) and leads that key; a key whose
lock another session holds (a replica of a release that locked per key, during a rolling
update; a squatter) is tried again every ``KEY_RETRY_SECONDS`` while the others are led.  The
keys' own locks fence the rows, as before.  Any failure of a key's term ends the session: both
keys move together.  Exactly one replica per target leads; at most ``standbys``
(``SCHEDLOCK_STANDBYS``, default 1) wait on a session of their own; every other replica is a
*reserve* and holds no session at all.  So a target costs at most ``1 + standbys`` database
sessions, whatever the replica count::

  state            its session                    leaves for
  ───────────────  ─────────────────────────────  ───────────────────────────────────────────
  WAITING_FOR_APP  none                           DISCONNECTED: app reachable (success
                                                  threshold of checks in a row)
  DISCONNECTED     connecting                     LEADING: the leadership lock was free
                                                  STANDBY: a standby place taken
                                                  RESERVE: no place free (enlist, close), or
                                                  refused for lack of slots (back-off)
                                                  itself: any other error (close, back off)
  RESERVE          none                           DISCONNECTED: its turn (or back-off) is due
                                                  WAITING_FOR_APP: app unreachable
  STANDBY          own: 1 place, blocked in       LEADING: lock granted + affinity checked +
                   pg_advisory_lock (0 queries/s)   place given back + term bumped
                                                  DISCONNECTED: session died
                                                  WAITING_FOR_APP: app unreachable (close)
  LEADING          own: the leadership lock, the  WAITING_FOR_APP: app unreachable (end the
                   keys' locks, LISTEN              terms, checked unlocks)
                                                  RELEASED: SIGTERM (end the term, checked
                                                    unlock, exit 0)
                                                  DISCONNECTED: session died / heartbeat late

Standby places.  Place ``i`` of a target is a two-int4 advisory lock in a class of its own
(``schedlock.store.keys``).  A replica connects and, if the leadership lock is free, takes it
at once and leads, holding no place (a place held for that moment would turn the replicas
starting beside it into reserves until their turn).  Otherwise it tries the places with
``pg_try_advisory_lock`` (never waiting) and, holding one, waits for the leadership lock on the
same session: a standby.
Granted, it gives its place back (checked unlock) so a reserve can take it; a standby that
dies frees its place with its session.  Every replica tries once when it starts or its app
comes back, so the first ones fill the places at once.

Reserves.  A replica that found every place taken enlists in the key's roster
(``schedlock_reserves``: holder, next check, expiry) and closes its connection.  It checks
again at its *turn* (``schedlock.sidecar.reserve``): turns of ``reserve_check_seconds``
(``SCHEDLOCK_RESERVE_CHECK_SECONDS``, default 5 s) on the database clock, dealt round-robin by
rank in the roster, so the reserves of a key together open about one short connection per
interval (a handful of statements) whatever their number — a reserve waits at 0 queries/s.
Taking a place, it leaves the roster.  The roster is also how ``schedlock status`` lists the
reserves, at no cost of its own: it is written only at checks that happen anyway.

Bounds.  Leader lost, standbys alive: the next standby is granted within milliseconds (the
server's lock queue).  Leader *and every standby* lost at once: some reserve's turn comes
within ``reserve_check_seconds * 1.1`` (turns plus at most a tenth of jitter); it takes a
place, the key's lock is free, it leads — plus one connection set-up.  A reserve that died
keeps its turns until its row expires (one missed turn at most each).

Refused connections.  A server out of slots ("too many clients", "remaining connection slots
are reserved", SQLSTATE 53300) — or a lock session of a role that would use a reserved slot —
makes the replica a reserve that waits for the later of its turn and a back-off doubling from
1 s to 60 s with jitter: no storm on a full database.  ``/readyz`` says so (and stays 200: the
pod's readiness gates the app's traffic), ``schedlock_database_connections_refused_total``
counts it; the leader and standbys keep their sessions.

Invariants (docs/architecture.md, "Leadership: the state machine"):

1. One dedicated connection per replica for the locks of its target; the locks, the
   heartbeats, every row transition of the keys and the leader's LISTEN go through it.  An
   unlock that returns false (a lock or a standby place) raises :class:`UnlockFailed`.
2. Fenced by construction: transitions run on the lock session and re-check the term; a
   session only loses the lock by ending, after which its statements fail.
3. Right after acquiring, the term is bumped on the lock session; rows left ``firing`` by an
   earlier term are adopted and fired again with the same idempotency key.
4. Standbys block in ``pg_advisory_lock`` (no polling, no queries: one statement that
   commits every ``LOCK_WAIT_SLICE_MS`` server-side, so it never holds back VACUUM): the
   server grants the lock to the next waiter within milliseconds of the holder's session
   ending.  The session's
   ``idle_session_timeout`` is a server-side lease: a frozen or partitioned leader loses its
   session after the lease whatever the network does.  The leader heartbeats every
   ``heartbeat_seconds`` and steps down when no heartbeat succeeded for lease minus a margin.
   Sessions per key are at most ``1 + standbys``; reserves hold none.
   Advisory locks have no ACL: after each slice, the wait asks whether the lock is held by a
   session whose login role may not serve the key's namespace (lock squatting, migration
   0009) and the server says each change as a notice while the statement runs, still no
   query.  A standby records it (``foreign_holder``: /readyz, the metric, the log) until the
   holder goes, the lock is granted or its wait ends.
5. Keys and standby places use the two-int4 advisory lock form with fixed class ids
   (``schedlock.store.keys``).
6. After acquiring, a second transaction must see the lock — and the standby place taken in an
   earlier transaction — in ``pg_locks`` for this backend; a transaction-mode pooler fails that
   check and the process exits with a clear error.
7. SQLite: single process, leadership always granted, the same loop (always a place).
8. Leadership follows the app (``schedlock.sidecar.target``): no session — so no place in
   the lock queue and no standby place — while the app is unreachable; a standby whose app
   goes away closes its session; a leader whose app goes away ends its term like a graceful
   stop (rows not sent go back to ``scheduled`` with their attempt not counted; in-flight ones
   finish within the grace or stay ``firing`` for the next term to adopt with the same
   idempotency key), records the release and unlocks (checked), so the next standby is granted
   at once.  A lock granted just as the app went away is unlocked before any term starts.
   Competing again needs the success threshold of passing checks in a row: no flapping.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from schedlock.core.aio import Backoff, Supervisor, Toggle, now, sleep_unless, unless_set, utcnow
from schedlock.core.identities import rfc3339_epoch
from schedlock.core.logs import Event
from schedlock.core.redact import printable
from schedlock.core.timings import LeaseTimings
from schedlock.sidecar.metrics import SidecarMetrics
from schedlock.sidecar.reserve import grace, next_check_in, refused_backoff
from schedlock.store import (
    ConnectionsExhausted,
    ForeignHolder,
    LeadershipLost,
    LockKey,
    LockKeyCollision,
    LockSession,
    SchemaChanged,
    Store,
    StoreError,
    StoreUnavailable,
    TargetLock,
    TermStart,
    UnlockFailed,
    UnsafeConnection,
    summary,
)
from schedlock.store.notices import ROLE_NAME_MAX

log = logging.getLogger("schedlock.lock")

# Errors that no retry can fix: the process must stop and say why.
UNSAFE = (UnsafeConnection, LockKeyCollision, UnlockFailed)
# ... and, once leading, a schema taken down under the process (a rollback's `migrate --to`):
# re-leading would re-deliver the rows in flight term after term.  Not fatal at start-up,
# where a schema not there yet is waited for.
FATAL = (*UNSAFE, SchemaChanged)
# Errors that end a session, not the process: reconnect (with back-off).  Every store error but
# FATAL's (caught before it): a lost server (StoreUnavailable), a lost lock (LeadershipLost)…
RETRIED = (StoreError,)
# Reconnecting after a lost session: 0.2 s doubling to 5 s (with jitter).
RECONNECT_FIRST = 0.2
RECONNECT_CAP = 5.0


class Role(enum.Enum):
    WAITING_FOR_APP = "waiting_for_app"
    DISCONNECTED = "disconnected"
    RESERVE = "reserve"
    STANDBY = "standby"
    LEADING = "leading"
    RELEASED = "released"


# What each event of a key's leadership says (the record also carries ``event`` and ``key``).
SAID = {
    Event.LOCK_SESSION_LOST: "lock session lost, reconnecting",
    Event.CONNECTIONS_REFUSED: "database refused a connection for lack of slots, backing off",
    Event.LEADERSHIP_ACQUIRED: "acquired leadership",
    Event.LEADERSHIP_RELEASED: "released leadership",
    Event.LEADERSHIP_HANDED_OVER: "app unreachable: handed leadership over",
    Event.LOCK_HELD_BY_FOREIGN_ROLE: "lock held by a role that may not serve this namespace",
    Event.LOCK_FOREIGN_HOLDER_GONE: "lock no longer held by a foreign role",
}

# The role each state exports as ``schedlock_role`` (the others export none).
ROLE_LABELS = {Role.LEADING: "leader", Role.STANDBY: "standby", Role.RESERVE: "reserve"}


@dataclass
class Leadership:
    """What the leader's work loop may consult: the term and whether the lease still holds."""

    key: LockKey
    session: LockSession
    term: int
    step_down_after: float
    last_heartbeat_ok: float  # the loop's clock (``now()``) at the last successful heartbeat

    def lease_ok(self) -> bool:
        """False once no heartbeat succeeded within lease minus margin (e.g. after a freeze)."""
        return now() - self.last_heartbeat_ok < self.step_down_after


LeaderWork = Callable[[Leadership, asyncio.Event], Coroutine[Any, Any, None]]


class AppPresence(Protocol):
    """Whether this sidecar's own app can take fires (``schedlock.sidecar.target``): the
    toggle's ``on`` event is set while it can, its ``off`` event while it cannot."""

    reachable: Toggle
    reason: str


@dataclass
class _Turns:
    """A reserve's last view of its roster, to place its next check (``schedlock.sidecar.reserve``)."""

    db_now: float  # database clock at the last roster read
    at: float  # the loop's clock (``now()``) at that read
    rank: int
    reserves: int


# A target's leader whose key is held by another session (a replica of a release that locked per
# key, during a rolling update, or a squatter) tries that key's lock again this often.
KEY_RETRY_SECONDS = 1.0


@dataclass(eq=False)
class Elector:
    """Runs the state machine for one target's keys until ``stopping`` is set, calling ``work``
    for each key it leads.  One session for every key: the replica waits for the target's
    leadership lock (``TargetLock``), then takes each key's own lock on the same session.

    Its time is the running loop's (``schedlock.core.aio``): a test runs it on a virtual-time
    loop (``testbed.virtual_time``).
    """

    store: Store
    keys: tuple[LockKey, ...]
    holder: str
    timings: LeaseTimings  # the lease, the heartbeat and the step-down, derived in one place
    metrics: SidecarMetrics
    work: LeaderWork
    app: AppPresence
    standbys: int = 1
    reserve_check_seconds: float = 5.0
    rng: random.Random = field(default_factory=random.Random)
    role: Role = field(default=Role.DISCONNECTED, init=False)
    last_error: str | None = field(default=None, init=False)  # why the last session ended
    last_summary: str | None = field(default=None, init=False)  # the same in words (/readyz)
    refused: str | None = field(default=None, init=False)  # the last refusal, until a connect
    next_check_at: float | None = field(default=None, init=False)  # a reserve's next check
    # The keys this replica leads now, each with its term.
    leading: dict[LockKey, Leadership] = field(default_factory=dict, init=False)
    # Sessions of roles that may not serve the namespace holding the target's leadership lock
    # or a key's own lock (lock squatting), as this replica last heard, and since when (Unix
    # time).
    foreign: dict[LockKey | TargetLock, tuple[ForeignHolder, float]] = field(
        default_factory=dict, init=False
    )
    _turns: _Turns | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.lock = TargetLock(self.keys)
        self.reconnect = Backoff(RECONNECT_FIRST, RECONNECT_CAP, self.rng)
        self.refusals = refused_backoff(self.rng)
        for key in self.keys:
            self.metrics.init_key(*_labels(key))

    @property
    def connected(self) -> bool:
        return self.role in (Role.STANDBY, Role.LEADING)

    @property
    def waiting_for_app(self) -> bool:
        return self.role is Role.WAITING_FOR_APP

    @property
    def settled(self) -> bool:
        """In a steady role: leading, standing by, a reserve between checks, or not competing
        because the app is away (a reserve holds no session by design)."""
        return self.role in (Role.LEADING, Role.STANDBY, Role.RESERVE, Role.WAITING_FOR_APP)

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            if not self.app.reachable.is_on():
                # No session at all while the app is away: a waiter in pg_advisory_lock could
                # be granted leadership it cannot use.
                self._set_role(Role.WAITING_FOR_APP)
                await sleep_unless(None, self.app.reachable.on, stopping)
                if stopping.is_set():
                    break
                continue
            if self.next_check_at is not None:
                # A reserve: no session until its turn (or its back-off after a refusal).
                self._set_role(Role.RESERVE)
                wait = self.next_check_at - now()
                if wait > 0:
                    await sleep_unless(wait, stopping, self.app.reachable.off)
                if stopping.is_set():
                    break
                if not self.app.reachable.is_on():
                    continue
                self.next_check_at = None
            session = self.store.lock_session(
                self.keys[0], self.holder, self.timings.lease_seconds, self.lock
            )
            failed = False
            opened = False
            try:
                await session.connect()
                opened = True
                self.metrics.sessions.inc()
                self.last_error = self.last_summary = None
                self.refused = None
                self.refusals.reset()
                self.reconnect.reset()
                self.metrics.database_up.set(1)
                # A free lock is taken at once, with no standby place: held for that moment,
                # the place would turn the replicas starting beside this one into reserves.
                leads = await session.try_acquire()
                if not leads and await session.take_standby_place(self.standbys) is None:
                    await self._enlist(session)
                    continue
                if self._turns is not None:
                    # Was a reserve: off the roster, so no reserve's turn is wasted on us.
                    await session.leave_reserves()
                    self._turns = None
                if not leads:
                    self._set_role(Role.STANDBY)
                    granted = await unless_set(
                        session.acquire(functools.partial(self._heard_holder, self.lock)),
                        stopping,
                        self.app.reachable.off,
                        suppress=(StoreError,),
                    )
                    leads = granted is not None
                    if leads:
                        self._heard_holder(self.lock, None, "granted")
                        # The lock is ours: give the standby place back, for a reserve to fill.
                        await session.leave_standby_place()
                if leads:
                    await self._lead(session, stopping)
            except FATAL:
                raise
            except ConnectionsExhausted as exc:
                self._on_refused(exc)
            except RETRIED as exc:
                failed = True
                self.last_error, self.last_summary = str(exc), summary(exc)
                if isinstance(exc, StoreUnavailable):
                    self.metrics.database_up.set(0)
                level = logging.WARNING if self.role is Role.LEADING else logging.INFO
                self._say(level, Event.LOCK_SESSION_LOST, role=self.role.value, error=str(exc))
            finally:
                for where in list(self.foreign):
                    self._heard_holder(where, None, "wait ended")
                for key in list(self.leading):
                    self._lost(key)
                await session.close()
                if opened:
                    self.metrics.sessions.dec()
                if self.role not in (Role.RELEASED, Role.WAITING_FOR_APP, Role.RESERVE):
                    self._set_role(Role.DISCONNECTED)
            if stopping.is_set():
                break
            if not failed:
                continue  # a reserve's turn, a refusal's back-off or the app went away
            await sleep_unless(self.reconnect.next(), stopping)

    async def _enlist(self, session: LockSession) -> None:
        """Every standby place is taken: enlist in the roster, then hold no session until our
        turn.  Turns spread the reserves' checks to about one per interval per key."""
        roster = await session.reserve_roster()
        self._turns = _Turns(roster.db_now, now(), roster.rank, roster.reserves)
        wait = self._next_turn_in(self._turns)
        await session.enlist_reserve(wait, grace(self.reserve_check_seconds))
        self.next_check_at = now() + wait
        self._set_role(Role.RESERVE)

    def _next_turn_in(self, turns: _Turns) -> float:
        """Seconds to our next turn, the database clock advanced by the time since the read."""
        return next_check_in(
            turns.db_now + (now() - turns.at),
            rank=turns.rank,
            reserves=turns.reserves,
            interval=self.reserve_check_seconds,
            draw=self.rng.random(),
        )

    def _on_refused(self, exc: ConnectionsExhausted) -> None:
        """No slot for us: wait for the later of our next turn and a growing, jittered
        back-off, holding no session — the slots belong to the app as much as to us."""
        self.metrics.refused.inc()
        wait = self.refusals.next()
        if self._turns is not None:
            wait = max(wait, self._next_turn_in(self._turns))
        self.refused = str(exc)
        self.next_check_at = now() + wait
        self._set_role(Role.RESERVE)
        self._say(
            logging.WARNING, Event.CONNECTIONS_REFUSED, error=str(exc), retry_in_s=round(wait, 2)
        )

    @property
    def squatted(self) -> str | None:
        """Words for ``/readyz`` while a foreign role holds the target's leadership lock or a
        key's lock (None otherwise): the role as printable text (a role name is anyone's
        choice of characters)."""
        said = [
            f"{where}: lock held by role '{printable(holder.role, ROLE_NAME_MAX)}' "
            f"(backend pid {holder.pid}) since {rfc3339_epoch(since, 'seconds')}"
            for where, (holder, since) in self.foreign.items()
        ]
        return "; ".join(said) or None

    def _heard_holder(
        self,
        where: LockKey | TargetLock,
        holder: ForeignHolder | None,
        why: str = "holder changed",
    ) -> None:
        """What this replica heard of who holds a lock it waits for (the target's leadership
        lock as a standby, a key's own as a leader): a foreign holder (lock squatting:
        advisory locks have no ACL) or none.  Said once per change; a session gives no news
        once its wait ends, so that forgets it (``why``)."""
        before = self.foreign.get(where)
        if (before[0] if before else None) == holder:
            return
        keys = self.keys if isinstance(where, TargetLock) else (where,)
        for key in keys:
            self.metrics.foreign_holder.labels(*_labels(key)).set(0 if holder is None else 1)
        if holder is None:
            assert before is not None
            del self.foreign[where]
            self._say(
                logging.INFO,
                Event.LOCK_FOREIGN_HOLDER_GONE,
                where,
                role=before[0].role,
                pid=before[0].pid,
                why=why,
            )
            return
        self.foreign[where] = (holder, utcnow().timestamp())
        self._say(
            logging.ERROR, Event.LOCK_HELD_BY_FOREIGN_ROLE, where, role=holder.role, pid=holder.pid
        )

    def _say(
        self, level: int, event: Event, where: LockKey | TargetLock | None = None, **fields: object
    ) -> None:
        """Log ``event`` of this target (or of one key, ``where``): its message (``SAID``), the
        key and ``fields``."""
        key = str(self.lock if where is None else where)
        log.log(level, SAID[event], extra={"event": event, "key": key, **fields})

    def _set_role(self, role: Role) -> None:
        self.role = role
        current = ROLE_LABELS.get(role)
        for key in self.keys:
            for label in ROLE_LABELS.values():
                self.metrics.role.labels(*_labels(key), label).set(1 if label == current else 0)

    def _lost(self, key: LockKey, direction: str = "lost") -> None:
        del self.leading[key]
        labels = _labels(key)
        self.metrics.leader.labels(*labels).set(0)
        self.metrics.term.labels(*labels).set(0)
        self.metrics.backlog.labels(*labels).set(0)
        self.metrics.oldest_due_age.labels(*labels).set(0)
        self.metrics.transitions.labels(*labels, direction).inc()

    async def _lead(self, session: LockSession, stopping: asyncio.Event) -> None:
        """Holding the target's leadership lock: take each key's own lock on this session and
        lead it (its term, its heartbeat, the work), until the term ends gracefully or fails."""
        if not self.app.reachable.is_on():
            # Granted just as the app went away: hand the lock on before starting a term.
            await session.release(None)
            self._handed_over(None)
            return
        self._set_role(Role.LEADING)
        # The terms end gracefully on SIGTERM or when the app stops answering; the work
        # cannot tell the two apart, and need not: both finish or abandon in-flight rows.
        ending = asyncio.Event()

        async def end_term() -> None:
            await sleep_unless(None, stopping, self.app.reachable.off)
            ending.set()

        # Every failure of a term is logged (a heartbeat's and a work's both); the first one
        # ends every key's term and reaches run(), which reconnects: the keys move together.
        # The term's end and the heartbeats serve the works: companions, cancelled once the
        # works have ended.
        async with Supervisor(f"term:{self.lock}", expected=RETRIED, logger=log) as term:
            term.start(f"term-end:{self.lock}", end_term(), companion=True)
            works: list[asyncio.Task[None]] = []
            pending = list(self.keys)
            while pending and not ending.is_set():
                for key in list(pending):
                    keyed = await session.lock_key(key, functools.partial(self._heard_holder, key))
                    if keyed is None:
                        continue  # held by another session: tried again below
                    pending.remove(key)
                    leadership = await self._begin(key, keyed)
                    term.start(f"heartbeat:{key}", self._heartbeat(leadership), companion=True)
                    works.append(term.start(f"work:{key}", self.work(leadership, ending)))
                if pending:
                    await sleep_unless(KEY_RETRY_SECONDS, ending)
            if works:
                await asyncio.wait(works)
        # Reached only on a graceful end: the work finished or abandoned its in-flight rows.
        terms = list(self.leading.values())
        for leadership in terms:
            await leadership.session.release(leadership.term)
            self._lost(leadership.key, "released")
        await session.release(None)
        if stopping.is_set():
            self._set_role(Role.RELEASED)
            for leadership in terms:
                self._say(
                    logging.INFO, Event.LEADERSHIP_RELEASED, leadership.key, term=leadership.term
                )
        else:
            self._handed_over(terms)

    async def _begin(self, key: LockKey, session: LockSession) -> Leadership:
        """The key's lock is ours: bump its term (rows an earlier term left firing are the
        work's to adopt) and say so."""
        start = await session.begin_term()
        leadership = Leadership(
            key=key,
            session=session,
            term=start.term,
            step_down_after=self.timings.step_down_after,
            last_heartbeat_ok=now(),
        )
        self.leading[key] = leadership
        self._acquired(key, start)
        return leadership

    def _handed_over(self, terms: list[Leadership] | None) -> None:
        self._set_role(Role.WAITING_FOR_APP)
        for leadership in terms or ():
            self._say(
                logging.WARNING,
                Event.LEADERSHIP_HANDED_OVER,
                leadership.key,
                term=leadership.term,
                error=self.app.reason,
            )
        if not terms:
            self._say(logging.WARNING, Event.LEADERSHIP_HANDED_OVER, error=self.app.reason)

    def _acquired(self, key: LockKey, start: TermStart) -> None:
        labels = _labels(key)
        self.metrics.leader.labels(*labels).set(1)
        self.metrics.term.labels(*labels).set(start.term)
        self.metrics.transitions.labels(*labels, "acquired").inc()
        self.metrics.last_tick.labels(*labels).set(utcnow().timestamp())
        if start.gap_seconds is not None and start.term > 1:
            self.metrics.handover_gap.labels(*labels).observe(max(0.0, start.gap_seconds))
        gap = start.gap_seconds
        self._say(
            logging.INFO,
            Event.LEADERSHIP_ACQUIRED,
            key,
            term=start.term,
            previous_holder=start.previous_holder,
            previous_released=start.previous_released,
            gap_ms=None if gap is None else round(gap * 1000, 1),
        )

    async def _heartbeat(self, leadership: Leadership) -> None:
        """Prove the session alive; raise LeadershipLost when the lease can't be confirmed."""
        while True:
            await asyncio.sleep(self.timings.heartbeat_seconds)
            budget = leadership.last_heartbeat_ok + leadership.step_down_after - now()
            if budget <= 0:
                raise LeadershipLost(
                    f"no heartbeat for {leadership.step_down_after:.1f}s: stepping down"
                )
            try:
                beat = await asyncio.wait_for(leadership.session.heartbeat(leadership.term), budget)
            except TimeoutError as exc:
                raise LeadershipLost(
                    f"heartbeat did not succeed within {leadership.step_down_after:.1f}s: stepping down"
                ) from exc
            leadership.last_heartbeat_ok = now()
            labels = _labels(leadership.key)
            self.metrics.backlog.labels(*labels).set(beat.backlog)
            self.metrics.oldest_due_age.labels(*labels).set(beat.oldest_due_age or 0.0)
            self.metrics.last_tick.labels(*labels).set(utcnow().timestamp())


def _labels(key: LockKey) -> tuple[str, str, str]:
    """A key's metric labels: scheduler, namespace, target."""
    return (key.scheduler, key.namespace, key.target)
