"""Refusal to run behind a transaction-mode pooler, against a real PgBouncer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from testbed.pg import PgBouncer
from testbed.sidecars import SidecarProcess, wait_for


def sidecar_behind(
    pgbouncer_factory: Callable[[str], PgBouncer], mode: str, database: str, workdir: Path
) -> SidecarProcess:
    """A sidecar reaching DATABASE through a PgBouncer in pool MODE (migrated directly, by its
    owner, as in production)."""
    bouncer = pgbouncer_factory(mode)
    url = bouncer.url(database.rsplit("/", 1)[1])
    return SidecarProcess.for_stand_in_app(
        f"{mode}-pooled", workdir, url, SCHEDLOCK_MIGRATE="off", SCHEDLOCK_LOG_FORMAT="text"
    ).start()


def test_transaction_mode_pooler_is_refused_with_one_line(
    tmp_path: Path, migrated_database: str, pgbouncer_factory: Callable[[str], PgBouncer]
) -> None:
    sidecar = sidecar_behind(pgbouncer_factory, "transaction", migrated_database, tmp_path)
    code = sidecar.wait(timeout=30)
    assert code == 1
    errors = [
        line
        for line in sidecar.log_text().splitlines()
        if line.startswith("schedlock sidecar: error:")
    ]
    assert len(errors) == 1, sidecar.log_text()
    assert "transaction mode" in errors[0] and "advisory locks would guard nothing" in errors[0]


def test_session_mode_pooler_is_accepted(
    tmp_path: Path, migrated_database: str, pgbouncer_factory: Callable[[str], PgBouncer]
) -> None:
    sidecar = sidecar_behind(pgbouncer_factory, "session", migrated_database, tmp_path)
    try:
        sidecar.wait_ready(timeout=20)
        wait_for(
            lambda: sidecar.leads("publish") and sidecar.leads("recurring"),
            timeout=10,
            what="leadership through a session-mode pooler",
        )
    finally:
        sidecar.stop()
    assert sidecar.process is not None and sidecar.process.returncode == 0
