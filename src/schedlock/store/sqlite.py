"""The SQLite connector, for single-process development.

One process by definition: leadership is always granted (holder ``sqlite-leader``), yet the
loops, terms and fencing checks are the same as on PostgreSQL (the verbs are
:mod:`schedlock.store.verbs`').  All statements run on one connection in a worker thread,
one session at a time (an asyncio lock).  ``now()`` is the session's timestamp, fixed when
the session starts, as PostgreSQL's is the transaction's.  Timestamps are ISO 8601 UTC text
with a fixed width, so they compare correctly as strings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from schedlock.store import models, queries
from schedlock.store.errors import StoreError, StoreUnavailable
from schedlock.store.keys import LockKey, TargetLock
from schedlock.store.migrations import split_statements
from schedlock.store.rows import Codec, Params, Row, iso, stored_payload, text_timestamp
from schedlock.store.verbs import LockVerbs

T = TypeVar("T")
SQLITE_HOLDER = "sqlite-leader"
CODEC = Codec(
    timestamp=text_timestamp,
    payload=stored_payload,
    dump_timestamp=iso,
    # As PostgreSQL prints jsonb (", " and ": ", characters unescaped): the stored text's
    # length is the payload's size that migration 0007's triggers bound.
    dump_json=lambda v: json.dumps(v, ensure_ascii=False),
)


@cache
def _statements(name: str) -> tuple[str, ...]:
    return tuple(split_statements(queries.load("sqlite")[name] + ";"))


def path_of(url: str) -> str:
    """``sqlite:///relative.db`` -> ``relative.db``; ``sqlite:////abs.db`` -> ``/abs.db``."""
    return url.removeprefix("sqlite:///")


def _run(
    conn: sqlite3.Connection, statements: tuple[str, ...], params: Params
) -> tuple[list[Row], int]:
    """Run a named query's statements: the last row-returning one's rows, each joined by the
    first row of the row-returning ones before it, and the last statement's row count."""
    joined: dict[str, Any] = {}
    found: list[Row] | None = None
    count = 0
    for statement in statements:
        cur = conn.execute(statement, params)
        if cur.description is not None:
            if found:
                joined.update(found[0])
            found = [dict(r) for r in cur.fetchall()]
        count = cur.rowcount
    return [{**joined, **r} for r in found or []], count


class _Database:
    """One sqlite3 connection used from a worker thread, one session at a time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.clock = iso(datetime.now(UTC))
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()

    def _open(self) -> sqlite3.Connection:
        if self._conn is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=30
            )
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA busy_timeout=30000")
            conn.create_function("now", 0, lambda: self.clock)
            self._conn = conn
        return self._conn

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await asyncio.to_thread(lambda: fn(self._open()))
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(str(exc)) from exc
        except sqlite3.Error as exc:
            raise StoreError(str(exc)) from exc

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[SqliteSession]:
        async with self._lock:
            self.clock = iso(datetime.now(UTC))
            yield SqliteSession(self)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class SqliteSession:
    """Named queries on the one connection; a query of several statements is atomic."""

    def __init__(self, db: _Database) -> None:
        self.db = db

    async def _query(self, name: str, params: Params) -> tuple[list[Row], int]:
        statements, values = _statements(name), CODEC.encode(params)
        if len(statements) == 1:
            return await self.db.call(lambda c: _run(c, statements, values))
        async with self.transaction():
            return await self.db.call(lambda c: _run(c, statements, values))

    async def fetch(self, name: str, params: Params) -> list[Row]:
        return (await self._query(name, params))[0]

    async def fetch_each(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Each named query once, in one transaction."""
        async with self.transaction():
            return [await self.fetch(name, params) for name, params in queries]

    async def execute(self, name: str, params: Params) -> int:
        return (await self._query(name, params))[1]

    async def run_sql(self, statement: str) -> None:
        await self.db.call(lambda c: c.execute(statement))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """BEGIN IMMEDIATE (writers queue here, as migrators must); nested: the outer one."""
        if await self.db.call(lambda c: c.in_transaction):
            yield
            return
        await self.db.call(lambda c: c.execute("BEGIN IMMEDIATE"))
        try:
            yield
        except BaseException:
            await self.db.call(lambda c: c.execute("ROLLBACK"))
            raise
        await self.db.call(lambda c: c.execute("COMMIT"))


class SqliteLockSession(LockVerbs):
    """Always the leader: no lock to wait for, no standby places, no reserves, no NOTIFY
    (the loops rely on their timers and the safety poll)."""

    codec = CODEC

    def __init__(self, db: _Database, key: LockKey, keys: tuple[LockKey, ...] = ()) -> None:
        self.db = db
        self.key = key
        self.keys = keys or (key,)
        self.holder = SQLITE_HOLDER
        self._connected = False

    async def _fetch(self, name: str, params: Params) -> list[Row]:
        async with self.db.session() as session:
            return await session.fetch(name, params)

    async def _execute(self, name: str, params: Params) -> int:
        async with self.db.session() as session:
            return await session.execute(name, params)

    @property
    def connected(self) -> bool:
        return self._connected

    async def connect(self) -> None:
        for key in self.keys:
            await self._execute("register_key", {**key.params(), "holder": self.holder})
        self._connected = True

    async def close(self) -> None:
        self._connected = False

    async def try_acquire(self) -> bool:
        return True  # one process: its lock is always free to it

    async def acquire(self, on_holder: models.OnHolder | None = None) -> None:
        # Nothing to wait for, and no other session that could hold the lock: never calls it.
        return None

    async def listen(self, channel: str, on_payload: Callable[[str], None]) -> None:
        return None

    async def lock_key(
        self, key: LockKey, on_holder: models.OnHolder | None = None
    ) -> SqliteLockSession:
        # One process: every key's lock is its own.
        session = SqliteLockSession(self.db, key)
        session._connected = self._connected
        return session

    async def take_standby_place(self, places: int) -> int | None:
        return 0

    async def leave_standby_place(self) -> None:
        return None

    async def reserve_roster(self) -> models.ReserveRoster:
        return models.ReserveRoster(db_now=datetime.now(UTC).timestamp(), rank=0, reserves=1)

    async def enlist_reserve(self, next_check_in: float, grace: float) -> None:
        return None

    async def leave_reserves(self) -> None:
        return None


class _HeldLocally:
    """One process holds every lock of its own database."""

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None


class SqliteConnector:
    dialect = "sqlite"
    notifies = False  # one process, no NOTIFY
    codec = CODEC

    def __init__(self, url: str) -> None:
        self.url = url
        self.db = _Database(path_of(url))

    def session(self) -> contextlib.AbstractAsyncContextManager[SqliteSession]:
        return self.db.session()

    @contextlib.asynccontextmanager
    async def migration_session(self) -> AsyncIterator[SqliteSession]:
        """One transaction for every migration (and every down step of a ``migrate --to``):
        BEGIN IMMEDIATE serialises migrators.  The migrations table is brought to its current
        form first (an older release's lacks ``additive``; SQLite cannot add it if missing)."""
        async with self.db.session() as session, session.transaction():
            await session.execute("create_migrations_table", {})
            columns = {r["name"] for r in await session.fetch("migrations_columns", {})}
            if "additive" not in columns:
                await session.execute("add_migrations_additive", {})
            yield session

    async def close(self) -> None:
        self.db.close()

    @contextlib.asynccontextmanager
    async def pass_sessions(
        self,
    ) -> AsyncIterator[Callable[[], contextlib.AbstractAsyncContextManager[SqliteSession]]]:
        """A short session per statement of a pruning pass: the one connection is the firing
        loops' too, and they run between the pass's batches."""
        yield self.db.session

    async def grant(self, request: models.GrantRequest) -> models.GrantReport:
        return models.GrantReport()  # SQLite has no roles: nobody to grant to

    async def served_namespaces(self) -> models.ServedNamespaces:
        # one process owns the file: it serves what it is configured for
        return models.ServedNamespaces("", (models.EVERY_NAMESPACE,))

    async def missing_privileges(self, component: str) -> tuple[str, list[str]]:
        return "", []  # SQLite has no roles: the file's permissions are the only guard

    def lock_session(
        self, key: LockKey, holder: str, lease_seconds: float, target: TargetLock | None = None
    ) -> SqliteLockSession:
        return SqliteLockSession(self.db, key, target.keys if target else (key,))

    async def listen(
        self, channel: str, on_payload: models.OnPayload, ready: asyncio.Event | None = None
    ) -> None:
        """SQLite has no NOTIFY: the loops rely on their timers and the safety poll."""
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()

    async def hold_lock(self, objid: int, holder: str) -> _HeldLocally:
        return _HeldLocally()
