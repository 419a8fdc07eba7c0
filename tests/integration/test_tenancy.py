"""Tenancy: rows of namespace A are never delivered by the sidecars of namespace B; a sidecar
role of the release before the column grants keeps firing through them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from schedlock.store import GrantRequest, open_store
from testbed.pg_fixtures import (
    BEFORE_COLUMN_GRANTS,
    RUNTIME_ENV,
    PostgresService,
    as_role,
    grant_table_wide,
)
from testbed.rows import insert_rows, row_states, wait_published
from testbed.sidecars import SidecarGroup, wait_for


def test_sidecars_only_fire_their_own_namespace(tmp_path: Path, migrated_database: str) -> None:
    team_a = SidecarGroup(tmp_path / "a", migrated_database, namespace="team-a", replicas=1).start()
    team_b = SidecarGroup(tmp_path / "b", migrated_database, namespace="team-b", replicas=2).start()
    try:
        insert_rows(
            migrated_database, 20, start_in=0.2, spacing=0.02, namespace="team-a", prefix="a"
        )
        insert_rows(
            migrated_database, 20, start_in=0.2, spacing=0.02, namespace="team-b", prefix="b"
        )
        insert_rows(migrated_database, 5, start_in=0.2, namespace="team-c", prefix="c")
        wait_for(
            lambda: (
                row_states(migrated_database, "a").get("published") == 20
                and row_states(migrated_database, "b").get("published") == 20
            ),
            timeout=30,
            what="both teams' rows",
        )
        assert team_a.receiver is not None and team_b.receiver is not None
        got_a = team_a.receiver.entries()
        got_b = team_b.receiver.entries()
        assert {e["namespace"] for e in got_a} == {"team-a"} and len(got_a) == 20
        assert {e["namespace"] for e in got_b} == {"team-b"} and len(got_b) == 20
        assert {str(e["holder"]) for e in got_a} <= {s.name for s in team_a}
        # nobody serves team-c: its rows wait, they are not taken by another namespace
        assert row_states(migrated_database, "c") == {"scheduled": 5}
    finally:
        team_a.stop()
        team_b.stop()


def test_a_sidecar_role_of_the_release_before_fires_through_the_column_grants(
    tmp_path: Path, database: str, postgres: PostgresService, runtime_roles: tuple[str, str]
) -> None:
    """The upgrade to the column grants (migration 0010) with a real sidecar under a role the
    release before granted table-wide: it fires one-shot rows and a schedule's slots on the new
    schema as it was granted, and goes on firing, without a restart, when the owner narrows the
    role (`--grant-sidecar ROLE --narrow`); after that the role may not rewrite a payload."""
    sidecar_role = runtime_roles[0]
    # The release before installed into `public`; this one keeps an install there.
    asyncio.run(open_store(database, schema="public").migrate(to=BEFORE_COLUMN_GRANTS))
    owner = open_store(database)
    grant_table_wide(postgres, database, sidecar_role)
    asyncio.run(owner.migrate())
    postgres.execute(
        "INSERT INTO schedlock_schedules (namespace, name, uid, target, expression, state) "
        "VALUES ('default', 'tick', 'tick', 'demo', '@every 1s', 'active')",
        url=database,
    )
    slots = (
        "SELECT count(*) FROM schedlock_publishes WHERE uid LIKE 'tick@%' AND state = 'published'"
    )

    def slots_published() -> int:
        [(count,)] = postgres.execute(slots, url=database)
        assert isinstance(count, int)
        return count

    group = SidecarGroup(
        tmp_path, as_role(database, sidecar_role), replicas=1, extra_env=RUNTIME_ENV
    ).start()
    try:
        insert_rows(database, 5, start_in=0.2, prefix="before")
        wait_published(database, "before", 5)
        wait_for(lambda: slots_published() >= 1, timeout=30, what="a slot fired")
        report = asyncio.run(
            owner.grant(GrantRequest(sidecar_role=sidecar_role, operator_role=None, narrow=True))
        )
        assert report.narrowed == [sidecar_role]
        fired = slots_published()
        insert_rows(database, 5, start_in=0.2, prefix="after")
        wait_published(database, "after", 5)
        wait_for(lambda: slots_published() >= fired + 2, timeout=30, what="slots after narrowing")
        assert group.sidecars[0].alive()
    finally:
        group.stop()
    with (
        psycopg.connect(as_role(database, sidecar_role), autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("UPDATE schedlock_publishes SET payload = '{}' WHERE uid = 'after-1'")
