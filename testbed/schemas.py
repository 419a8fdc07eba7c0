"""The schema of a schedlock database as the migration tests compare it.

:func:`pg_schema` and :func:`sqlite_schema` give the same shape on both dialects (tables'
column names, index names), so a replay of the migrations on each can be compared;
:func:`pg_definitions` is PostgreSQL's whole definition (column types and defaults, index
definitions, storage parameters, triggers, functions, row-level security and its policies), for
down-then-up against a fresh replay.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from schedlock.core.settings import DEFAULT_SCHEMA


def pg_schema(url: str, schema: str = DEFAULT_SCHEMA) -> dict[str, set[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name LIKE 'schedlock_%%'",
            (schema,),
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s "
            "AND indexname LIKE 'schedlock_%%' AND indexname NOT LIKE '%%pkey' "
            "AND indexname NOT LIKE '%%_key'",
            (schema,),
        ).fetchall()
    tables: dict[str, set[str]] = {}
    for table, column in rows:
        tables.setdefault(table, set()).add(column)
    tables["<indexes>"] = {i for (i,) in indexes}
    return tables


def sqlite_schema(path: Path) -> dict[str, set[str]]:
    conn = sqlite3.connect(path)
    schema: dict[str, set[str]] = {}
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'schedlock_%'"
        )
    ]
    for table in tables:
        schema[table] = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
    schema["<indexes>"] = {
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'schedlock_%'"
        )
    }
    conn.close()
    return schema


def sqlite_triggers(path: Path) -> set[str]:
    """The schedlock triggers' definitions (SQLite's bounds on existing tables, migration 0007):
    compared between replays, not with PostgreSQL (whose triggers differ by design)."""
    conn = sqlite3.connect(path)
    try:
        query = "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'schedlock_%'"
        return {str(r[0]) for r in conn.execute(query)}
    finally:
        conn.close()


def pg_definitions(url: str, schema: str = DEFAULT_SCHEMA) -> dict[str, set[tuple[object, ...]]]:
    with psycopg.connect(url) as conn:

        def rows(sql: str) -> set[tuple[object, ...]]:
            return set(conn.execute(sql, {"schema": schema}).fetchall())

        return {
            "columns": rows(
                "SELECT table_name, column_name, data_type, is_nullable, column_default "
                "FROM information_schema.columns WHERE table_schema = %(schema)s"
            ),
            "indexes": rows(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(schema)s"
            ),
            "storage": rows(
                "SELECT relname, array_to_string(reloptions, ',') FROM pg_class "
                "WHERE relnamespace = %(schema)s::regnamespace AND relkind = 'r'"
            ),
            "constraints": rows(
                "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
                "FROM pg_constraint WHERE connamespace = %(schema)s::regnamespace"
            ),
            "triggers": rows(
                "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger "
                "WHERE NOT tgisinternal"
            ),
            "functions": rows(
                "SELECT proname, pg_get_functiondef(oid) FROM pg_proc "
                "WHERE pronamespace = %(schema)s::regnamespace"
            ),
            "row security": rows(
                "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class "
                "WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'"
            ),
            "policies": rows(
                "SELECT polrelid::regclass::text, polname, polpermissive, polcmd, "
                "polroles::regrole[]::text, pg_get_expr(polqual, polrelid), "
                "pg_get_expr(polwithcheck, polrelid) FROM pg_policy"
            ),
        }
