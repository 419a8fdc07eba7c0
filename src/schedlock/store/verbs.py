"""The store's domain verbs, written once over a dialect's connector.

A connector (:mod:`schedlock.store.postgres`, :mod:`schedlock.store.sqlite`) only opens
sessions that run named queries (:mod:`schedlock.store.queries`) and transactions, and keeps
what is by nature its own: PostgreSQL's advisory locks, LISTEN, roles and the pool; SQLite's
single process.  Everything else — which query a verb runs, its parameters from the spec,
the models it returns, the fencing checks on the answers — is here, the same for both.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from schedlock.core.logs import Event
from schedlock.core.payloads import MAX_PAYLOAD_BYTES
from schedlock.core.timings import MAX_LEASE_SECONDS
from schedlock.store import models
from schedlock.store.contract import Maintenance, Sessions
from schedlock.store.errors import (
    LeadershipLost,
    SchemaError,
    SchemaNotCurrent,
    StoreError,
    StoreUnavailable,
    schema_too_new,
)
from schedlock.store.keys import (
    LEADER_CLASS_ID,
    SCHEDLOCK_CLASS_ID,
    STANDBY_CLASS_ID,
    LockKey,
)
from schedlock.store.migrations import (
    Migration,
    blocking,
    latest_id,
    migrations,
    plan,
    split_statements,
)
from schedlock.store.rows import Codec, Params, Row, fields_of, from_row, iso

if TYPE_CHECKING:
    pass

log = logging.getLogger("schedlock.store")
M = TypeVar("M")
# Rows written per transaction by upsert_many (on PostgreSQL one executemany pipeline per
# query of the batch, not a round trip per row).
UPSERT_BATCH = 500
# The sweep re-reads this far behind the database clock: a row whose statement began before
# now() may commit after it (re-reading is harmless, syncing is idempotent).
SWEEP_OVERLAP = timedelta(seconds=5)


def orphan_exhausted(row: models.FireRow) -> str:
    """Why an orphan with no attempts left is not fired again (its ``last_error``)."""
    return (
        f"attempt {row.attempt} of {row.max_attempts} was cut off: its leader ended during the "
        "delivery (crashed or lost its lease); no attempts left, so it is not fired again"
    )


class Session(Protocol):
    """One connection of a connector, running named queries (parameters by name)."""

    async def fetch(self, name: str, params: Params) -> list[Row]: ...
    async def fetch_each(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]: ...
    async def execute(self, name: str, params: Params) -> int: ...
    async def run_sql(self, statement: str) -> None: ...
    def transaction(self) -> AbstractAsyncContextManager[None]: ...


class Connector(Sessions, Protocol):
    """What differs between PostgreSQL and SQLite; the verbs are :class:`SqlStore`'s."""

    codec: Codec

    def session(self) -> AbstractAsyncContextManager[Session]: ...
    def migration_session(self) -> AbstractAsyncContextManager[Session]: ...
    def pass_sessions(self) -> AbstractAsyncContextManager[SessionOpener]: ...


SessionOpener = Callable[[], AbstractAsyncContextManager[Session]]


class LockVerbs:
    """The row verbs of a lock session: term, heartbeat, claims, outcomes, schedules.

    Fencing: every transition statement also requires ``schedlock_terms.term`` to equal the
    term this session started, and runs on the session that holds the lock.  A dialect's
    session class adds the lock itself and says how its statements run.
    """

    key: LockKey
    holder: str
    codec: Codec

    async def _fetch(self, name: str, params: Params) -> list[Row]:
        raise NotImplementedError

    async def _execute(self, name: str, params: Params) -> int:
        raise NotImplementedError

    async def _before_term(self) -> None:
        """A dialect's checks before a term begins (PostgreSQL: still a writable primary)."""

    def _check_backend(self, heartbeat: Row) -> None:
        """A dialect's check of each heartbeat's answer (PostgreSQL: the same backend)."""

    async def _unlock(self) -> None:
        """Give the key's lock back (checked), on a graceful release."""

    async def close(self) -> None:
        raise NotImplementedError

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {**self.key.params(), "holder": self.holder, **extra}

    async def _one(self, name: str, params: Params) -> Row:
        found = await self._fetch(name, params)
        if not found:
            raise StoreError(f"query {name} returned no row")
        return found[0]

    def _superseded(self, term: int) -> LeadershipLost:
        return LeadershipLost(f"term {term} of {self.key} was superseded")

    async def begin_term(self) -> models.TermStart:
        """Bump the key's term; how long the key was leaderless (database clock)."""
        await self._before_term()
        return from_row(models.TermStart, await self._one("begin_term", self._params()), self.codec)

    async def heartbeat(self, term: int) -> models.Heartbeat:
        row = await self._one("heartbeat", self._params(term=term))
        self._check_backend(row)
        if not row["alive"]:
            raise self._superseded(term)
        return from_row(models.Heartbeat, row, self.codec)

    async def release(self, term: int | None) -> None:
        """Graceful hand-over: record the release, unlock (checked), close."""
        try:
            if term is not None:
                await self._execute("release_term", self._params(term=term))
            await self._unlock()
        finally:
            await self.close()

    async def adopt_orphans(self, term: int) -> list[models.FireRow]:
        """An earlier term's rows left ``firing``: those with attempts left, to fire again, and
        those without, each with its ``problem`` (the leader ends them ``failed``)."""
        params = self._params(term=term, max_payload_bytes=MAX_PAYLOAD_BYTES)
        exhausted = [
            from_row(models.FireRow, r, self.codec)
            for r in await self._fetch("exhausted_orphans", params)
        ]
        found = await self._fetch("adopt_orphans", params)
        return [
            *(dataclasses.replace(row, problem=orphan_exhausted(row)) for row in exhausted),
            *(from_row(models.FireRow, r, self.codec) for r in found),
        ]

    async def claim_due(self, term: int, limit: int) -> models.ClaimResult:
        params = self._params(term=term, limit=limit, max_payload_bytes=MAX_PAYLOAD_BYTES)
        found = await self._fetch("claim_due", params) if limit > 0 else []
        next_due_in: float | None = None
        if len(found) < limit or limit == 0:
            next_due_in = (await self._one("next_due", self._params()))["next_due_in"]
        return models.ClaimResult(
            rows=[from_row(models.FireRow, r, self.codec) for r in found], next_due_in=next_due_in
        )

    async def complete(self, term: int, completions: Sequence[models.Completion]) -> int:
        """Record a batch of outcomes in one statement (PostgreSQL notifies the operator)."""
        if not completions:
            return 0
        batch = [
            {**fields_of(c), "next_attempt_at": c.next_attempt_at and iso(c.next_attempt_at)}
            for c in completions
        ]
        params = self._params(term=term, completions=batch, channel=models.Channel.OUTCOMES)
        done = int((await self._one("complete", params))["completed"])
        if done != len(completions):
            raise LeadershipLost(
                f"only {done} of {len(completions)} outcomes were recorded for {self.key} "
                f"term {term}: the term moved on"
            )
        return done

    async def due_schedules(self, limit: int) -> list[models.DueSchedule]:
        found = await self._fetch("due_schedules", self._params(limit=limit))
        return [from_row(models.DueSchedule, r, self.codec) for r in found]

    async def next_slot_in(self) -> float | None:
        row = await self._one("next_slot", self._params())
        if row["unplanned"]:
            return 0.0
        return None if row["next_slot_in"] is None else float(row["next_slot_in"])

    async def insert_slot(
        self, term: int, schedule_id: int, slot_uid: str, slot_at: datetime
    ) -> bool:
        params = {
            "term": term,
            "schedule_id": schedule_id,
            "slot_uid": slot_uid,
            "slot_at": slot_at,
            "max_payload_bytes": MAX_PAYLOAD_BYTES,
        }
        return len(await self._fetch("insert_slot", params)) == 1

    async def advance_schedule(
        self, term: int, schedule_id: int, advance: models.ScheduleAdvance
    ) -> None:
        """Move the schedule's ``watermark_at``, ``next_slot_at`` and (when a slot fired)
        ``last_slot_at`` to ``fired_slot_at`` — the fields are the query's parameters."""
        params = {"term": term, "schedule_id": schedule_id, **dataclasses.asdict(advance)}
        if await self._execute("advance_schedule", params) != 1:
            raise self._superseded(term)


def _upsert_query(spec: models.PublishSpec | models.ScheduleSpec) -> tuple[str, Params]:
    name = "upsert_publish" if isinstance(spec, models.PublishSpec) else "upsert_schedule"
    return name, fields_of(spec)


def _a_rows_own(error: StoreError) -> bool:
    """Whether an upsert's error may be its row's alone (its data refused), not the
    database's or the schema's: only then are the other rows worth writing."""
    return not isinstance(error, (StoreUnavailable, SchemaError))


def _upsert_result(rows: list[Row], codec: Codec) -> models.UpsertResult:
    """An upsert's answer: the row written, or none (this generation was already there)."""
    if not rows:
        return models.UpsertResult(id=None, state=None, inserted=False)
    return from_row(models.UpsertResult, rows[0], codec)


class SqlStore:
    """The :class:`schedlock.store.Store` of either dialect: admin verbs and status reads over
    one connector, whose sessions, roles and closing (``Sessions``) it offers as they are."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector
        self.codec = connector.codec
        self.dialect = connector.dialect
        self.notifies = connector.notifies
        self.url = connector.url
        self.close = connector.close
        self.grant = connector.grant
        self.served_namespaces = connector.served_namespaces
        self.missing_privileges = connector.missing_privileges
        self.lock_session = connector.lock_session
        self.listen = connector.listen
        self.hold_lock = connector.hold_lock

    async def _fetch(self, name: str, params: Params | None = None) -> list[Row]:
        async with self.connector.session() as session:
            return await session.fetch(name, params or {})

    async def _models(self, cls: type[M], name: str, params: Params | None = None) -> list[M]:
        return [from_row(cls, r, self.codec) for r in await self._fetch(name, params)]

    async def _record(self, cls: type[M], name: str, uid: str) -> M | None:
        found = await self._models(cls, name, {"uid": uid})
        return found[0] if found else None

    async def _upsert(self, name: str, params: Params) -> models.UpsertResult:
        return _upsert_result(await self._fetch(name, params), self.codec)

    # -- schema ---------------------------------------------------------------------------------

    async def migrate(self, *, to: int | None = None, force: bool = False) -> list[int]:
        """Take the schema to migration ``to`` (default: this binary's newest), serialised
        against other migrators: the migrations applied, ascending, or undone by their down
        steps, descending (each step in its own transaction on PostgreSQL, and its record
        removed).  Refuses (MigrationRefused) a down step that loses data unless ``force``;
        without ``to``, a schema beyond this binary is left alone when it runs on it (every
        newer migration additive) and refused (SchemaTooNew) otherwise."""
        dialect = self.dialect
        known = migrations(dialect)
        latest = latest_id(dialect)
        async with self.connector.migration_session() as session:
            current = int((await session.fetch("schema_version", {}))[0]["id"])
            if to is None:
                if current > latest:
                    blocking = await self._blocking(session, latest)
                    if blocking is not None:
                        raise schema_too_new(current, latest, blocking)
                    return []
                to = latest
            steps = plan(known, current, to, force=force)
            for migration in steps.up:
                async with session.transaction():
                    for statement in split_statements(migration.sql):
                        await session.run_sql(statement)
                    params = {"id": migration.id, "name": migration.name}
                    await session.execute(
                        "record_migration", {**params, "additive": migration.additive}
                    )
                _logged(Event.MIGRATION_APPLIED, "applied migration", migration)
            for migration in steps.down:
                async with session.transaction():
                    for statement in split_statements(migration.down_sql):
                        await session.run_sql(statement)
                    await session.execute("forget_migration", {"id": migration.id})
                _logged(Event.MIGRATION_REVERTED, "reverted migration", migration)
            return [m.id for m in steps.up or steps.down]

    @staticmethod
    async def _blocking(session: Session, latest: int) -> int | None:
        found = await session.fetch("migrations_beyond", {"latest": latest})
        return blocking(((int(r["id"]), bool(r["additive"])) for r in found), latest)

    async def schema_status(self) -> models.SchemaStatus:
        latest = latest_id(self.dialect)
        async with self.connector.session() as session:
            found = await session.fetch("migrations_recorded", {})
            recorded, usable = found[0]["recorded"], found[0]["unusable_schema"] is None
            location, elsewhere = found[0]["location"], found[0]["elsewhere"]
            if not recorded and elsewhere is not None:
                fix = f"set SCHEDLOCK_DATABASE_SCHEMA={elsewhere} (--database-schema)"
                raise SchemaNotCurrent(
                    f"schema {location!r} holds no schedlock install, schema {elsewhere!r} of "
                    f"this database does: {fix} for every component",
                    summary=f"schedlock is installed in schema {elsewhere}, not {location}: {fix}",
                )
            found = await session.fetch("schema_version", {}) if recorded else [{"id": 0}]
            current = int(found[0]["id"])
            blocking = await self._blocking(session, latest) if current > latest else None
        return models.SchemaStatus(
            current=current, latest=latest, blocking=blocking, location=location, usable=usable
        )

    # -- rows -----------------------------------------------------------------------------------

    async def upsert_publish(self, spec: models.PublishSpec) -> models.UpsertResult:
        return await self._upsert("upsert_publish", fields_of(spec))

    async def upsert_schedule(self, spec: models.ScheduleSpec) -> models.UpsertResult:
        return await self._upsert("upsert_schedule", fields_of(spec))

    async def upsert_many(
        self, specs: Sequence[models.PublishSpec | models.ScheduleSpec]
    ) -> list[models.UpsertResult]:
        """``upsert_publish`` / ``upsert_schedule`` of every spec, results in order:
        ``UPSERT_BATCH`` rows to a transaction, each query's statements sent as one
        ``executemany`` pipeline on PostgreSQL (not a round trip per row).  A batch that one
        row's data fails (a constraint, a namespace not served) is written again row by row:
        the other rows land, and the first row error is raised after all were tried, as the
        single verbs would have it."""
        results: list[models.UpsertResult] = []
        for start in range(0, len(specs), UPSERT_BATCH):
            batch = specs[start : start + UPSERT_BATCH]
            try:
                async with self.connector.session() as session:
                    found = await session.fetch_each([_upsert_query(s) for s in batch])
            except StoreError as error:
                if not _a_rows_own(error):
                    raise
                results.extend(await self._upsert_one_by_one(batch))
                continue
            results.extend(_upsert_result(rows, self.codec) for rows in found)
        return results

    async def _upsert_one_by_one(
        self, specs: Sequence[models.PublishSpec | models.ScheduleSpec]
    ) -> list[models.UpsertResult]:
        results: list[models.UpsertResult] = []
        first: StoreError | None = None
        for spec in specs:
            try:
                results.append(await self._upsert(*_upsert_query(spec)))
            except StoreError as error:
                if not _a_rows_own(error):
                    raise
                first = first or error
        if first is not None:
            raise first
        return results

    async def restore_publish(
        self, spec: models.PublishSpec, outcome: models.RecordedOutcome
    ) -> models.UpsertResult:
        """``spec``'s row keeps the terminal ``outcome`` its object already records: a missing
        row (pruned, lost) is stored in it, one back in scheduled/suspended is put back in it, a
        finished one of an older generation only takes the spec; firing or newer: left alone."""
        return await self._upsert("restore_publish", {**fields_of(spec), **fields_of(outcome)})

    async def cancel_publish(self, uid: str) -> bool:
        return bool(await self._fetch("cancel_publish", {"uid": uid}))

    async def cancel_schedule(self, uid: str) -> int:
        """Cancel a schedule and its slots not yet fired: how many slots were cancelled."""
        return len(await self._fetch("cancel_schedule", {"uid": uid}))

    async def key_status(self) -> list[models.KeyStatus]:
        """Every key's term and rows, joined by who holds and waits for its lock."""
        async with self.connector.session() as session:
            keys = await session.fetch("key_status", {})
            held = await session.fetch("key_sessions", {"leader_classid": LEADER_CLASS_ID})
        sessions = {_key_of(r): r for r in held}
        return [
            from_row(models.KeyStatus, {**r, **sessions.get(_key_of(r), {})}, self.codec)
            for r in keys
        ]

    async def session_budget(self) -> models.SessionBudget:
        """Sessions held by schedlock's replicas (leaders, standbys) and the server's limit."""
        params = {
            "leader_classid": LEADER_CLASS_ID,
            "key_classid": SCHEDLOCK_CLASS_ID,
            "standby_classid": STANDBY_CLASS_ID,
        }
        async with self.connector.session() as session:
            row = (await session.fetch("session_budget", params))[0]
        return from_row(models.SessionBudget, row, self.codec)

    async def get_publish(self, uid: str) -> models.PublishRecord | None:
        return await self._record(models.PublishRecord, "get_publish", uid)

    async def get_schedule(self, uid: str) -> models.ScheduleRecord | None:
        return await self._record(models.ScheduleRecord, "get_schedule", uid)

    async def latest_slot(self, schedule_uid: str) -> models.PublishRecord | None:
        return await self._record(models.PublishRecord, "latest_slot", schedule_uid)

    async def publishes_by_id(self, ids: Sequence[int]) -> list[models.PublishRecord]:
        return await self._models(models.PublishRecord, "publishes_by_id", {"ids": list(ids)})

    async def row_versions(self, uids: Sequence[str]) -> list[models.RowVersion]:
        """(kind, uid, generation, state) of the one-shot rows and schedules behind ``uids``."""
        return await self._models(models.RowVersion, "row_versions", {"uids": list(uids)})

    async def changed_since(
        self, since: models.SweepPosition, limit: int = models.SWEEP_PAGE
    ) -> tuple[list[models.PublishRecord], models.SweepPosition]:
        """Rows changed since ``since`` and the position to pass next time (database clock):
        after the last row read while pages are full, else ``SWEEP_OVERLAP`` before now."""
        async with self.connector.session() as session:
            now = self.codec.timestamp((await session.fetch("db_now", {}))[0]["now"])
            params = {"since": since.at, "after_id": since.after_id, "limit": limit}
            found = await session.fetch("changed_since", params)
        records = [from_row(models.PublishRecord, r, self.codec) for r in found]
        if len(found) == limit:  # more to read: continue after the last one seen
            last = found[-1]
            return records, models.SweepPosition(
                self.codec.timestamp(last["updated_at"]), last["id"]
            )
        return records, models.SweepPosition(now - SWEEP_OVERLAP)

    # -- status sync cursor (migration 0006) ------------------------------------------------------

    async def sync_cursor(self, name: str) -> models.SyncCursor:
        """The cursor ``name``'s stored watermark (None: never stored) and the database clock."""
        [found] = await self._models(models.SyncCursor, "sync_cursor", {"name": name})
        return found

    async def store_sync_cursor(self, name: str, watermark_at: datetime, holder: str) -> None:
        """Store where the sync resumes (after a completed sweep, by the sync lock's holder)."""
        async with self.connector.session() as session:
            params = {"name": name, "watermark_at": watermark_at, "holder": holder}
            await session.execute("store_sync_cursor", params)

    # -- retention ------------------------------------------------------------------------------

    @asynccontextmanager
    async def maintenance(self) -> AsyncIterator[Maintenance]:
        """A pruning pass's session (``schedlock.store.retention``): one short session of its
        own on PostgreSQL (the pool's, if the store has one), never a lock session."""
        async with self.connector.pass_sessions() as opener:
            session = SqlMaintenance(opener, self.codec)
            try:
                yield session
            finally:
                if session.began:
                    with suppress(StoreError):  # a broken session is closed anyway
                        await session.end()


class SqlMaintenance:
    """:class:`schedlock.store.contract.Maintenance` over a connector's pass sessions."""

    def __init__(self, opener: SessionOpener, codec: Codec) -> None:
        self._open = opener
        self.codec = codec
        self.began = False  # session settings changed: put them back at the end

    async def _fetch(self, name: str, params: Params) -> list[Row]:
        async with self._open() as session:
            return await session.fetch(name, params)

    async def _execute(self, name: str, params: Params) -> int:
        async with self._open() as session:
            return await session.execute(name, params)

    async def begin(self, statement_timeout: float, lock_timeout: float) -> None:
        self.began = True
        await self._fetch(
            "maintenance_begin",
            {
                "statement_timeout_ms": str(int(statement_timeout * 1000)),
                "lock_timeout_ms": str(int(lock_timeout * 1000)),
            },
        )

    async def end(self) -> None:
        await self._fetch("maintenance_end", {})

    async def db_now(self) -> datetime:
        return self.codec.timestamp((await self._fetch("db_now", {}))[0]["now"])

    async def claim(
        self, task: str, holder: str, lease_until: datetime
    ) -> models.MaintenanceLease | None:
        params = {"task": task, "holder": holder, "lease_until": lease_until}
        found = await self._fetch("claim_maintenance", params)
        return from_row(models.MaintenanceLease, found[0], self.codec) if found else None

    async def lease(self, task: str) -> models.MaintenanceLease:
        found = await self._fetch("maintenance_lease", {"task": task})
        if not found:
            raise StoreError(f"maintenance task {task!r} has no lease row: migrate the schema")
        return from_row(models.MaintenanceLease, found[0], self.codec)

    async def prune_publishes(self, state: str, cutoff: datetime, limit: int) -> int:
        params = {"state": state, "cutoff": cutoff, "limit": limit}
        return await self._execute("prune_publishes", params)

    async def prune_schedules(self, cutoff: datetime, limit: int) -> int:
        return await self._execute("prune_schedules", {"cutoff": cutoff, "limit": limit})

    async def prune_terms(self, cutoff: datetime, limit: int) -> int:
        # SQLite has no lock to ask: a term not released is a live leader's unless its
        # heartbeat is older than any lease allows (PostgreSQL asks pg_locks instead).
        unreleased = cutoff - timedelta(seconds=MAX_LEASE_SECONDS)
        params = {"cutoff": cutoff, "unreleased_cutoff": unreleased, "limit": limit}
        return await self._execute("prune_terms", params)

    async def prune_reserves(self, cutoff: datetime) -> int:
        return await self._execute("prune_reserves", {"cutoff": cutoff})

    async def history_stats(self) -> models.HistoryStats:
        return from_row(
            models.HistoryStats, (await self._fetch("history_stats", {}))[0], self.codec
        )


def _logged(event: Event, message: str, migration: Migration) -> None:
    log.info(
        message,
        extra={"event": event, "migration": migration.id, "migration_name": migration.name},
    )


def _key_of(row: Row) -> tuple[str, str, str]:
    return row["scheduler"], row["namespace"], row["target"]
