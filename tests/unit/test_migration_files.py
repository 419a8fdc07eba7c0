"""The migration files' convention and the rollback plan (no database needed)."""

from __future__ import annotations

from importlib import resources

import pytest

from schedlock.cli.admin import migrate_report
from schedlock.store import MigrationRefused, SchemaStatus
from schedlock.store.migrations import (
    MigrationFilesError,
    blocking,
    migrations,
    parse,
    plan,
)

FILES = {
    "0001_a.sql": "-- additive: no\nCREATE TABLE a (id integer);\n",
    "0001_a.down.sql": "-- loses data: yes (every row of a)\nDROP TABLE a;\n",
    "0001_a.postgres.sql": "-- PostgreSQL only\nALTER TABLE a SET (fillfactor = 50);\n",
    "0001_a.down.postgres.sql": "-- loses data: no\nALTER TABLE a RESET (fillfactor);\n",
    "0002_b.sql": "-- 0002 b: why it exists\n-- additive: yes\nCREATE INDEX b ON a (id);\n",
    "0002_b.down.sql": "-- loses data: no\nDROP INDEX b;\n",
    "0003_c.sql": "-- additive: yes\nCREATE TABLE c (at timestamptz);\n",
    "0003_c.down.sql": "-- loses data: no\nDROP TABLE c;\n",
    "0003_c.down.postgres.sql": "-- loses data: yes (PostgreSQL's c keeps more)\nSELECT 1;\n",
}


@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
def test_every_shipped_migration_has_its_headers_and_a_down_step(dialect: str) -> None:
    folder = resources.files("schedlock.store").joinpath("migrations")
    names = {entry.name for entry in folder.iterdir() if entry.name.endswith(".sql")}
    shipped = migrations(dialect)  # the loader refuses a file without its header or down step
    assert [m.id for m in shipped] == list(range(1, len(shipped) + 1))
    for migration in shipped:
        stem = f"{migration.id:04d}_{migration.name}"
        assert {f"{stem}.sql", f"{stem}.down.sql"} <= names
        assert migration.down_sql.strip() and migration.sql.strip()
    assert [m.loses_data for m in shipped[:4]] == [True, False, False, False]
    assert [m.additive for m in shipped[:4]] == [False, True, True, True]


def test_the_loader_joins_each_dialects_parts_in_order() -> None:
    pg = parse(FILES, "postgres")
    assert [(m.id, m.name, m.additive, m.loses_data) for m in pg] == [
        (1, "a", False, True),
        (2, "b", True, False),
        (3, "c", True, True),  # the PostgreSQL down step says it loses data
    ]
    assert pg[0].sql.index("CREATE TABLE") < pg[0].sql.index("SET (fillfactor")
    assert pg[0].down_sql.index("RESET (fillfactor)") < pg[0].down_sql.index("DROP TABLE")
    lite = parse(FILES, "sqlite")
    assert [m.loses_data for m in lite] == [True, False, False]
    assert "fillfactor" not in lite[0].sql + lite[0].down_sql
    assert "timestamptz" not in lite[2].sql


def test_an_include_line_stands_for_the_parts_text_without_its_comments() -> None:
    body = "-- 0001 a's body: what it is\n\n    SELECT 1\n    -- kept: inside the body\n"
    files = {
        **FILES,
        "0001_a.body.part.sql": body,  # no migration: its name is none of the convention's
        "0002_b.postgres.sql": "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$\n"
        "    -- include: 0001_a.body.part.sql\n$$;\n",
        "0002_b.down.postgres.sql": "-- loses data: no\n-- include: 0001_a.body.part.sql\n",
    }
    pg = parse(files, "postgres")
    assert [m.id for m in pg] == [1, 2, 3]
    assert pg[1].sql.endswith(
        "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$\n"
        "    SELECT 1\n    -- kept: inside the body\n$$;\n"
    )
    assert pg[1].down_sql.startswith("-- loses data: no\n    SELECT 1\n    -- kept")
    assert parse(files, "sqlite") == parse(FILES, "sqlite")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"0002_b.down.sql": None}, "0002_b has no down step 0002_b.down.sql"),
        ({"0002_b.sql": "CREATE INDEX b ON a (id);\n"}, "lacks its '-- additive: yes|no'"),
        ({"0002_b.sql": "SELECT 1;\n-- additive: yes\n"}, "lacks its '-- additive"),
        ({"0002_b.down.sql": "DROP INDEX b;\n"}, "0002_b's down step lacks its '-- loses data"),
        ({"0002_b.sql": None, "0002_b.down.sql": None}, "not numbered 1..n without gaps"),
        ({"0004_d.postgres.sql": "SELECT 1;\n"}, "0004_d has no 0004_d.sql"),
        (
            {"0002_b.postgres.sql": "  -- include: 0001_a.f.part.sql\n"},
            "0002_b includes 0001_a.f.part.sql, which is not shipped",
        ),
        (
            {
                "0001_a.f.part.sql": "-- include: 0001_a.g.part.sql\n",
                "0001_a.g.part.sql": "SELECT 1\n",
                "0002_b.postgres.sql": "-- include: 0001_a.f.part.sql\n",
            },
            "0002_b includes 0001_a.f.part.sql, which includes more",
        ),
    ],
)
def test_the_loader_refuses_files_that_break_the_convention(
    change: dict[str, str | None], message: str
) -> None:
    files = {**FILES, **change}
    with pytest.raises(MigrationFilesError, match=message.replace("|", r"\|")):
        parse({name: text for name, text in files.items() if text is not None}, "postgres")


KNOWN = parse(FILES, "postgres")


def test_plan_goes_up_by_the_migrations_and_down_by_their_steps_newest_first() -> None:
    assert [m.id for m in plan(KNOWN, 0, 3, force=False).up] == [1, 2, 3]
    assert [m.id for m in plan(KNOWN, 1, 2, force=False).up] == [2]
    assert [m.id for m in plan(KNOWN, 3, 1, force=True).down] == [3, 2]
    assert plan(KNOWN, 2, 2, force=False) == plan(KNOWN, 2, 2, force=True)
    assert not plan(KNOWN, 2, 2, force=False).up and not plan(KNOWN, 2, 2, force=False).down
    assert [m.id for m in plan(KNOWN, 3, 0, force=True).down] == [3, 2, 1]


@pytest.mark.parametrize(
    ("current", "target", "message"),
    [
        (3, 1, r"from migration 3 down to 1 undoes migration 3 \(c\), which loses data"),
        (2, 0, r"undoes migration 1 \(a\), which loses data: rerun with --force"),
        (1, 4, r"migration 4 is unknown to this schedlock \(it knows 1 to 3\)"),
        (5, 2, r"at migration 5 but this schedlock knows the down steps of migrations 1 to 3"),
    ],
)
def test_plan_refuses_in_one_line(current: int, target: int, message: str) -> None:
    with pytest.raises(MigrationRefused, match=message) as refused:
        plan(KNOWN, current, target, force=False)
    assert "\n" not in str(refused.value)
    if current <= 3 and target < current:
        assert plan(KNOWN, current, target, force=True).down


def test_a_binary_runs_on_a_newer_schema_whose_newer_migrations_are_additive() -> None:
    recorded = [(1, False), (2, True), (3, True), (4, True), (5, False), (6, True)]
    assert blocking(recorded, 6) is None
    assert blocking(recorded, 5) is None  # only migrations beyond the binary's newest count
    assert blocking(recorded, 4) == 5
    assert blocking(recorded[:4], 2) is None
    assert SchemaStatus(current=6, latest=4, blocking=5).too_new
    assert not SchemaStatus(current=6, latest=4, blocking=None).too_new
    assert not SchemaStatus(current=3, latest=4).too_new


def test_migrate_says_what_it_did() -> None:
    assert migrate_report([1, 2], SchemaStatus(2, 4)) == "applied migrations 1, 2; schema at 2"
    assert migrate_report([4], SchemaStatus(3, 4)) == (
        "reverted migration 4 by its down step; schema at 3"
    )
    assert migrate_report([], SchemaStatus(4, 4)) == "schema is current (migration 4)"
    assert migrate_report([], SchemaStatus(2, 4)) == "schema at migration 2: nothing to apply"
    assert "newer than this schedlock (4) and runs it" in migrate_report([], SchemaStatus(6, 4))


def test_migrate_report_names_the_schema_on_postgresql() -> None:
    status = SchemaStatus(4, 4, location="schedlock")
    assert (
        migrate_report([], status)
        == "schema is current (migration 4) in PostgreSQL schema schedlock"
    )
    assert (
        migrate_report([3, 4], status)
        == "applied migrations 3, 4; schema at 4 in PostgreSQL schema schedlock"
    )
