"""The PostgreSQL store: admin verbs on short-lived connections, one dedicated session per lock.

Connections are never shared between a lock and anything else (DESIGN invariant 1): a
:class:`PostgresLockSession` owns one autocommit connection for the lock, its heartbeat and
every state change of the rows its scheduler owns.  The leader's LISTEN rides on that same
session (:meth:`PostgresLockSession.listen`); only the operator's LISTEN has its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from schedlock.core.logs import Event
from schedlock.store import queries, rows
from schedlock.store.errors import (
    ConnectionsExhausted,
    LeadershipLost,
    LockKeyCollision,
    ReadOnlyServer,
    StoreError,
    StoreUnavailable,
    UnlockFailed,
    UnsafeConnection,
    is_exhausted,
    schema_too_new,
)
from schedlock.store.keys import MIGRATIONS_OBJID, SCHEDLOCK_CLASS_ID, STANDBY_CLASS_ID, LockKey
from schedlock.store.migrations import latest_id, migrations, split_statements
from schedlock.store.models import (
    ClaimResult,
    Completion,
    DueSchedule,
    FireRow,
    Heartbeat,
    KeyStatus,
    PublishRecord,
    PublishSpec,
    RecordedOutcome,
    ReserveRoster,
    RowVersion,
    ScheduleRecord,
    ScheduleSpec,
    SchemaStatus,
    TermStart,
    UpsertResult,
)

log = logging.getLogger("schedlock.store")
Q = queries.load("postgres")
T = TypeVar("T")
R = TypeVar("R")
Conn = psycopg.AsyncConnection[DictRow]

ROWS_CHANNEL = "schedlock_rows"
OUTCOMES_CHANNEL = "schedlock_outcomes"
UNSAFE_POOLER = (
    "the database connection does not keep one server session (a pooler in transaction mode, "
    "e.g. PgBouncer pool_mode=transaction?): advisory locks would guard nothing; connect "
    "directly or through a session-mode pooler"
)


# Least privileges per runtime role: (privileges, objects). No role but the owner gets DDL.
SIDECAR_GRANTS = (
    ("SELECT, INSERT, UPDATE", ("TABLE schedlock_publishes", "TABLE schedlock_terms")),
    ("SELECT, UPDATE", ("TABLE schedlock_schedules",)),
    ("SELECT", ("TABLE schedlock_migrations",)),
    ("USAGE", ("SEQUENCE schedlock_publishes_id_seq",)),
    # Reserves enlist, refresh and prune their own key's roster rows (no session held).
    ("SELECT, INSERT, UPDATE, DELETE", ("TABLE schedlock_reserves",)),
)
OPERATOR_GRANTS = (
    ("SELECT, INSERT, UPDATE", ("TABLE schedlock_publishes", "TABLE schedlock_schedules")),
    ("SELECT", ("TABLE schedlock_terms", "TABLE schedlock_migrations")),
    ("USAGE", ("SEQUENCE schedlock_publishes_id_seq", "SEQUENCE schedlock_schedules_id_seq")),
)
GRANTS = {"sidecar": SIDECAR_GRANTS, "operator": OPERATOR_GRANTS}
AFFINITY_PROBES = 1  # each probe is one more server connection for a moment
_AFFINITY_LOCKS: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}


def _affinity_lock() -> asyncio.Lock:
    """One affinity check at a time per process: our own sessions must not mask a pooler."""
    loop = asyncio.get_running_loop()
    if loop not in _AFFINITY_LOCKS:
        _AFFINITY_LOCKS[loop] = asyncio.Lock()
    return _AFFINITY_LOCKS[loop]


async def _guard(call: Awaitable[T]) -> T:
    """Translate driver errors into the store's own, chained to the cause."""
    try:
        return await call
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        # The server became read-only under an open session (default_transaction_read_only
        # set and reloaded): retryable, and never a write that half happened.
        raise ReadOnlyServer(f"{_describe(exc)}: the server is read-only") from exc
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise StoreUnavailable(_describe(exc)) from exc
    except psycopg.Error as exc:
        raise StoreError(_describe(exc)) from exc


def _describe(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


async def connect(url: str, *, application_name: str, connect_timeout: float = 5) -> Conn:
    """Open a session on a writable primary, or raise (every session of both components
    comes through here, so neither leads nor writes on a standby or a read-only server).

    A multi-host URL (``postgresql://a:5432,b:5432/db?target_session_attrs=read-write``) is
    libpq's own way to find the primary; the check below refuses whatever it lands on that
    is in recovery or read-only, with a reason naming the server.
    """
    try:
        conn = await psycopg.AsyncConnection.connect(
            url,
            autocommit=True,
            row_factory=dict_row,
            application_name=application_name[:63],
            connect_timeout=max(1, int(connect_timeout)),
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
        )
    except psycopg.Error as exc:
        raise StoreUnavailable(_describe(exc)) from exc
    try:
        await require_writable(conn)
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 2)
        raise
    return conn


def read_only_reason(
    server: str, *, in_recovery: bool, default_read_only: str, read_only: str
) -> str | None:
    """Why a server must not be led or written on (None: a writable primary)."""
    if in_recovery:
        return (
            f"server {server} is a standby (pg_is_in_recovery() is true): not leading or "
            "writing here; point the URL at the primary or list every server with "
            "target_session_attrs=read-write"
        )
    if default_read_only == "on" or read_only == "on":
        setting = (
            "default_transaction_read_only"
            if default_read_only == "on"
            else ("transaction_read_only")
        )
        return (
            f"server {server} is read-only ({setting} is on): not leading or writing here; "
            "point the URL at the primary or list every server with "
            "target_session_attrs=read-write"
        )
    return None


async def require_writable(conn: Conn) -> None:
    """Raise ReadOnlyServer unless ``conn`` is on a writable primary."""
    cur = await _guard(conn.execute(Q["server_writable"]))
    row = await _guard(cur.fetchone())
    if row is None:
        raise StoreError("query server_writable returned no row")
    reason = read_only_reason(
        f"{conn.info.host}:{conn.info.port}",
        in_recovery=bool(row["in_recovery"]),
        default_read_only=str(row["default_read_only"]),
        read_only=str(row["read_only"]),
    )
    if reason is not None:
        raise ReadOnlyServer(reason)


class PostgresLockSession:
    """One dedicated connection: the advisory lock, its lease, heartbeat and row transitions.

    Fencing: every transition statement also requires ``schedlock_terms.term`` to equal the
    term this session started, and runs on the session that holds the lock.  The session can
    only lose the lock by ending, after which its statements fail; no clock is trusted.
    """

    def __init__(self, url: str, key: LockKey, holder: str, lease_seconds: float) -> None:
        self.url = url
        self.key = key
        self.holder = holder
        self.lease_seconds = lease_seconds
        self._conn: Conn | None = None
        self._lock_pid: int | None = None
        self._place: int | None = None  # the standby place this session holds, if any
        self._on_notify: Callable[[str, str], None] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._busy = 0  # statements in progress: the notification pump is paused meanwhile

    # -- connection ---------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the session, set the lease and register the key's lock ids."""
        await self.close()
        try:
            conn = await connect(self.url, application_name=self.holder)
        except StoreUnavailable as exc:
            cause = exc.__cause__
            sqlstate = getattr(cause, "sqlstate", None)
            if is_exhausted(sqlstate, str(cause or exc)):
                raise ConnectionsExhausted(
                    f"the database refused a connection for lack of slots: {exc}"
                ) from exc
            raise
        try:
            row = await self._fetchone(
                "configure_lock_session",
                {
                    "lease_ms": str(int(self.lease_seconds * 1000)),
                    "keepalive_idle": str(max(1, int(self.lease_seconds / 3))),
                    "keepalive_interval": "1",
                },
                conn=conn,
            )
            if row["server_version"] < 140000:
                raise StoreError(
                    "PostgreSQL 14 or newer is required (idle_session_timeout is the lease)"
                )
            if row["in_reserved_slot"]:
                raise ConnectionsExhausted(
                    "the database is full up to its reserved connection slots "
                    "(superuser_reserved_connections / reserved_connections) and this role may "
                    "use them: not taking a slot kept for operators"
                )
            await conn.execute(Q["register_key"], self.key.params())
            owner = await self._fetchone("key_of_lock_ids", self.key.params(), conn=conn)
            if LockKey(owner["scheduler"], owner["namespace"], owner["target"]) != self.key:
                raise LockKeyCollision(
                    f"lock key {self.key} hashes to the same advisory lock ids as another key "
                    f"({self.key.classid}, {self.key.objid}); rename the target"
                )
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def close(self) -> None:
        """Drop the session; the server releases the lock with it."""
        conn, self._conn = self._conn, None
        self._lock_pid = None
        self._place = None
        self._on_notify = None
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        if conn is not None and not conn.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)

    def _require(self) -> Conn:
        if self._conn is None or self._conn.closed:
            raise LeadershipLost(f"lock session for {self.key} is closed")
        return self._conn

    async def _fetchone(
        self, name: str, params: Mapping[str, Any], conn: Conn | None = None
    ) -> DictRow:
        async def run() -> DictRow:
            cur = await (conn or self._require()).execute(Q[name], params)
            row = await cur.fetchone()
            if row is None:
                raise StoreError(f"query {name} returned no row")
            return row

        async with self._statement():
            return await _guard(run())

    async def _fetchall(self, name: str, params: Mapping[str, Any]) -> list[DictRow]:
        async def run() -> list[DictRow]:
            cur = await self._require().execute(Q[name], params)
            return await cur.fetchall()

        async with self._statement():
            return await _guard(run())

    async def _execute(self, name: str, params: Mapping[str, Any]) -> int:
        async def run() -> int:
            cur = await self._require().execute(Q[name], params)
            return cur.rowcount

        async with self._statement():
            return await _guard(run())

    # -- LISTEN on the lock session ---------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _statement(self) -> AsyncIterator[None]:
        """Pause the notification pump around a statement.

        psycopg reads notifications only inside ``notifies()``, which holds the connection's
        lock while it waits; statements would queue behind it.  So the pump runs only while
        the session is otherwise idle: notifications that arrive during a statement are kept
        in psycopg's backlog and handed out first when the pump restarts.
        """
        self._busy += 1
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        try:
            yield
        finally:
            self._busy -= 1
            self._restart_pump()

    def _restart_pump(self) -> None:
        if self._busy or self._pump is not None or self._on_notify is None or not self.connected:
            return
        self._pump = asyncio.create_task(self._pump_notifies(), name=f"notifies:{self.key}")

    async def _pump_notifies(self) -> None:
        conn, deliver = self._require(), self._on_notify
        assert deliver is not None
        try:
            async for note in conn.notifies():
                deliver(note.channel, note.payload)
        except psycopg.Error as exc:
            # The session died: the next statement on it says so to the caller.
            log.debug(
                "notification pump stopped",
                extra={
                    "event": Event.NOTIFICATIONS_STOPPED,
                    "key": str(self.key),
                    "error": str(exc),
                },
            )

    async def listen(self, channel: str, on_payload: Callable[[str], None]) -> None:
        """LISTEN on this lock session and call ``on_payload`` for each notification, until
        the session closes.  No extra server session: the leader's wake-ups ride on its lock."""

        def deliver(got: str, payload: str) -> None:
            if got == channel:
                on_payload(payload)

        async with self._statement():
            await _guard(
                self._require().execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            )
            self._on_notify = deliver

    # -- standby places and the reserve roster ----------------------------------------------------

    def _place_params(self, places: int) -> dict[str, object]:
        return {"place_classid": STANDBY_CLASS_ID, "place_objids": self.key.standby_objids(places)}

    async def take_standby_place(self, places: int) -> int | None:
        """Take a free standby place of the key on this session (never waiting): its index,
        or None when all ``places`` are taken.  Held until released or the session ends."""
        if places <= 0:
            return None
        found = await self._fetchall("take_standby_place", self._place_params(places))
        self._place = int(found[0]["place"]) if found else None
        return self._place

    async def leave_standby_place(self) -> None:
        """Give the standby place back (checked): the leader holds the key's lock instead, so a
        reserve may become a standby in its stead."""
        place, self._place = self._place, None
        if place is None:
            return
        objid = self.key.standby_objids(place + 1)[place]
        row = await self._fetchone(
            "leave_standby_place", {"place_classid": STANDBY_CLASS_ID, "place_objid": objid}
        )
        if not row["released"]:
            raise UnlockFailed(
                f"pg_advisory_unlock({STANDBY_CLASS_ID}, {objid}) returned false for standby "
                f"place {place} of {self.key}: this session did not hold it"
            )

    async def _holds_place(self) -> bool:
        assert self._place is not None
        objid = self.key.standby_objids(self._place + 1)[self._place]
        params = {"place_classid": STANDBY_CLASS_ID, "place_objids": [objid]}
        return int((await self._fetchone("standby_places_held", params))["held"]) == 1

    async def reserve_roster(self) -> ReserveRoster:
        row = await self._fetchone("reserve_roster", {**self.key.params(), "holder": self.holder})
        return ReserveRoster(
            db_now=float(row["db_now"]), rank=int(row["rank"]), reserves=int(row["reserves"])
        )

    async def enlist_reserve(self, next_check_in: float, grace: float) -> None:
        await self._execute(
            "enlist_reserve",
            {
                **self.key.params(),
                "holder": self.holder,
                "next_check_in": next_check_in,
                "grace": grace,
            },
        )

    async def leave_reserves(self) -> None:
        await self._execute("leave_reserves", {**self.key.params(), "holder": self.holder})

    # -- leadership -----------------------------------------------------------------------------

    async def acquire(self) -> None:
        """Block until this session holds the lock (a follower waits here, issuing nothing)."""
        row = await self._fetchone("lock", self.key.params())
        self._lock_pid = int(row["pid"])
        await self._verify_session_affinity()

    def _local_port(self) -> int | None:
        conn = self._require()
        try:
            fd = os.dup(conn.pgconn.socket)
        except (OSError, psycopg.Error):
            return None
        with socket.socket(fileno=fd) as sock:
            try:
                return int(sock.getsockname()[1])
            except (OSError, IndexError, TypeError):
                return None

    async def _verify_session_affinity(self) -> None:
        """Confirm from a second transaction that pg_locks shows the lock for this backend.

        A direct connection (the backend sees our own client port) passes at once.  Behind a
        proxy, probe clients hold transactions open on the pool's server sessions (a pooler
        hands out its most recently used one first) and we check again after each: a pooler
        in transaction mode gives a probe our lock's server session, or moves our next
        statement to another one.  Checks run one at a time per process, and every heartbeat
        re-checks the backend pid.  Failing means refusing to run, never running unguarded.
        """
        async with _affinity_lock():
            row = await self._fetchone("lock_held", self.key.params())
            if not row["held"] or int(row["pid"]) != self._lock_pid:
                raise UnsafeConnection(UNSAFE_POOLER)
            if self._place is not None and not await self._holds_place():
                # The place was taken in an earlier transaction: another server session
                # holds it, so statements do not stay on one session.
                raise UnsafeConnection(UNSAFE_POOLER)
            if row["client_port"] is not None and row["client_port"] == self._local_port():
                return
            async with contextlib.AsyncExitStack() as probes:
                for round_ in range(AFFINITY_PROBES):
                    try:
                        _probe, pinned = await asyncio.wait_for(
                            self._pin_probe(probes, round_), timeout=10
                        )
                    except TimeoutError as exc:
                        raise StoreUnavailable(
                            "could not open a probe connection to verify session affinity "
                            "(pool exhausted?)"
                        ) from exc
                    if pinned is None or int(pinned["pid"]) == self._lock_pid:
                        raise UnsafeConnection(UNSAFE_POOLER)
                    try:
                        again = await asyncio.wait_for(
                            self._fetchone("lock_held", self.key.params()), timeout=5
                        )
                    except TimeoutError as exc:
                        raise UnsafeConnection(UNSAFE_POOLER) from exc
                    if not again["held"] or int(again["pid"]) != self._lock_pid:
                        raise UnsafeConnection(UNSAFE_POOLER)

    async def _pin_probe(
        self, probes: contextlib.AsyncExitStack, round_: int
    ) -> tuple[Conn, DictRow | None]:
        probe = await connect(self.url, application_name=f"{self.holder}-probe{round_}")
        probes.push_async_callback(probe.close)
        await probes.enter_async_context(probe.transaction())
        cur = await probe.execute(Q["backend_pid"])
        return probe, await cur.fetchone()

    async def begin_term(self) -> TermStart:
        # Re-checked on the lock session itself: the server may have turned read-only while
        # this session waited for the lock (a term must never begin there).
        await require_writable(self._require())
        row = await self._fetchone("begin_term", {**self.key.params(), "holder": self.holder})
        return TermStart(
            term=int(row["term"]),
            previous_holder=row["previous_holder"],
            gap_seconds=row["gap_seconds"],
            previous_released=bool(row["previous_released"]),
        )

    async def heartbeat(self, term: int) -> Heartbeat:
        row = await self._fetchone("heartbeat", {**self.key.params(), "term": term})
        if self._lock_pid is not None and int(row["pid"]) != self._lock_pid:
            # Continuous affinity check at no cost: a pooler moved us to another server session.
            raise UnsafeConnection(UNSAFE_POOLER)
        if not row["alive"]:
            raise LeadershipLost(f"term {term} of {self.key} was superseded")
        return Heartbeat(
            alive=True, backlog=int(row["backlog"]), oldest_due_age=row["oldest_due_age"]
        )

    async def release(self, term: int | None) -> None:
        """Graceful hand-over: record the release, unlock (checked), close."""
        try:
            if term is not None:
                await self._execute("release_term", {**self.key.params(), "term": term})
            row = await self._fetchone("unlock", self.key.params())
            if not row["released"]:
                raise UnlockFailed(
                    f"pg_advisory_unlock({self.key.classid}, {self.key.objid}) returned false "
                    f"for {self.key}: this session did not hold the lock"
                )
        finally:
            await self.close()

    # -- rows -----------------------------------------------------------------------------------

    async def adopt_orphans(self, term: int) -> list[FireRow]:
        found = await self._fetchall(
            "adopt_orphans", {**self.key.params(), "term": term, "holder": self.holder}
        )
        return [rows.fire_row(r, rows.POSTGRES) for r in found]

    async def claim_due(self, term: int, limit: int) -> ClaimResult:
        params = {**self.key.params(), "term": term, "holder": self.holder, "limit": limit}
        found = await self._fetchall("claim_due", params) if limit > 0 else []
        next_due_in: float | None = None
        if len(found) < limit or limit == 0:
            nd = await self._fetchone("next_due", self.key.params())
            next_due_in = nd["next_due_in"]
        return ClaimResult(
            rows=[rows.fire_row(r, rows.POSTGRES) for r in found],
            next_due_in=next_due_in,
        )

    async def complete(self, term: int, completions: Sequence[Completion]) -> int:
        if not completions:
            return 0
        params = {
            **self.key.params(),
            "term": term,
            "ids": [c.id for c in completions],
            "outcomes": [c.outcome for c in completions],
            "next_attempts": [c.next_attempt_at for c in completions],
            "statuses": [c.status for c in completions],
            "errors": [c.error for c in completions],
            "sent": [c.sent for c in completions],
        }
        row = await self._fetchone("complete", params)
        done = int(row["completed"])
        if done != len(completions):
            raise LeadershipLost(
                f"only {done} of {len(completions)} outcomes were recorded for {self.key} "
                f"term {term}: the term moved on"
            )
        return done

    async def due_schedules(self, limit: int) -> list[DueSchedule]:
        found = await self._fetchall("due_schedules", {**self.key.params(), "limit": limit})
        return [rows.due_schedule(r, rows.POSTGRES) for r in found]

    async def next_slot_in(self) -> float | None:
        row = await self._fetchone("next_slot", self.key.params())
        if row["unplanned"]:
            return 0.0
        value = row["next_due_in"]
        return None if value is None else float(value)

    async def insert_slot(
        self, term: int, schedule_id: int, slot_uid: str, slot_at: datetime
    ) -> bool:
        params = {
            "term": term,
            "schedule_id": schedule_id,
            "slot_uid": slot_uid,
            "slot_at": slot_at,
        }
        return await self._execute("insert_slot", params) == 1

    async def advance_schedule(
        self,
        term: int,
        schedule_id: int,
        *,
        watermark_at: datetime,
        next_slot_at: datetime,
        fired_slot_at: datetime | None,
    ) -> None:
        params = {
            "term": term,
            "schedule_id": schedule_id,
            "watermark_at": watermark_at,
            "next_slot_at": next_slot_at,
            "fired_slot_at": fired_slot_at,
        }
        if await self._execute("advance_schedule", params) != 1:
            raise LeadershipLost(f"term {term} of {self.key} was superseded")


class HeldLock:
    """A session-level advisory lock held by one dedicated connection; closing releases it."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    async def ping(self) -> None:
        """Raise StoreUnavailable when the session (and so the lock) is gone."""
        await _guard(self._conn.execute("SELECT 1"))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._conn.close(), 2)


class SessionPool:
    """At most ``size`` admin sessions, reused: a burst of upserts waits for a free session
    instead of opening one connection each (and running the server out of connections).

    Idle sessions are kept; one that is broken or not idle when returned is closed.  Opening
    a session goes through :func:`connect`, so failures keep the server's own message.
    """

    def __init__(self, url: str, application_name: str, size: int) -> None:
        self.url = url
        self.application_name = application_name
        self.size = size
        self._idle: list[Conn] = []
        self._slots = asyncio.Semaphore(size)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[tuple[Conn, bool]]:
        """A session and whether it was reused (it may have died while idle)."""
        async with self._slots:
            reused = bool(self._idle)
            conn = (
                self._idle.pop()
                if reused
                else await connect(self.url, application_name=self.application_name)
            )
            try:
                yield conn, reused
            finally:
                idle = psycopg.pq.TransactionStatus.IDLE
                if not conn.closed and conn.info.transaction_status == idle:
                    self._idle.append(conn)
                else:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 2)

    async def close(self) -> None:
        """Close the idle sessions (sessions in use close when returned, if broken)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)


class PostgresStore:
    """Admin verbs (migrate, upsert, cancel, status) and the factory for lock sessions."""

    dialect = "postgres"
    always_leader = False

    def __init__(
        self, url: str, *, application_name: str = "schedlock", pool_size: int = 0
    ) -> None:
        self.url = url
        self.application_name = application_name
        self.pool = SessionPool(url, application_name, pool_size) if pool_size > 0 else None

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        conn = await connect(self.url, application_name=self.application_name)
        try:
            yield conn
        finally:
            await conn.close()

    async def _run(self, fn: Callable[[Conn], Awaitable[T]], *, pooled: bool = True) -> T:
        """Run ``fn`` on a session: a pooled one when this store has a pool, else a new one.

        Every verb run this way is idempotent (upserts keyed by uid + generation, cancels,
        reads), so a pooled session that turns out dead (the server restarted while it idled)
        is retried once on a fresh one instead of failing the caller.
        """

        async def direct() -> T:
            async with self._connection() as conn:
                return await fn(conn)

        if self.pool is None or not pooled:
            return await _guard(direct())
        pool = self.pool

        async def run() -> T:
            for last in (False, True):
                async with pool.session() as (conn, reused):
                    try:
                        return await fn(conn)
                    except psycopg.OperationalError:
                        if last or not reused or not conn.closed:
                            raise
                await pool.close()  # the server went away: every idle session is dead too
            raise AssertionError("unreachable")

        return await _guard(run())

    # -- schema ---------------------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Apply missing migrations under an advisory lock; refuse a schema that is too new."""

        async def run(conn: Conn) -> list[int]:
            await conn.execute(
                "SELECT pg_advisory_lock(%s, %s)", (SCHEDLOCK_CLASS_ID, MIGRATIONS_OBJID)
            )
            try:
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schedlock_migrations ("
                    " id integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
                cur = await conn.execute(
                    "SELECT coalesce(max(id), 0) AS id FROM schedlock_migrations"
                )
                row = await cur.fetchone()
                current = int(row["id"]) if row else 0
                latest = latest_id("postgres")
                if current > latest:
                    raise schema_too_new(current, latest)
                applied: list[int] = []
                for migration in migrations("postgres"):
                    if migration.id <= current:
                        continue
                    async with conn.transaction():
                        for statement in split_statements(migration.sql):
                            await conn.execute(statement)
                        await conn.execute(
                            "INSERT INTO schedlock_migrations (id, name) VALUES (%s, %s)",
                            (migration.id, migration.name),
                        )
                    log.info(
                        "applied migration",
                        extra={
                            "event": Event.MIGRATION_APPLIED,
                            "migration": migration.id,
                            "migration_name": migration.name,
                        },
                    )
                    applied.append(migration.id)
                return applied
            finally:
                cur = await conn.execute(
                    "SELECT pg_advisory_unlock(%s, %s) AS released",
                    (SCHEDLOCK_CLASS_ID, MIGRATIONS_OBJID),
                )
                released = await cur.fetchone()
                if not released or not released["released"]:
                    raise UnlockFailed("the migration lock was not held when releasing it")

        return await self._run(run, pooled=False)  # holds a session-level lock

    async def grant(self, *, sidecar_role: str | None, operator_role: str | None) -> list[str]:
        """Grant the least privileges each runtime role needs (run as the schema owner).

        Neither role gets DDL: sidecars read and move rows, take locks and record terms; the
        operator writes rows and schedules and reads terms.  Returns the roles granted to.
        """

        async def run(conn: Conn) -> list[str]:
            done: list[str] = []
            for role, grants in ((sidecar_role, SIDECAR_GRANTS), (operator_role, OPERATOR_GRANTS)):
                if not role:
                    continue
                cur = await conn.execute(Q["role_exists"], {"role": role})
                found = await cur.fetchone()
                if not found or not found["exists"]:
                    raise StoreError(
                        f"role {role!r} does not exist: create it first (CREATE ROLE …)"
                    )
                async with conn.transaction():
                    for privileges, objects in grants:
                        for obj in objects:
                            await conn.execute(
                                sql.SQL("GRANT {} ON {} TO {}").format(
                                    sql.SQL(privileges), sql.SQL(obj), sql.Identifier(role)
                                )
                            )
                done.append(role)
            return done

        return await self._run(run)

    async def missing_privileges(self, component: str) -> tuple[str, list[str]]:
        """The connected role and which of ``component``'s grants it lacks (e.g.
        ``INSERT on schedlock_publishes``); owners and superusers lack none."""
        checks = [
            (privilege, kind, name)
            for privileges, objects in GRANTS[component]
            for obj in objects
            for kind, name in [obj.split(" ", 1)]
            for privilege in privileges.split(", ")
        ]
        probes = sql.SQL(", ").join(
            sql.SQL("{}({}, {})").format(
                sql.Identifier(f"has_{kind.lower()}_privilege"),
                sql.Literal(name),
                sql.Literal(privilege),
            )
            for privilege, kind, name in checks
        )

        async def run(conn: Conn) -> tuple[str, list[str]]:
            cur = await conn.execute(
                sql.SQL("SELECT current_user AS role, ARRAY[{}] AS granted").format(probes)
            )
            row = await cur.fetchone()
            assert row is not None
            missing = [
                f"{privilege} on {name}"
                for (privilege, _, name), ok in zip(checks, row["granted"], strict=True)
                if not ok
            ]
            return str(row["role"]), missing

        return await self._run(run)

    async def schema_status(self) -> SchemaStatus:
        async def run(conn: Conn) -> SchemaStatus:
            cur = await conn.execute(
                "SELECT CASE WHEN to_regclass('schedlock_migrations') IS NULL THEN 0 "
                "ELSE (SELECT coalesce(max(id), 0) FROM schedlock_migrations) END AS id"
            )
            row = await cur.fetchone()
            return SchemaStatus(current=int(row["id"]) if row else 0, latest=latest_id("postgres"))

        return await self._run(run)

    # -- sessions -------------------------------------------------------------------------------

    def lock_session(self, key: LockKey, holder: str, lease_seconds: float) -> PostgresLockSession:
        return PostgresLockSession(self.url, key, holder, lease_seconds)

    async def listen(
        self, channel: str, on_payload: Callable[[str], None], ready: asyncio.Event | None = None
    ) -> None:
        """LISTEN on a dedicated connection and call ``on_payload`` until cancelled."""

        async def run() -> None:
            conn = await connect(self.url, application_name=f"{self.application_name}-listen")
            try:
                await conn.execute(f"LISTEN {channel}")
                if ready is not None:
                    ready.set()
                async for note in conn.notifies():
                    on_payload(note.payload)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.close(), 2)

        await _guard(run())

    # -- admin verbs ----------------------------------------------------------------------------

    async def upsert_publish(self, spec: PublishSpec) -> UpsertResult:
        params = _publish_params(spec)
        return await self._run(lambda c: _upsert(c, "upsert_publish", params))

    async def upsert_schedule(self, spec: ScheduleSpec) -> UpsertResult:
        params = {
            "namespace": spec.namespace,
            "name": spec.name,
            "uid": spec.uid,
            "generation": spec.generation,
            "target": spec.target,
            "expression": spec.expression,
            "time_zone": spec.time_zone,
            "payload": Jsonb(spec.payload),
            "max_attempts": spec.max_attempts,
            "backoff_seconds": spec.backoff_seconds,
            "starting_deadline_seconds": spec.starting_deadline_seconds,
            "suspended": spec.suspended,
        }
        return await self._run(lambda c: _upsert(c, "upsert_schedule", params))

    async def cancel_publish(self, uid: str) -> bool:
        async def run(conn: Conn) -> bool:
            cur = await conn.execute(Q["cancel_publish"], {"uid": uid})
            return cur.rowcount > 0

        return await self._run(run)

    async def cancel_schedule(self, uid: str) -> int:
        async def run(conn: Conn) -> int:
            cur = await conn.execute(Q["cancel_schedule"], {"uid": uid})
            return cur.rowcount

        return await self._run(run)

    async def key_status(self) -> list[KeyStatus]:
        async def run(conn: Conn) -> list[KeyStatus]:
            cur = await conn.execute(Q["key_status"])
            return [
                rows.key_status(
                    r,
                    rows.POSTGRES,
                    lock_holder=r["lock_holder"],
                    waiters=int(r["waiters"]),
                    standbys=r["standbys"],
                    reserves=r["reserves"],
                )
                for r in await cur.fetchall()
            ]

        return await self._run(run)

    async def _record(
        self, query: str, uid: str, convert: Callable[[DictRow, rows.Codec], R]
    ) -> R | None:
        """The one row ``query`` finds for ``uid``, converted; None when there is none."""

        async def run(conn: Conn) -> R | None:
            cur = await conn.execute(Q[query], {"uid": uid})
            row = await cur.fetchone()
            return None if row is None else convert(row, rows.POSTGRES)

        return await self._run(run)

    async def get_publish(self, uid: str) -> PublishRecord | None:
        return await self._record("get_publish", uid, rows.publish_record)

    async def get_schedule(self, uid: str) -> ScheduleRecord | None:
        return await self._record("get_schedule", uid, rows.schedule_record)

    async def latest_slot(self, schedule_uid: str) -> PublishRecord | None:
        return await self._record("latest_slot", schedule_uid, rows.publish_record)

    async def changed_since(
        self, since: datetime | None, limit: int = 500
    ) -> tuple[list[PublishRecord], datetime]:
        """Rows changed after ``since`` and the watermark to pass next time (database clock)."""

        async def run(conn: Conn) -> tuple[list[PublishRecord], datetime]:
            cur = await conn.execute(Q["db_now"])
            now_row = await cur.fetchone()
            assert now_row is not None
            start = since or datetime(1970, 1, 1, tzinfo=UTC)
            cur = await conn.execute(Q["changed_since"], {"since": start, "limit": limit})
            found = await cur.fetchall()
            records = [rows.publish_record(r, rows.POSTGRES) for r in found]
            if len(found) == limit:  # more to read: continue from the last one seen
                return records, found[-1]["updated_at"]
            # Overlap by a few seconds: a row whose statement began before now() may commit
            # after it; re-reading it is harmless (syncing is idempotent).
            return records, now_row["now"] - timedelta(seconds=5)

        return await self._run(run)

    async def hold_lock(self, objid: int, holder: str) -> HeldLock:
        """Block until this process holds ``(SCHEDLOCK_CLASS_ID, objid)`` on its own session."""
        conn = await connect(self.url, application_name=holder)
        try:
            await _guard(
                conn.execute("SELECT pg_advisory_lock(%s, %s)", (SCHEDLOCK_CLASS_ID, objid))
            )
        except BaseException:
            await conn.close()
            raise
        return HeldLock(conn)

    async def row_versions(self, uids: Sequence[str]) -> list[RowVersion]:
        """(kind, uid, generation, state) of the one-shot rows and schedules behind ``uids``."""

        async def run(conn: Conn) -> list[RowVersion]:
            cur = await conn.execute(Q["row_versions"], {"uids": list(uids)})
            return [rows.row_version(r) for r in await cur.fetchall()]

        return await self._run(run)

    async def restore_publish(self, spec: PublishSpec, outcome: RecordedOutcome) -> UpsertResult:
        """Store ``spec``'s row in a terminal ``outcome`` its object already records (a row
        that was lost, or reverted to scheduled); a row that moved on is left alone."""
        params = {
            **_publish_params(spec),
            "state": outcome.state,
            "attempts": outcome.attempts,
            "fired_at": outcome.fired_at,
            "last_error": outcome.last_error,
            "term": outcome.term,
            "holder": outcome.holder,
        }
        return await self._run(lambda c: _upsert(c, "restore_publish", params))

    async def publishes_by_id(self, ids: Sequence[int]) -> list[PublishRecord]:
        async def run(conn: Conn) -> list[PublishRecord]:
            cur = await conn.execute(Q["publishes_by_id"], {"ids": list(ids)})
            return [rows.publish_record(r, rows.POSTGRES) for r in await cur.fetchall()]

        return await self._run(run)


def _publish_params(spec: PublishSpec) -> dict[str, Any]:
    return {
        "namespace": spec.namespace,
        "name": spec.name,
        "uid": spec.uid,
        "generation": spec.generation,
        "target": spec.target,
        "due_at": spec.due_at,
        "payload": Jsonb(spec.payload),
        "max_attempts": spec.max_attempts,
        "backoff_seconds": spec.backoff_seconds,
        "starting_deadline_seconds": spec.starting_deadline_seconds,
        "suspended": spec.suspended,
    }


async def _upsert(conn: Conn, name: str, params: Mapping[str, Any]) -> UpsertResult:
    cur = await conn.execute(Q[name], params)
    row = await cur.fetchone()
    if row is None:
        return UpsertResult(id=None, state=None, inserted=False)
    return UpsertResult(id=int(row["id"]), state=row["state"], inserted=bool(row["inserted"]))
