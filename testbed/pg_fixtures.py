"""pytest fixtures for a real PostgreSQL: one server per session, one fresh database per test.

``SCHEDLOCK_TEST_DATABASE_URL`` (a superuser URL) makes the tests use that server instead of
starting one.  Each test gets a database cloned from a session template, so tests never see
each other's rows, locks or NOTIFY channels.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from testbed.pg import PgBouncer, PostgresServer

TEMPLATE = "schedlock_test_template"


def with_dbname(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


@dataclass
class PostgresService:
    """The session's server: its admin URL, a way to make databases, and backend controls."""

    admin_url: str
    server: PostgresServer | None = None
    _counter: Iterator[int] = field(default_factory=itertools.count)
    template_ready: set[str] = field(default_factory=set)

    def connect(
        self, url: str | None = None, **kwargs: object
    ) -> psycopg.Connection[tuple[object, ...]]:
        """A raw autocommit connection (admin database unless ``url`` says otherwise)."""
        return psycopg.connect(url or self.admin_url, autocommit=True, **kwargs)  # type: ignore[arg-type]

    def execute(
        self, sql: str, *params: object, url: str | None = None
    ) -> list[tuple[object, ...]]:
        with self.connect(url) as conn:
            cur = conn.execute(sql, params or None)
            return cur.fetchall() if cur.description else []

    def create_database(self, template: str = "template0") -> str:
        name = f"t_{os.getpid()}_{next(self._counter)}_{uuid.uuid4().hex[:6]}"
        strategy = " STRATEGY FILE_COPY" if self.server_version() >= 150000 else ""
        self.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"{strategy}')
        return with_dbname(self.admin_url, name)

    def drop_database(self, url: str) -> None:
        name = urlsplit(url).path.lstrip("/")
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def server_version(self) -> int:
        return int(str(self.execute("SHOW server_version_num")[0][0]))

    def backends(self, url: str, application_name: str | None = None) -> list[int]:
        """Backend pids connected to the database of ``url`` (optionally one application)."""
        dbname = urlsplit(url).path.lstrip("/")
        sql = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        params: list[object] = [dbname]
        if application_name is not None:
            sql += " AND application_name = %s"
            params.append(application_name)
        return [int(str(r[0])) for r in self.execute(sql, *params)]

    def terminate_backend(self, pid: int) -> bool:
        return bool(self.execute("SELECT pg_terminate_backend(%s)", pid)[0][0])

    def cancel_backend(self, pid: int) -> bool:
        return bool(self.execute("SELECT pg_cancel_backend(%s)", pid)[0][0])


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresService]:
    external = os.environ.get("SCHEDLOCK_TEST_DATABASE_URL")
    if external:
        yield PostgresService(admin_url=external)
        return
    server = PostgresServer(tmp_path_factory.mktemp("postgres"))
    server.start()
    try:
        yield PostgresService(admin_url=server.url(), server=server)
    finally:
        server.destroy()


@pytest.fixture
def database(postgres: PostgresService) -> Iterator[str]:
    """URL of a fresh, empty database for this test (dropped afterwards)."""
    url = postgres.create_database()
    yield url
    postgres.drop_database(url)


@pytest.fixture
def pgbouncer_factory(
    postgres: PostgresService, tmp_path: Path
) -> Iterator[Callable[[str], PgBouncer]]:
    """Start a real PgBouncer in front of the test server in the given pool mode."""
    started: list[PgBouncer] = []
    port = urlsplit(postgres.admin_url).port or 5432

    def start(pool_mode: str = "transaction") -> PgBouncer:
        bouncer = PgBouncer(
            tmp_path / f"pgbouncer-{len(started)}", upstream_port=port, pool_mode=pool_mode
        )
        bouncer.start()
        started.append(bouncer)
        return bouncer

    yield start
    for bouncer in started:
        bouncer.stop()


SIDECAR_ROLE = "schedlock_sidecar"
OPERATOR_ROLE = "schedlock_operator"


# The schema before the column grants (migration 0010), where their upgrade tests start.
BEFORE_COLUMN_GRANTS = 9
# What `migrate --grant-sidecar ROLE` granted before the column grants (migration 0010): writes
# on whole tables, and every namespace ('*').
TABLE_WIDE_SIDECAR_GRANTS = (
    "GRANT SELECT, INSERT, UPDATE, DELETE ON schedlock_publishes, schedlock_terms TO {role}",
    "GRANT SELECT, UPDATE, DELETE ON schedlock_schedules TO {role}",
    "GRANT SELECT ON schedlock_migrations TO {role}",
    "GRANT USAGE ON SEQUENCE schedlock_publishes_id_seq TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON schedlock_reserves TO {role}",
    "GRANT SELECT, UPDATE ON schedlock_maintenance TO {role}",
    "INSERT INTO schedlock_namespace_roles (role, namespace) VALUES ('{name}', '*')",
)


def grant_table_wide(postgres: PostgresService, url: str, role: str) -> None:
    """Grant ``role`` what a sidecar's role held before the column grants, on the schema
    before them (the upgrade's starting point)."""
    for grant in TABLE_WIDE_SIDECAR_GRANTS:
        postgres.execute(grant.format(role=f'"{role}"', name=role), url=url)


def as_role(url: str, role: str) -> str:
    """The same database URL, connecting as ROLE (the test server trusts local logins)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


# The environment of a sidecar or operator under a runtime role (as_role): such a role has no
# DDL, so it must not migrate; the schema is changed by `schedlock migrate` as the owner only.
RUNTIME_ENV = {"SCHEDLOCK_MIGRATE": "off"}


@pytest.fixture(scope="session")
def runtime_roles(postgres: PostgresService) -> tuple[str, str]:
    """The sidecar's and the operator's login roles (server-wide: created once per session)."""
    for role in (SIDECAR_ROLE, OPERATOR_ROLE):
        exists = postgres.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", role)
        if not exists:
            postgres.execute(f'CREATE ROLE "{role}" LOGIN')
    return SIDECAR_ROLE, OPERATOR_ROLE


@pytest.fixture(scope="session")
def migrated_template(postgres: PostgresService, runtime_roles: tuple[str, str]) -> str:
    """A database migrated once per session by the owner, with the runtime roles granted
    their least privileges; tests clone it (fast) and run components under those roles."""
    import asyncio

    from schedlock.store import GrantRequest, open_store

    url = postgres.create_database()
    store = open_store(url)
    asyncio.run(store.migrate())
    asyncio.run(store.grant(GrantRequest(sidecar_role=SIDECAR_ROLE, operator_role=OPERATOR_ROLE)))
    return urlsplit(url).path.lstrip("/")


@pytest.fixture
def migrated_database(postgres: PostgresService, migrated_template: str) -> Iterator[str]:
    """URL of a fresh database with the current schedlock schema (dropped afterwards)."""
    url = postgres.create_database(template=migrated_template)
    yield url
    postgres.drop_database(url)
