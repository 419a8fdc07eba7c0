"""A broken database: a clear reason on /readyz, no crash loop, recovery without a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from schedlock.store import GrantRequest, open_store
from testbed.pg_fixtures import PostgresService, as_role
from testbed.sidecars import SidecarProcess, http_get, wait_for


def sidecar_for(tmp_path: Path, url: str, name: str) -> SidecarProcess:
    return SidecarProcess.for_stand_in_app(name, tmp_path, url, SCHEDLOCK_MIGRATE="off").start()


def not_ready_because(sidecar: SidecarProcess, words: str) -> bool:
    status, reason = http_get(sidecar.url("/readyz"))
    return status == 503 and words in reason


@pytest.mark.parametrize("problem", ["unknown role", "missing privileges"])
def test_credentials_and_privileges_are_reported_and_recover(
    tmp_path: Path, postgres: PostgresService, migrated_database: str, problem: str
) -> None:
    role = f"late_{problem.split(maxsplit=1)[0]}_{abs(hash(tmp_path)) % 10**6}"
    if problem == "missing privileges":
        postgres.execute(f'CREATE ROLE "{role}" LOGIN')
    sidecar = sidecar_for(tmp_path, as_role(migrated_database, role), role)
    try:
        # /readyz says it in words; the log has the server's detail (naming the role)
        words, detail = (
            ("authentication failed: the role does not exist", f'role \\"{role}\\" does not exist')
            if problem == "unknown role"
            else ("privileges missing: as the schema owner run", "lacks USAGE on schema")
        )
        wait_for(
            lambda: not_ready_because(sidecar, words), timeout=20, what=f"/readyz to say {words}"
        )
        assert role not in http_get(sidecar.url("/readyz"))[1]
        wait_for(lambda: detail in sidecar.log_text(), timeout=20, what=f"the log to say {detail}")
        assert sidecar.alive()
        # Fix it while the sidecar runs: it recovers on its own.
        if problem == "unknown role":
            postgres.execute(f'CREATE ROLE "{role}" LOGIN')
        asyncio.run(
            open_store(migrated_database).grant(GrantRequest(sidecar_role=role, operator_role=None))
        )
        sidecar.wait_ready(timeout=30)
        wait_for(lambda: sidecar.leads("publish"), timeout=10, what="leadership after the fix")
    finally:
        sidecar.stop()
    assert sidecar.process is not None and sidecar.process.returncode == 0


def test_schema_newer_than_the_binary_is_refused_until_fixed(
    tmp_path: Path, migrated_database: str
) -> None:
    with psycopg.connect(migrated_database, autocommit=True) as conn:
        conn.execute("INSERT INTO schedlock_migrations (id, name) VALUES (999, 'from_the_future')")
    sidecar = sidecar_for(tmp_path, migrated_database, "old-binary")
    try:
        wait_for(
            lambda: not_ready_because(sidecar, "upgrade schedlock"),
            timeout=20,
            what="/readyz to refuse the newer schema",
        )
        assert sidecar.alive() and not sidecar.leads("publish")
        with psycopg.connect(migrated_database, autocommit=True) as conn:
            conn.execute("DELETE FROM schedlock_migrations WHERE id = 999")
        sidecar.wait_ready(timeout=30)
    finally:
        sidecar.stop()
