"""Switching a running all-namespace install to per-namespace roles (docs/operations.md,
"Switching an existing install to per-namespace roles"), step by step as the docs say, while
rows fire: nothing is lost and nothing fires twice.

A real PostgreSQL that checks passwords; two namespaces whose sidecars (two replicas each) run
under one shared role granted the plain way (every namespace, single-tenant).  Rows fall due
before, during and after the switch.  Per namespace: a role of its own granted with
``--namespace``, its replicas rolled one by one (a new replica under the new role up, then an
old one stopped with SIGTERM, as a Deployment's rolling update does); then the shared role is
narrowed with ``--only``.  Every row fires exactly once; the rows due after the switch fire
from the new roles' sidecars; the shared role then sees nothing of the namespace it lost, and
a sidecar started with it there exits 2 naming the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from testbed.pg import PostgresServer
from testbed.pg_fixtures import RUNTIME_ENV
from testbed.rows import insert_rows, wait_published
from testbed.sidecars import SidecarGroup, SidecarProcess
from testbed.sidecars import schedlock_cli as cli

NAMESPACES = ("billing", "shop")
SHARED = "shared_sidecar"
PASSWORDS = {SHARED: "shared-pw-1", "billing_sidecar": "billing-pw-2", "shop_sidecar": "shop-pw-3"}
REPLICAS = 2
BEFORE, DURING, AFTER = 10, 40, 10


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path / "pg", passwords=True)
    server.start()
    try:
        server.psql("CREATE DATABASE switch")
        for role, password in PASSWORDS.items():
            server.psql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        yield server
    finally:
        server.destroy()


def test_rows_keep_firing_through_the_switch_to_per_namespace_roles(
    server: PostgresServer, tmp_path: Path
) -> None:
    admin = server.url("switch")
    url = {role: server.url("switch", role, password) for role, password in PASSWORDS.items()}
    assert cli("migrate", url=admin).returncode == 0
    plain = cli("migrate", "--grant-sidecar", SHARED, url=admin)
    assert plain.returncode == 0 and f"{SHARED} may serve every namespace" in plain.stdout
    groups = {
        ns: SidecarGroup(
            tmp_path / ns, url[SHARED], namespace=ns, replicas=REPLICAS, extra_env=RUNTIME_ENV
        )
        for ns in NAMESPACES
    }
    try:
        for group in groups.values():
            group.start().wait_leader()
        for ns in NAMESPACES:
            insert_rows(admin, BEFORE, start_in=0.5, spacing=0.05, namespace=ns, prefix=f"{ns}-1")
        for ns in NAMESPACES:
            wait_published(admin, f"{ns}-1", BEFORE, timeout=60)
        # Rows falling due all through the roll (about 20 s of it).
        for ns in NAMESPACES:
            insert_rows(admin, DURING, start_in=1, spacing=0.5, namespace=ns, prefix=f"{ns}-2")

        old: dict[str, list[SidecarProcess]] = {ns: list(g) for ns, g in groups.items()}
        for ns, group in groups.items():  # step 1: a role of its own, scoped
            role = f"{ns}_sidecar"
            scoped = cli("migrate", "--grant-sidecar", role, "--namespace", ns, url=admin)
            assert scoped.returncode == 0, scoped.stderr
            assert f"{role} may serve namespace {ns} only (row-level security)" in scoped.stdout
            group.database_url = url[role]  # step 2: its URL in the Secret, the pods rolled
            for i, replaced in enumerate(old[ns]):
                group.add(name=f"{ns}-scoped-{i}").wait_ready()
                replaced.stop()
                assert replaced.wait(30) == 0, replaced.log_text()
        for ns in NAMESPACES:
            wait_published(admin, f"{ns}-2", DURING, timeout=90)

        # Step 3: the shared role keeps one namespace only (or is revoked altogether).
        narrowed = cli(
            "migrate", "--grant-sidecar", SHARED, "--namespace", "billing", "--only", url=admin
        )
        assert narrowed.returncode == 0, narrowed.stderr
        assert f"{SHARED} may serve namespace billing only" in narrowed.stdout
        for ns in NAMESPACES:
            insert_rows(admin, AFTER, start_in=0.5, spacing=0.05, namespace=ns, prefix=f"{ns}-3")
        for ns in NAMESPACES:
            wait_published(admin, f"{ns}-3", AFTER, timeout=60)

        for ns, group in groups.items():
            assert group.receiver is not None
            got = group.receiver.entries()
            uids = [str(e["uid"]) for e in got]
            expected = [
                f"{ns}-{phase}-{i}"
                for phase, n in enumerate((BEFORE, DURING, AFTER), 1)
                for i in range(n)
            ]
            assert sorted(uids) == sorted(expected), "every row fired exactly once"
            assert {e["namespace"] for e in got} == {ns}
            old_names = {s.name for s in old[ns]}
            new_names = {s.name for s in group} - old_names
            assert {
                str(e["holder"]) for e in got if str(e["uid"]).startswith(f"{ns}-1-")
            } <= old_names
            assert {
                str(e["holder"]) for e in got if str(e["uid"]).startswith(f"{ns}-3-")
            } <= new_names

        # The shared role lost the shop: it reads none of its rows, and a sidecar there exits 2.
        with psycopg.connect(url[SHARED], autocommit=True) as conn:
            seen = conn.execute(
                "SELECT count(*) FROM schedlock_publishes WHERE namespace = 'shop'"
            ).fetchone()
        assert seen == (0,)
        stray = SidecarProcess.for_stand_in_app(
            "shared-in-shop",
            tmp_path / "stray",
            url[SHARED],
            SCHEDLOCK_NAMESPACE="shop",
            **RUNTIME_ENV,
        ).start()
        try:
            assert stray.wait(30) == 2
            assert (
                f"schedlock sidecar: error: role '{SHARED}' may not serve namespace 'shop': as the "
                f"schema owner run `schedlock migrate --grant-sidecar {SHARED} --namespace shop`"
            ) in stray.log_text().splitlines()
        finally:
            stray.stop()
    finally:
        for group in groups.values():
            group.stop()
