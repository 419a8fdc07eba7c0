"""The store's named queries and migrations as each dialect reads them (no database needed)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from schedlock.store import open_store, queries
from schedlock.store.migrations import for_sqlite, migrations

VERB_CALL = re.compile(
    r"(?:_fetch|_one|_execute|_models|_record|_upsert|fetch|execute)\(\s*(?:[\w.]+,\s*)?\"(\w+)\""
)


def verb_queries() -> set[str]:
    """Every query name the verbs written once (store/verbs.py) run."""
    source = resources.files("schedlock.store").joinpath("verbs.py").read_text("utf-8")
    return set(VERB_CALL.findall(source))


@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
def test_every_query_a_verb_runs_exists_in_both_dialects(dialect: str) -> None:
    names = verb_queries()
    assert {"begin_term", "heartbeat", "claim_due", "complete", "upsert_publish"} <= names
    assert names <= queries.load(dialect).keys()


def test_shared_queries_reach_psycopg_as_pyformat_outside_strings_and_casts() -> None:
    assert queries.pyformat("SELECT :a, x::jsonb, ':b', '+00:00', :c_d") == (
        "SELECT %(a)s, x::jsonb, ':b', '+00:00', %(c_d)s"
    )
    shared = queries.load("postgres")["upsert_publish"]
    assert "%(due_at)s" in shared
    assert not re.search(r"(?<!:):[a-z_]", shared)


def test_a_part_stands_where_a_query_of_either_dialect_includes_it() -> None:
    pg, lite = queries.load("postgres"), queries.load("sqlite")
    assert not {"claimed_row_columns", "prune_terms_schedules_and_reserves"} & pg.keys()
    assert not any("-- include" in sql for sql in [*pg.values(), *lite.values()])
    assert "octet_length(CAST(payload AS text)) AS payload_bytes" in pg["adopt_orphans"]
    for sql in (lite["adopt_orphans"], lite["claim_due"]):
        assert "length(CAST(payload AS BLOB)) AS payload_bytes" in sql
    for sql in (pg["adopt_orphans"], lite["adopt_orphans"], lite["claim_due"]):
        assert sql.rstrip().endswith("AS orphan")
    for sql in (pg["prune_terms"], lite["prune_terms"]):
        assert "FROM schedlock_reserves r" in sql and "s.state <> 'cancelled'" in sql
    for name, sql in pg.items():  # parts included in postgres.sql are pyformat too
        assert not re.search(r"(?<![:\w]):[a-z_]", re.sub(r"'[^']*'", "''", sql)), name


def test_sqlite_reads_each_migration_without_postgresql_types() -> None:
    assert for_sqlite("id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now()") == (
        "id integer PRIMARY KEY AUTOINCREMENT, at text NOT NULL"
    )
    for migration in migrations("sqlite"):
        assert not re.search(r"timestamptz|jsonb|bigserial|bigint|now\(\)|plpgsql", migration.sql)
    # PostgreSQL alone gets the NOTIFY triggers, in the same migration.
    [first] = [m for m in migrations("postgres") if m.id == 1]
    assert "CREATE TRIGGER schedlock_publishes_notify" in first.sql


def test_the_lock_statement_asks_for_a_foreign_holder_only_for_a_key() -> None:
    """A key's wait names its namespace as hex (any text, nothing to quote); the migration lock
    and the operator's sync lock (no namespace) look at nobody, and run before the schema."""
    from schedlock.store.postgres import lock_statement

    plain = lock_statement(1396919371, -5)
    assert "pg_advisory_lock(1396919371, -5)" in plain
    assert "schedlock_foreign_lock_holder" not in plain and "{" not in plain
    hostile = "b'$$; DROP TABLE x; --\n"
    keyed = lock_statement(1396919371, -5, hostile)
    assert "schedlock_foreign_lock_holder(1396919371, -5," in keyed
    assert hostile.encode().hex() in keyed and "DROP" not in keyed
    assert keyed.count("$$") == 2 and "{" not in keyed


def test_only_postgresql_announces_row_changes(tmp_path: Path) -> None:
    """The sidecar polls faster where nothing notifies (SQLite): it asks the store, not its
    dialect's name."""
    assert open_store("postgresql://app@db.invalid/app").notifies
    assert not open_store(f"sqlite:///{tmp_path / 'dev.db'}").notifies


def test_sqlite_measures_stored_text_in_bytes_without_decoding_it() -> None:
    """SQLite has no octet_length() before 3.43: its queries measure the stored text as a blob
    (a Python function would decode it first and fail the whole query on a non-UTF-8 payload)."""
    lite = queries.load("sqlite")
    assert not [name for name, sql in lite.items() if "octet_length" in sql]
    assert "length(CAST(s.payload AS BLOB)) <= :max_payload_bytes" in lite["insert_slot"]
