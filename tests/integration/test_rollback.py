"""Releases roll back as well as forward: down steps, the additive rule, on both dialects.

Down to each migration N and up again must leave the schema a fresh replay of 1..N would
(compared as the replay test compares dialects, and on PostgreSQL by the whole definition:
types, index definitions, storage parameters, triggers, functions).  A binary runs on a newer
schema whose every newer migration is additive, and refuses one that is not.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from schedlock.store import MigrationRefused, SchemaTooNew, ensure_schema, open_store
from schedlock.store.migrations import latest_id, migrations, split_statements
from testbed.pg_fixtures import PostgresService
from testbed.schemas import pg_definitions, pg_schema, sqlite_schema, sqlite_triggers

LATEST = latest_id("postgres")


class Databases:
    """Fresh databases of one dialect, their URLs, their schema and raw SQL on them."""

    def __init__(self, dialect: str, postgres: PostgresService, tmp_path: Path) -> None:
        self.dialect, self.postgres, self.tmp_path = dialect, postgres, tmp_path
        self.made: list[str] = []

    def new(self) -> str:
        if self.dialect == "postgres":
            url = self.postgres.create_database()
        else:
            url = f"sqlite:///{self.tmp_path / f'db{len(self.made)}.db'}"
        self.made.append(url)
        return url

    def schema(self, url: str) -> Any:
        if self.dialect == "postgres":
            return pg_schema(url), pg_definitions(url)
        path = Path(url.removeprefix("sqlite:///"))
        return sqlite_schema(path), sqlite_triggers(path)

    def sql(self, url: str, statement: str, params: tuple[object, ...] = ()) -> list[Any]:
        if self.dialect == "postgres":
            with psycopg.connect(url, autocommit=True) as conn:
                cur = conn.execute(statement, params)
                return cur.fetchall() if cur.description else []
        db = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            rows = db.execute(statement.replace("%s", "?"), params).fetchall()
            db.commit()
            return rows
        finally:
            db.close()

    def drop(self) -> None:
        if self.dialect == "postgres":
            for url in self.made:
                self.postgres.drop_database(url)


@pytest.fixture(params=["postgres", "sqlite"])
def databases(request: pytest.FixtureRequest, postgres: PostgresService, tmp_path: Path) -> Any:
    made = Databases(request.param, postgres, tmp_path)
    yield made
    made.drop()


def run(url: str, verb: Callable[[Any], Any]) -> Any:
    async def go() -> Any:
        store = open_store(url)
        try:
            return await verb(store)
        finally:
            await store.close()

    return asyncio.run(go())


def migrate(url: str, **kwargs: Any) -> list[int]:
    return run(url, lambda store: store.migrate(**kwargs))  # type: ignore[no-any-return]


def version(databases: Databases, url: str) -> list[int]:
    return [r[0] for r in databases.sql(url, "SELECT id FROM schedlock_migrations ORDER BY id")]


def test_down_to_each_migration_and_up_again_is_a_fresh_replay(databases: Databases) -> None:
    fresh = {}
    for n in range(LATEST + 1):
        url = databases.new()
        assert migrate(url, to=n) == list(range(1, n + 1))
        fresh[n] = databases.schema(url)
    # Each migration shows, unless it does nothing in this dialect (a PostgreSQL-only one: the
    # column grants' functions and policies have no SQLite counterpart, SQLite has no roles).
    acts = [bool(split_statements(m.sql)) for m in migrations(databases.dialect)]
    assert all(fresh[n] != fresh[n + 1] for n in range(LATEST) if acts[n])
    url = databases.new()
    assert migrate(url) == list(range(1, LATEST + 1))
    assert databases.schema(url) == fresh[LATEST]
    for n in reversed(range(LATEST)):
        assert migrate(url, to=n, force=True) == list(range(LATEST, n, -1))
        assert databases.schema(url) == fresh[n], f"down to {n}"
        assert version(databases, url) == list(range(1, n + 1))
        assert migrate(url) == list(range(n + 1, LATEST + 1))
        assert databases.schema(url) == fresh[LATEST], f"up again from {n}"
    additive = databases.sql(url, "SELECT id, additive FROM schedlock_migrations ORDER BY id")
    assert [bool(a) for _, a in additive] == [m.additive for m in migrations("postgres")]


def test_a_down_step_that_loses_data_is_refused_without_force(databases: Databases) -> None:
    url = databases.new()
    migrate(url)
    with pytest.raises(MigrationRefused, match=r"migration 1 \(initial\).*loses data.*--force"):
        migrate(url, to=0)
    assert version(databases, url) == list(range(1, LATEST + 1))  # refused before any step
    with pytest.raises(MigrationRefused, match=f"unknown to this schedlock .* 1 to {LATEST}"):
        migrate(url, to=LATEST + 1)


def test_an_older_binary_runs_on_a_newer_additive_schema_and_refuses_another(
    databases: Databases,
) -> None:
    """Simulated by recording migrations this binary does not ship, as a newer release would."""
    url = databases.new()
    migrate(url)
    record = (
        "INSERT INTO schedlock_migrations (id, name, additive, applied_at) VALUES (%s, %s, %s, %s)"
    )
    databases.sql(url, record, (LATEST + 1, "additive_future", True, "2030-01-01T00:00:00Z"))
    run(url, lambda store: ensure_schema(store, migrate=False))
    assert migrate(url) == []  # applies nothing, and says so (the CLI's report)
    status = run(url, lambda store: store.schema_status())
    assert (status.current, status.latest, status.too_new) == (LATEST + 1, LATEST, False)
    with pytest.raises(MigrationRefused, match=f"down steps of migrations 1 to {LATEST} only"):
        migrate(url, to=LATEST)
    databases.sql(url, record, (LATEST + 2, "breaking_future", False, "2030-01-01T00:00:00Z"))
    message = (
        rf"at migration {LATEST + 2} but this schedlock runs on schemas up to {LATEST} "
        rf"\(migration {LATEST + 2} is not additive\).*`schedlock migrate --to {LATEST}`"
    )
    with pytest.raises(SchemaTooNew, match=message):
        run(url, lambda store: ensure_schema(store, migrate=False))
    with pytest.raises(SchemaTooNew, match=message):
        migrate(url)


def test_an_older_releases_migrations_table_gains_the_additive_column(
    databases: Databases,
) -> None:
    url = databases.new()
    migrate(url, to=3)
    databases.sql(url, "ALTER TABLE schedlock_migrations DROP COLUMN additive")  # as c8e0198
    assert migrate(url) == list(range(4, LATEST + 1))
    rows = databases.sql(url, "SELECT id, additive FROM schedlock_migrations ORDER BY id")
    later = [m.additive for m in migrations("postgres")[3:]]
    assert [bool(a) for _, a in rows] == [False] * 3 + later  # an older release's rows: default


def test_migration_4_backfills_each_keys_last_fire_from_the_history(
    databases: Databases,
) -> None:
    url = databases.new()
    migrate(url, to=3)
    terms = (
        "INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, lock_objid) "
        "VALUES (%s, 'default', %s, 1, %s)"
    )
    for objid, (scheduler, target) in enumerate([("publish", "a"), ("publish", "quiet")]):
        databases.sql(url, terms, (scheduler, target, objid))
    base = datetime(2026, 1, 1, tzinfo=UTC)
    row = (
        "INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, target, due_at, "
        "next_attempt_at, state, finished_at, created_at, updated_at) "
        "VALUES ('publish', 'default', 'n', %s, %s, %s, %s, %s, %s, %s, %s)"
    )
    for n, state in enumerate(["published", "published", "failed", "scheduled"]):
        at = base + timedelta(minutes=n)
        stamp: Any = at if databases.dialect == "postgres" else at.isoformat()
        finished = None if state == "scheduled" else stamp
        databases.sql(url, row, (f"u{n}", "a", stamp, stamp, state, finished, stamp, stamp))
    assert migrate(url) == list(range(4, LATEST + 1))
    status = {k.target: k.last_fire for k in run(url, lambda store: store.key_status())}
    assert status == {"a": base + timedelta(minutes=1), "quiet": None}
