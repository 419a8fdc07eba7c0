"""Tenancy: rows of namespace A are never delivered by the sidecars of namespace B."""

from __future__ import annotations

from pathlib import Path

from testbed.rows import insert_rows, row_states
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
