"""The operator with a broken database: up, not ready with the reason, recovering by itself.

A schema newer than the binary, a role missing privileges, a database that is not there yet:
the operator keeps serving /healthz (no crash loop, no restart), /readyz answers 503 with the
reason, and once the problem is fixed it starts its watches and does its job.  The one
configuration no wait fixes — a role that may not serve the namespaces it watches — exits 2.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import psycopg
import pytest

from schedlock.core.logs import Event, records
from schedlock.store import GrantRequest, open_store
from testbed.kube import KubeAPIServer
from testbed.operators import OperatorProcess, install_crd, operator_kubeconfig
from testbed.pg_fixtures import RUNTIME_ENV, PostgresService, as_role, with_dbname
from testbed.sidecars import http_get, wait_for


def start_operator(tmp_path: Path, kube: KubeAPIServer, url: str) -> OperatorProcess:
    install_crd(kube)
    return OperatorProcess(
        tmp_path / "operator", url, operator_kubeconfig(kube), extra_env=RUNTIME_ENV
    ).start()


def readyz(operator: OperatorProcess) -> tuple[int, str]:
    return http_get(f"http://127.0.0.1:{operator.health_port}/readyz")


def wait_not_ready(operator: OperatorProcess, words: str) -> str:
    def check() -> str | None:
        status, reason = readyz(operator)
        return reason if status == 503 and words in reason else None

    reason: str = wait_for(check, timeout=30, what=f"/readyz to say {words!r}")
    assert operator.alive(), operator.log_text()
    assert http_get(f"http://127.0.0.1:{operator.health_port}/healthz")[0] == 200
    return reason


def works_after_recovery(operator: OperatorProcess, kube: KubeAPIServer, url: str, ns: str) -> None:
    wait_for(lambda: readyz(operator)[0] == 200, timeout=60, what="/readyz 200 after the fix")
    name = f"after-fix-{uuid.uuid4().hex[:6]}"
    kube.apply(
        {
            "apiVersion": "schedlock.dev/v1",
            "kind": "ScheduledPublish",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"target": "demo", "publishAt": "2099-01-01T00:00:00Z"},
        }
    )

    def row_exists() -> bool:
        with psycopg.connect(url, autocommit=True) as conn:
            found = conn.execute(
                "SELECT 1 FROM schedlock_publishes WHERE namespace = %s AND name = %s", (ns, name)
            ).fetchone()
        return found is not None

    wait_for(row_exists, timeout=30, what="the object's row after the recovery")


def test_schema_newer_than_the_operator_is_refused_until_fixed(
    tmp_path: Path, kube: KubeAPIServer, migrated_database: str, kube_namespace: str
) -> None:
    with psycopg.connect(migrated_database, autocommit=True) as conn:
        conn.execute("INSERT INTO schedlock_migrations (id, name) VALUES (999, 'from_the_future')")
    operator = start_operator(tmp_path, kube, migrated_database)
    try:
        reason = wait_not_ready(operator, "upgrade schedlock")
        assert reason.startswith("database not ready: the schema is newer than this schedlock")
        # the detail is in the log, not on the unauthenticated endpoint
        assert "the database schema is at migration 999" in operator.log_text()
        with psycopg.connect(migrated_database, autocommit=True) as conn:
            conn.execute("DELETE FROM schedlock_migrations WHERE id = 999")
        works_after_recovery(operator, kube, migrated_database, kube_namespace)
    finally:
        operator.stop()
    assert operator.process is not None and operator.process.returncode == 0


@pytest.fixture
def role(postgres: PostgresService) -> str:
    """A login role of its own with no privilege yet (the test grants what it needs)."""
    name = f"op_{uuid.uuid4().hex[:8]}"
    postgres.execute(f'CREATE ROLE "{name}" LOGIN')
    return name


def test_missing_privileges_are_named_until_granted(
    tmp_path: Path, kube: KubeAPIServer, role: str, migrated_database: str, kube_namespace: str
) -> None:
    with psycopg.connect(migrated_database, autocommit=True) as conn:
        # enough to read the schema version, not enough to write a row
        conn.execute(f'GRANT USAGE ON SCHEMA schedlock TO "{role}"')
        conn.execute(f'GRANT SELECT ON schedlock_migrations, schedlock_publishes TO "{role}"')
    operator = start_operator(tmp_path, kube, as_role(migrated_database, role))
    try:
        reason = wait_not_ready(operator, "privileges missing")
        assert "schedlock migrate --grant-operator ROLE" in reason and role not in reason
        # /readyz says it in words; the log names the role and what it lacks
        [said] = [
            r["error"]
            for r in records(operator.log_text(), Event.DATABASE_NOT_USABLE)
            if "lacks" in r["error"]
        ][:1]
        assert f"role '{role}' lacks INSERT on schedlock_publishes, UPDATE on" in said, said
        assert "SELECT on schedlock_publishes" not in said
        assert f"schedlock migrate --grant-operator {role}" in said
        asyncio.run(
            open_store(migrated_database).grant(GrantRequest(sidecar_role=None, operator_role=role))
        )
        works_after_recovery(operator, kube, migrated_database, kube_namespace)
    finally:
        operator.stop()


def test_a_role_that_may_not_serve_what_it_watches_exits_2(
    tmp_path: Path, kube: KubeAPIServer, role: str, migrated_database: str, kube_namespace: str
) -> None:
    """Row-level security (migration 0008) would refuse every row of a namespace the role may
    not serve: no retry fixes that, so the operator exits 2 with one line before kopf runs,
    naming the role and the grant; scoped to what the role serves (watchNamespaces), it runs."""
    grant = open_store(migrated_database).grant(
        GrantRequest(sidecar_role=None, operator_role=role, namespaces=(kube_namespace,))
    )
    asyncio.run(grant)
    install_crd(kube)
    url = as_role(migrated_database, role)
    cluster_wide = OperatorProcess(
        tmp_path / "cluster-wide", url, operator_kubeconfig(kube), extra_env=RUNTIME_ENV
    )
    cluster_wide.spawn()
    assert cluster_wide.process is not None
    assert cluster_wide.process.wait(60) == 2, cluster_wide.log_text()
    said = (
        f"role '{role}' may not serve every namespace: as the schema owner run "
        f"`schedlock migrate --grant-operator {role}`, or watch only the namespaces it serves "
        "(watchNamespaces)"
    )
    log = cluster_wide.log_text()
    assert f"schedlock operator: error: {said}\n" in log, log
    assert [r["error"] for r in records(log, Event.OPERATOR_FATAL)] == [said]
    assert "Traceback" not in log and not list(records(log, Event.OPERATOR_STARTED)), log
    scoped = OperatorProcess(
        tmp_path / "scoped",
        url,
        operator_kubeconfig(kube),
        extra_env={**RUNTIME_ENV, "SCHEDLOCK_WATCH_NAMESPACES": kube_namespace},
    ).start()
    try:
        works_after_recovery(scoped, kube, migrated_database, kube_namespace)
    finally:
        scoped.stop()


def test_sigterm_while_waiting_for_the_database_exits_cleanly(
    tmp_path: Path, kube: KubeAPIServer, postgres: PostgresService
) -> None:
    missing = with_dbname(postgres.admin_url, f"nope_{uuid.uuid4().hex[:6]}")
    operator = start_operator(tmp_path, kube, missing)
    wait_not_ready(operator, "does not exist")
    assert operator.process is not None
    operator.process.send_signal(signal.SIGTERM)
    assert operator.process.wait(10) == 0
    stopped = list(records(operator.log_text(), Event.OPERATOR_STOPPED))
    assert [r["database_ready"] for r in stopped] == [False]
