"""The SQLite store for single-process development.

One process by definition: leadership is always granted (holder ``sqlite-leader``), yet the
loops, terms and fencing checks are the same as on PostgreSQL.  All statements run on one
connection in a worker thread, serialised by an asyncio lock.  Timestamps are ISO 8601 UTC
text with a fixed width, so they compare correctly as strings.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from schedlock.store import queries, rows
from schedlock.store.errors import LeadershipLost, StoreError, StoreUnavailable, schema_too_new
from schedlock.store.keys import LockKey
from schedlock.store.migrations import latest_id, migrations
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
    ScheduleSpec,
    SchemaStatus,
    TermStart,
    UpsertResult,
)

Q = queries.load("sqlite")
T = TypeVar("T")
SQLITE_HOLDER = "sqlite-leader"


def iso(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


def parse_ts(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value).astimezone(UTC)


def _ts(value: str) -> datetime:
    parsed = parse_ts(value)
    assert parsed is not None
    return parsed


def path_of(url: str) -> str:
    """``sqlite:///relative.db`` -> ``relative.db``; ``sqlite:////abs.db`` -> ``/abs.db``."""
    return url.removeprefix("sqlite:///")


class _Database:
    """One sqlite3 connection used from a worker thread, one statement batch at a time."""

    def __init__(self, path: str) -> None:
        self.path = path
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
            self._conn = conn
        return self._conn

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        async with self._lock:
            try:
                return await asyncio.to_thread(lambda: fn(self._open()))
            except sqlite3.OperationalError as exc:
                raise StoreUnavailable(str(exc)) from exc
            except sqlite3.Error as exc:
                raise StoreError(str(exc)) from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _transaction(conn: sqlite3.Connection, fn: Callable[[], T]) -> T:
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn()
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


class SqliteLockSession:
    """Always the leader; the same verbs as the PostgreSQL lock session."""

    def __init__(self, db: _Database, key: LockKey, holder: str) -> None:
        self.db = db
        self.key = key
        self.holder = SQLITE_HOLDER
        self._connected = False

    @property
    def connected(self) -> bool:
        return self._connected

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {**self.key.params(), "now": iso(datetime.now(UTC)), **extra}

    async def connect(self) -> None:
        await self.db.run(lambda c: c.execute(Q["register_key"], self._params()))
        self._connected = True

    async def close(self) -> None:
        self._connected = False

    async def acquire(self) -> None:
        return None

    # One process by definition: it is always the leader, so it always has a "standby place"
    # and there is no roster of reserves; NOTIFY does not exist (timers and the poll).
    async def listen(self, channel: str, on_payload: Callable[[str], None]) -> None:
        return None

    async def take_standby_place(self, places: int) -> int | None:
        return 0

    async def leave_standby_place(self) -> None:
        return None

    async def reserve_roster(self) -> ReserveRoster:
        return ReserveRoster(db_now=datetime.now(UTC).timestamp(), rank=0, reserves=1)

    async def enlist_reserve(self, next_check_in: float, grace: float) -> None:
        return None

    async def leave_reserves(self) -> None:
        return None

    async def begin_term(self) -> TermStart:
        params = self._params(holder=self.holder)

        def run(c: sqlite3.Connection) -> TermStart:
            def body() -> TermStart:
                prev = c.execute(Q["previous_term"], params).fetchone()
                row = c.execute(Q["begin_term"], params).fetchone()
                last = parse_ts(prev["released_at"] or prev["heartbeat_at"])
                gap = None if last is None else (_ts(params["now"]) - last).total_seconds()
                return TermStart(
                    term=int(row["term"]),
                    previous_holder=prev["holder"],
                    gap_seconds=gap,
                    previous_released=prev["released_at"] is not None,
                )

            return _transaction(c, body)

        return await self.db.run(run)

    async def heartbeat(self, term: int) -> Heartbeat:
        params = self._params(term=term)

        def run(c: sqlite3.Connection) -> Heartbeat:
            if c.execute(Q["heartbeat"], params).rowcount != 1:
                raise LeadershipLost(f"term {term} of {self.key} was superseded")
            row = c.execute(Q["backlog"], params).fetchone()
            oldest = parse_ts(row["oldest_due"])
            age = None if oldest is None else (_ts(params["now"]) - oldest).total_seconds()
            return Heartbeat(alive=True, backlog=int(row["backlog"]), oldest_due_age=age)

        return await self.db.run(run)

    async def release(self, term: int | None) -> None:
        if term is not None:
            await self.db.run(lambda c: c.execute(Q["release_term"], self._params(term=term)))
        self._connected = False

    async def adopt_orphans(self, term: int) -> list[FireRow]:
        params = self._params(term=term, holder=self.holder)
        found = await self.db.run(lambda c: c.execute(Q["adopt_orphans"], params).fetchall())
        return [rows.fire_row(r, rows.SQLITE) for r in found]

    async def claim_due(self, term: int, limit: int) -> ClaimResult:
        params = self._params(term=term, holder=self.holder, limit=limit)

        def run(c: sqlite3.Connection) -> ClaimResult:
            found = c.execute(Q["claim_due"], params).fetchall() if limit > 0 else []
            next_due_in = None
            if len(found) < limit or limit == 0:
                nxt = parse_ts(c.execute(Q["next_due"], params).fetchone()["next_due"])
                if nxt is not None:
                    next_due_in = (nxt - _ts(params["now"])).total_seconds()
            return ClaimResult(
                rows=[rows.fire_row(r, rows.SQLITE) for r in found],
                next_due_in=next_due_in,
            )

        return await self.db.run(run)

    async def complete(self, term: int, completions: Sequence[Completion]) -> int:
        base = self._params(term=term)
        batch = [
            {
                **base,
                "id": c.id,
                "outcome": c.outcome,
                "next_attempt_at": None if c.next_attempt_at is None else iso(c.next_attempt_at),
                "status": c.status,
                "error": c.error,
                "sent": c.sent,
            }
            for c in completions
        ]

        def run(c: sqlite3.Connection) -> int:
            return _transaction(
                c, lambda: sum(c.execute(Q["complete_one"], p).rowcount for p in batch)
            )

        done = await self.db.run(run)
        if done != len(completions):
            raise LeadershipLost(f"only {done} of {len(completions)} outcomes were recorded")
        return done

    async def due_schedules(self, limit: int) -> list[DueSchedule]:
        params = self._params(limit=limit)
        found = await self.db.run(lambda c: c.execute(Q["due_schedules"], params).fetchall())
        return [rows.due_schedule(r, rows.SQLITE) for r in found]

    async def next_slot_in(self) -> float | None:
        params = self._params()
        row = await self.db.run(lambda c: c.execute(Q["next_slot"], params).fetchone())
        if row["unplanned"]:
            return 0.0
        nxt = parse_ts(row["next_slot"])
        return None if nxt is None else (nxt - _ts(params["now"])).total_seconds()

    async def insert_slot(
        self, term: int, schedule_id: int, slot_uid: str, slot_at: datetime
    ) -> bool:
        params = self._params(
            term=term, schedule_id=schedule_id, slot_uid=slot_uid, slot_at=iso(slot_at)
        )
        count = await self.db.run(lambda c: c.execute(Q["insert_slot"], params).rowcount)
        return int(count) == 1

    async def advance_schedule(
        self,
        term: int,
        schedule_id: int,
        *,
        watermark_at: datetime,
        next_slot_at: datetime,
        fired_slot_at: datetime | None,
    ) -> None:
        params = self._params(
            term=term,
            schedule_id=schedule_id,
            watermark_at=iso(watermark_at),
            next_slot_at=iso(next_slot_at),
            fired_slot_at=None if fired_slot_at is None else iso(fired_slot_at),
        )
        count = await self.db.run(lambda c: c.execute(Q["advance_schedule"], params).rowcount)
        if count != 1:
            raise LeadershipLost(f"term {term} of {self.key} was superseded")


class SqliteStore:
    dialect = "sqlite"
    always_leader = True

    def __init__(self, url: str, *, application_name: str = "schedlock") -> None:
        self.url = url
        self.application_name = application_name
        self.db = _Database(path_of(url))

    async def close(self) -> None:
        self.db.close()

    def _now(self) -> str:
        return iso(datetime.now(UTC))

    async def migrate(self) -> list[int]:
        def run(c: sqlite3.Connection) -> list[int]:
            def body() -> list[int]:
                c.execute(
                    "CREATE TABLE IF NOT EXISTS schedlock_migrations ("
                    " id integer PRIMARY KEY, name text NOT NULL, applied_at text NOT NULL)"
                )
                current = int(
                    c.execute("SELECT coalesce(max(id), 0) FROM schedlock_migrations").fetchone()[0]
                )
                latest = latest_id("sqlite")
                if current > latest:
                    raise schema_too_new(current, latest)
                applied = []
                for migration in migrations("sqlite"):
                    if migration.id > current:
                        for statement in _statements(migration.sql):
                            c.execute(statement)
                        c.execute(
                            "INSERT INTO schedlock_migrations (id, name, applied_at)"
                            " VALUES (?, ?, ?)",
                            (migration.id, migration.name, self._now()),
                        )
                        applied.append(migration.id)
                return applied

            return _transaction(c, body)  # BEGIN IMMEDIATE serialises concurrent migrators

        return await self.db.run(run)

    async def grant(self, *, sidecar_role: str | None, operator_role: str | None) -> list[str]:
        raise StoreError("SQLite has no roles: grants need PostgreSQL")

    async def missing_privileges(self, component: str) -> tuple[str, list[str]]:
        return "", []  # SQLite has no roles: the file's permissions are the only guard

    async def schema_status(self) -> SchemaStatus:
        def run(c: sqlite3.Connection) -> int:
            exists = c.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schedlock_migrations'"
            ).fetchone()
            if not exists:
                return 0
            return int(
                c.execute("SELECT coalesce(max(id), 0) FROM schedlock_migrations").fetchone()[0]
            )

        return SchemaStatus(current=await self.db.run(run), latest=latest_id("sqlite"))

    def lock_session(self, key: LockKey, holder: str, lease_seconds: float) -> SqliteLockSession:
        return SqliteLockSession(self.db, key, holder)

    async def listen(
        self, channel: str, on_payload: Callable[[str], None], ready: asyncio.Event | None = None
    ) -> None:
        """SQLite has no NOTIFY: the loops rely on their timers and the safety poll."""
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()

    async def _upsert(self, name: str, params: dict[str, Any]) -> UpsertResult:
        row = await self.db.run(lambda c: c.execute(Q[name], params).fetchone())
        if row is None:
            return UpsertResult(id=None, state=None, inserted=False)
        return UpsertResult(id=int(row["id"]), state=row["state"], inserted=bool(row["inserted"]))

    def _publish_params(self, spec: PublishSpec) -> dict[str, Any]:
        return {
            "namespace": spec.namespace,
            "name": spec.name,
            "uid": spec.uid,
            "generation": spec.generation,
            "target": spec.target,
            "due_at": iso(spec.due_at),
            "payload": json.dumps(spec.payload),
            "max_attempts": spec.max_attempts,
            "backoff_seconds": spec.backoff_seconds,
            "starting_deadline_seconds": spec.starting_deadline_seconds,
            "suspended": spec.suspended,
            "now": self._now(),
        }

    async def upsert_publish(self, spec: PublishSpec) -> UpsertResult:
        return await self._upsert("upsert_publish", self._publish_params(spec))

    async def restore_publish(self, spec: PublishSpec, outcome: RecordedOutcome) -> UpsertResult:
        return await self._upsert(
            "restore_publish",
            {
                **self._publish_params(spec),
                "state": outcome.state,
                "attempts": outcome.attempts,
                "fired_at": None if outcome.fired_at is None else iso(outcome.fired_at),
                "last_error": outcome.last_error,
                "term": outcome.term,
                "holder": outcome.holder,
            },
        )

    async def row_versions(self, uids: Sequence[str]) -> list[RowVersion]:
        params = {"uids": json.dumps(list(uids))}
        found = await self.db.run(lambda c: c.execute(Q["row_versions"], params).fetchall())
        return [rows.row_version(r) for r in found]

    async def upsert_schedule(self, spec: ScheduleSpec) -> UpsertResult:
        return await self._upsert(
            "upsert_schedule",
            {
                "namespace": spec.namespace,
                "name": spec.name,
                "uid": spec.uid,
                "generation": spec.generation,
                "target": spec.target,
                "expression": spec.expression,
                "time_zone": spec.time_zone,
                "payload": json.dumps(spec.payload),
                "max_attempts": spec.max_attempts,
                "backoff_seconds": spec.backoff_seconds,
                "starting_deadline_seconds": spec.starting_deadline_seconds,
                "suspended": spec.suspended,
                "now": self._now(),
            },
        )

    async def cancel_publish(self, uid: str) -> bool:
        params = {"uid": uid, "now": self._now()}
        found = await self.db.run(lambda c: c.execute(Q["cancel_publish"], params).fetchall())
        return len(found) > 0

    async def cancel_schedule(self, uid: str) -> int:
        params = {"uid": uid, "now": self._now()}

        def run(c: sqlite3.Connection) -> int:
            def body() -> int:
                count = c.execute(Q["cancel_schedule_rows"], params).rowcount
                c.execute(Q["cancel_schedule"], params)
                return int(count)

            return _transaction(c, body)

        return await self.db.run(run)

    async def key_status(self) -> list[KeyStatus]:
        params = {"now": self._now()}
        found = await self.db.run(lambda c: c.execute(Q["key_status"], params).fetchall())
        return [
            rows.key_status(
                r,
                rows.SQLITE,
                lock_holder=r["holder"] if r["released_at"] is None and r["term"] else None,
                waiters=0,
            )
            for r in found
        ]

    async def get_publish(self, uid: str) -> PublishRecord | None:
        row = await self.db.run(lambda c: c.execute(Q["get_publish"], {"uid": uid}).fetchone())
        return None if row is None else rows.publish_record(row, rows.SQLITE)

    async def publishes_by_id(self, ids: Sequence[int]) -> list[PublishRecord]:
        raise StoreError("publishes_by_id is only used by the operator, which needs PostgreSQL")


def _statements(sql: str) -> list[str]:
    from schedlock.store.migrations import split_statements

    return split_statements(sql)
