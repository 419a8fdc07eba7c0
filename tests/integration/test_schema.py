"""A dedicated schema (issue 20's schema hygiene), against a real PostgreSQL, the real CLI and
real sidecars.

Every database here has ``search_path = public`` set on it (as PostgreSQL's default is), so
nothing but schedlock's own connect-time choice puts its schema on the path: the test bed's
server-wide path, which lets the test bed's SQL name tables unqualified, does not apply.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from schedlock.store import MissingPrivileges, ensure_schema, open_store
from testbed.pg_fixtures import PostgresService, as_role
from testbed.sidecars import SidecarGroup, SidecarProcess, http_get, wait_for
from testbed.sidecars import schedlock_cli as cli

RUNTIME_ENV = {"SCHEDLOCK_MIGRATE": "off"}


@pytest.fixture
def bare_database(postgres: PostgresService) -> str:
    """An empty database whose own search_path is PostgreSQL's default one."""
    url = postgres.create_database()
    name = url.rsplit("/", 1)[1]
    postgres.execute(f'ALTER DATABASE "{name}" SET search_path = "$user", public')
    return url


def tables_in(url: str, schema: str) -> set[str]:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE 'schedlock%%'",
            (schema,),
        ).fetchall()
    return {str(t) for (t,) in found}


def publish(url: str, name: str, **env: str) -> None:
    done = cli(
        "publish", "--target", "demo", "--name", name, "--at", "+0s", "--payload", "{}",
        url=url, timeout=60, **env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def states(url: str, schema: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        found = conn.execute(f"SELECT name, state FROM {schema}.schedlock_publishes").fetchall()
    return {str(n): str(s) for n, s in found}


def fires(
    tmp_path: Path, owner: str, schema: str, name: str, *, role: str = "", **env: str
) -> None:
    """A sidecar (as ``role``, else the owner) fires a row the owner publishes."""
    url = as_role(owner, role) if role else owner
    group = SidecarGroup(tmp_path / name, url, replicas=1, extra_env={**RUNTIME_ENV, **env})
    try:
        group.start()
        publish(owner, name, **env)
        wait_for(
            lambda: states(owner, schema).get(name) == "published",
            timeout=30,
            what=f"{name} published",
        )
    finally:
        group.stop()


def test_a_fresh_install_lives_in_its_own_schema(
    tmp_path: Path, postgres: PostgresService, bare_database: str
) -> None:
    """`migrate` creates schema `schedlock` and every table, sequence and function in it, none
    in public; the grant gives a role USAGE and no CREATE there; every function pins its
    search_path to it (every one, SECURITY DEFINER or not: migration 0012 pinned those before
    the rule); a sidecar under the role fires a row."""
    url = bare_database
    done = cli("migrate", url=url)
    assert done.returncode == 0, done.stderr
    assert "in PostgreSQL schema schedlock" in done.stdout, done.stdout
    assert "earlier release" not in done.stdout
    assert "schedlock_publishes" in tables_in(url, "schedlock")
    assert tables_in(url, "public") == set()
    role = "schema_sidecar"
    postgres.execute(f"DROP ROLE IF EXISTS {role}")
    postgres.execute(f"CREATE ROLE {role} LOGIN")
    try:
        granted = cli("migrate", "--grant-sidecar", role, "--namespace", "default", url=url)
        assert granted.returncode == 0, granted.stderr
        with psycopg.connect(url) as conn:
            found = conn.execute(
                "SELECT has_schema_privilege(%(r)s, 'schedlock', 'USAGE'), "
                "has_schema_privilege(%(r)s, 'schedlock', 'CREATE'), "
                "(SELECT count(*) FROM pg_proc WHERE proname LIKE 'schedlock%%' "
                " AND pronamespace <> 'schedlock'::regnamespace), "
                "(SELECT array_agg(DISTINCT array_to_string(proconfig, ',')) FROM pg_proc "
                " WHERE pronamespace = 'schedlock'::regnamespace)",
                {"r": role},
            ).fetchone()
        assert found == (True, False, 0, ["search_path=schedlock, pg_temp"]), found
        fires(tmp_path, url, "schedlock", "fresh", role=role)
    finally:
        postgres.execute(f"DROP OWNED BY {role}", url=url)
        postgres.execute(f"DROP ROLE {role}")


def test_a_configured_schema_and_one_install_per_database(
    tmp_path: Path, bare_database: str
) -> None:
    """SCHEDLOCK_DATABASE_SCHEMA=jobs installs into `jobs` and every component finds it there;
    a component configured for another schema says where the install is (a second install
    would share the database's advisory locks and channels: `migrate` refuses it)."""
    url, jobs = bare_database, {"SCHEDLOCK_DATABASE_SCHEMA": "jobs"}
    done = cli("migrate", url=url, timeout=60, **jobs)
    assert done.returncode == 0, done.stderr
    assert "in PostgreSQL schema jobs" in done.stdout
    assert "schedlock_publishes" in tables_in(url, "jobs")
    assert tables_in(url, "schedlock") == set() == tables_in(url, "public")
    fires(tmp_path, url, "jobs", "in-jobs", **jobs)
    second = cli("migrate", url=url)
    assert second.returncode == 2
    assert second.stderr.strip() == (
        "schedlock migrate: error: schedlock is installed in schema 'jobs' of this database, "
        "and the configured schema is 'schedlock': one install per database (advisory locks "
        "and notification channels are database-wide); set SCHEDLOCK_DATABASE_SCHEMA=jobs "
        "(--database-schema) for every component, or use another database"
    )
    wrong = SidecarProcess.for_stand_in_app("wrong-schema", tmp_path / "wrong", url, **RUNTIME_ENV)
    try:
        wrong.start()
        expected = "schedlock is installed in schema jobs, not schedlock: set SCHEDLOCK_DATABASE_SCHEMA=jobs"

        def says_where() -> bool:
            status, text = http_get(wrong.url("/readyz"))
            return status == 503 and expected in text

        wait_for(says_where, timeout=30, what="the sidecar to say where the install is")
    finally:
        wrong.stop()
    assert tables_in(url, "schedlock") == set()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT to_regnamespace('schedlock')").fetchone() == (None,)


def test_an_install_an_earlier_release_made_in_public_stays_there(
    tmp_path: Path, bare_database: str
) -> None:
    """An install in `public` (what every release before the dedicated schema made) keeps
    working where it is with the default setting: `migrate` upgrades it in place and says so,
    creates no `schedlock` schema, and a sidecar fires there."""
    url = bare_database
    assert cli("migrate", "--to", "7", url=url, SCHEDLOCK_DATABASE_SCHEMA="public").returncode == 0
    done = cli("migrate", url=url)
    assert done.returncode == 0, done.stderr
    assert "in PostgreSQL schema public" in done.stdout
    assert (
        "schedlock's tables are in schema public, where an earlier release installed them: used "
        "there while schema schedlock holds none"
    ) in done.stdout
    assert "schedlock_namespace_roles" in tables_in(url, "public")  # migrated in place
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT to_regnamespace('schedlock')").fetchone() == (None,)
    fires(tmp_path, url, "public", "legacy")


def test_a_role_without_usage_on_the_schema_is_told_so(
    postgres: PostgresService, bare_database: str
) -> None:
    """A role granted table privileges by hand but no USAGE on the schema (PostgreSQL then
    leaves the schema off its path): named as such, not as a schema that is not migrated."""
    url = bare_database
    assert cli("migrate", url=url).returncode == 0
    role = "schema_no_usage"
    postgres.execute(f"DROP ROLE IF EXISTS {role}")
    postgres.execute(f"CREATE ROLE {role} LOGIN")
    try:
        postgres.execute(f"GRANT SELECT ON schedlock.schedlock_migrations TO {role}", url=url)
        store = open_store(as_role(url, role))
        status = asyncio.run(store.schema_status())
        assert (status.usable, status.location, status.current) == (False, "schedlock", 0)
        with pytest.raises(MissingPrivileges, match="lacks USAGE on schema 'schedlock'"):
            asyncio.run(ensure_schema(store, migrate=False))
        with pytest.raises(MissingPrivileges, match=f"role '{role}' lacks USAGE on schema"):
            asyncio.run(ensure_schema(store, migrate=False, component="operator"))
        assert asyncio.run(store.missing_privileges("sidecar")) == (
            role,
            ["USAGE on schema schedlock"],
        )
        done = cli("status", url=as_role(url, role))
        assert done.returncode == 1
        assert "USAGE on schema" in done.stderr and "Traceback" not in done.stderr
    finally:
        postgres.execute(f"DROP OWNED BY {role}", url=url)
        postgres.execute(f"DROP ROLE {role}")


def test_an_owner_who_may_not_create_the_schema_is_told_how(
    postgres: PostgresService, bare_database: str
) -> None:
    """The first `migrate` creates the schema; a role that may not (no CREATE on the database)
    gets one line saying what a superuser runs."""
    url = bare_database
    role = "schema_no_create"
    postgres.execute(f"DROP ROLE IF EXISTS {role}")
    postgres.execute(f"CREATE ROLE {role} LOGIN")
    try:
        name = url.rsplit("/", 1)[1]
        postgres.execute(f'REVOKE CREATE ON DATABASE "{name}" FROM PUBLIC')
        done = cli("migrate", url=as_role(url, role))
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "CREATE SCHEMA schedlock AUTHORIZATION" in lines[0], lines
    finally:
        postgres.execute(f"DROP ROLE {role}")
