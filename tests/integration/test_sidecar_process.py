"""The sidecar process's edges: /metrics (checked by promtool), /healthz, /readyz, start-up."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import psycopg

from schedlock.core.logs import Event, records
from testbed.pg import PostgresServer, free_port
from testbed.rows import insert_rows
from testbed.sidecars import (
    SidecarGroup,
    SidecarProcess,
    http_get,
    wait_for,
)

REQUIRED = [
    "schedlock_leader",
    "schedlock_leadership_transitions_total",
    "schedlock_handover_gap_seconds",
    "schedlock_fire_lateness_seconds",
    "schedlock_fires_total",
    "schedlock_due_backlog",
    "schedlock_last_tick_timestamp_seconds",
    "schedlock_build_info",
]


def test_metrics_are_valid_and_complete(
    tmp_path: Path, migrated_database: str, promtool_bin: Path
) -> None:
    group = SidecarGroup(tmp_path, migrated_database, replicas=2).start()
    try:
        leader = group.wait_leader()
        insert_rows(migrated_database, 10, start_in=0.2, spacing=0.01, prefix="m")
        wait_for(
            lambda: (
                leader.metrics().get(
                    'schedlock_fires_total{namespace="default",outcome="published",scheduler="publish",'
                    'target="demo"}'
                )
                == 10
            ),
            timeout=15,
            what="10 published fires in the metrics",
        )
        status, text = http_get(leader.url("/metrics"))
        assert status == 200
        check = subprocess.run(
            [str(promtool_bin), "check", "metrics"],
            input=text,
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        for name in REQUIRED:
            assert f"# HELP {name} " in text, name
        values = leader.metrics()
        follower = next(s for s in group if s is not leader)
        labels = 'namespace="default",scheduler="publish",target="demo"'
        assert values[f"schedlock_leader{{{labels}}}"] == 1
        assert follower.metrics()[f"schedlock_leader{{{labels}}}"] == 0
        assert values[f"schedlock_fire_lateness_seconds_count{{{labels}}}"] == 10
    finally:
        group.stop()


def test_database_down_at_start_waits_not_ready_then_recovers(tmp_path: Path) -> None:
    port = free_port()
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    sidecar = SidecarProcess.for_stand_in_app("early", tmp_path, url).start()
    server = PostgresServer(tmp_path / "late-postgres", port=port)
    try:
        wait_for(lambda: http_get(sidecar.url("/healthz"))[0] == 200, timeout=15, what="/healthz")
        status, reason = http_get(sidecar.url("/readyz"))
        assert status == 503 and "database not ready" in reason
        time.sleep(2)
        assert sidecar.alive(), "the sidecar must wait for the database, not crash-loop"
        server.start()
        sidecar.wait_ready(timeout=30)
        wait_for(lambda: sidecar.leads("publish"), timeout=10, what="leadership after recovery")
        assert list(records(sidecar.log_text(), Event.DATABASE_NOT_READY))
    finally:
        sidecar.stop()
        server.destroy()
    assert sidecar.process is not None and sidecar.process.returncode == 0


def test_a_port_in_use_is_one_line_and_exit_1(tmp_path: Path, migrated_database: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sidecar = SidecarProcess.for_stand_in_app("busy", tmp_path, migrated_database)
        sidecar.http_port = port
        sidecar.start()
        assert sidecar.wait(timeout=30) == 1
    assert sidecar.log_text().strip() == (
        f"schedlock sidecar: error: cannot serve HTTP on 127.0.0.1:{port}: address already in use"
        " (/metrics, /healthz, /readyz)"
    )


def test_a_schema_taken_down_under_a_leader_ends_it_instead_of_redelivering(
    tmp_path: Path, migrated_database: str
) -> None:
    """A rollback's `migrate --to` under a running sidecar (0004's down step drops
    schedlock_terms.last_fire_at, which `complete` sets): the leader exits in one line rather
    than losing its term at every outcome and delivering the rows in flight again and again."""
    group = SidecarGroup(tmp_path, migrated_database, replicas=1).start()
    try:
        leader = group.wait_leader()
        insert_rows(migrated_database, 1, start_in=0.2, prefix="before")
        receiver = group.receiver
        assert receiver is not None
        wait_for(lambda: len(receiver.entries()) == 1, timeout=15, what="the first fire")
        with psycopg.connect(migrated_database, autocommit=True) as conn:
            conn.execute("ALTER TABLE schedlock_terms DROP COLUMN last_fire_at")
        insert_rows(migrated_database, 1, start_in=0.2, prefix="after")
        assert leader.wait(timeout=30) == 1
        text = leader.log_text()
        assert "the database schema changed under this process" in text
        assert "Traceback" not in text
        deliveries = [e for e in receiver.entries() if str(e.get("uid", "")).startswith("after")]
        assert len(deliveries) <= 1, deliveries  # delivered once at most, never in a loop
        with psycopg.connect(migrated_database) as conn:
            row = conn.execute(
                "SELECT attempts FROM schedlock_publishes WHERE uid LIKE 'after%'"
            ).fetchone()
        assert row is not None and row[0] <= 1
    finally:
        group.stop()
