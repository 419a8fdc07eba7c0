"""Row-level security as per-role policies (migration 0011): the policies agree with the mapping.

The mapping of roles to namespaces (migration 0008, written by ``migrate --grant-…``) is the one
source of truth; migration 0011 turns it into one policy per table and mapped role, TO that
role, with a constant predicate, and a trigger on the mapping rewrites them whenever it
changes.  Checked against a real PostgreSQL with real login roles, after every grant form
(plain, ``--namespace`` added, ``--only`` narrowing, the operator's, a '*' narrowed, a mapping
deleted by the owner): what each role reads and may write in every table is exactly what
``schedlock_served_namespaces()`` (the sidecar's start check, ``schedlock status``) says it
serves, for a role that inherits from a mapped one, one that inherits from two, and a NOINHERIT
member (nothing until it SET ROLEs).  Also: a narrowing reaches an open session's prepared
statement at once; the migration's up and down steps keep every role's view and replay to the
same schema; a grant waits for the tables' lock a bounded time, never holding the sidecars'
statements up for longer than that.
"""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
from psycopg import sql

from schedlock.store import GrantRequest, StoreError, open_store
from schedlock.store import postgres as pg_store
from testbed.pg_fixtures import PostgresService, as_role
from testbed.rows import insert_rows
from testbed.schemas import pg_definitions

NAMESPACES = ("a", "b", "c")
TABLES = ("schedlock_publishes", "schedlock_schedules", "schedlock_terms", "schedlock_reserves")
PARENT, OPERATOR, EVERY = "rp_parent", "rp_operator", "rp_every"
CHILD, BOTH, NOINHERIT = "rp_child", "rp_both", "rp_noinherit"
EVERY_NAMESPACE = frozenset(NAMESPACES)
BEFORE, ROLE_POLICIES = 10, 11  # the column grants' schema, and this migration's


@pytest.fixture(scope="module")
def roles(postgres: PostgresService) -> None:
    """Login roles (server-wide, made once): three granted directly; CHILD inherits PARENT's
    privileges and policies, BOTH inherits PARENT's and OPERATOR's, NOINHERIT is a member of
    PARENT that does not inherit (with SELECT of its own, so that only the policies decide what
    it reads)."""
    existing = {str(r[0]) for r in postgres.execute("SELECT rolname FROM pg_roles")}
    for role in (PARENT, OPERATOR, EVERY):
        if role not in existing:
            postgres.execute(f'CREATE ROLE "{role}" LOGIN')
    members = {CHILD: f"{PARENT}", BOTH: f"{PARENT}, {OPERATOR}", NOINHERIT: f"{PARENT}"}
    for role, parents in members.items():
        if role not in existing:
            inherit = "NOINHERIT" if role == NOINHERIT else "INHERIT"
            postgres.execute(f'CREATE ROLE "{role}" LOGIN {inherit} IN ROLE {parents}')


def seed(postgres: PostgresService, url: str) -> None:
    """A row of every namespace in each of the four tables (as the owner)."""
    for ns in NAMESPACES:
        insert_rows(url, 1, namespace=ns, prefix=f"row-{ns}")
        postgres.execute(
            "INSERT INTO schedlock_schedules (namespace, name, uid, target, expression) "
            "VALUES (%s, 's', 's-' || %s, 'app', '@every 1m')",
            ns,
            ns,
            url=url,
        )
        postgres.execute(
            "INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, lock_objid) "
            "VALUES ('publish', %s, 'app', 1396919371, "
            "schedlock_lock_objid('schedlock/v1/publish/' || %s || '/app'))",
            ns,
            ns,
            url=url,
        )
        postgres.execute(
            "INSERT INTO schedlock_reserves (scheduler, namespace, target, holder, next_check_at, "
            "expires_at) VALUES ('publish', %s, 'app', 'h', now(), now() + interval '1 hour')",
            ns,
            url=url,
        )


@pytest.fixture
def db(postgres: PostgresService, database: str, roles: None) -> str:
    """A migrated database with a row of every namespace in every table, which every login
    role may SELECT whether granted yet or not: only the policies decide what it reads."""
    asyncio.run(open_store(database).migrate())
    seed(postgres, database)
    logins = ", ".join(f'"{r}"' for r in (PARENT, OPERATOR, EVERY, CHILD, BOTH, NOINHERIT))
    postgres.execute(f"GRANT SELECT ON {', '.join(TABLES)} TO {logins}", url=database)
    return database


def grant(
    url: str, role: str, *namespaces: str, only: bool = False, operator: bool = False
) -> None:
    store = open_store(url)
    asyncio.run(
        store.grant(
            GrantRequest(
                sidecar_role=None if operator else role,
                operator_role=role if operator else None,
                namespaces=namespaces,
                only=only,
            )
        )
    )


def session(
    url: str, login: str, set_role: str | None = None
) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(as_role(url, login), autocommit=True)
    if set_role is not None:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(set_role)))
    return conn


def reaches_nothing(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """A role never granted lacks USAGE on schedlock's schema: no table or function of it
    resolves for the session (PostgreSQL leaves the schema off its path)."""
    usage = conn.execute("SELECT has_schema_privilege('schedlock', 'USAGE')").fetchone()
    return usage == (False,)


def served(url: str, login: str, set_role: str | None = None) -> frozenset[str]:
    """What schedlock_served_namespaces() answers the session (every namespace for '*'); none
    for a role never granted (without USAGE on schedlock's schema it reaches nothing)."""
    with session(url, login, set_role) as conn:
        if reaches_nothing(conn):
            return frozenset()
        row = conn.execute("SELECT schedlock_served_namespaces(current_user)").fetchone()
    assert row is not None and isinstance(row[0], list)
    answer = {str(name) for name in row[0]}
    return EVERY_NAMESPACE if "*" in answer else frozenset(answer)


def visible(url: str, login: str, set_role: str | None = None) -> dict[str, frozenset[str]]:
    """The namespaces of the rows the session reads, per table."""
    with session(url, login, set_role) as conn:
        if reaches_nothing(conn):
            return dict.fromkeys(TABLES, frozenset())
        return {
            table: frozenset(
                str(r[0]) for r in conn.execute(f"SELECT DISTINCT namespace FROM {table}")
            )
            for table in TABLES
        }


def writable(url: str, login: str) -> frozenset[str]:
    """The namespaces in which the session may register a key (a terms row with the key's own
    lock ids: the role's WITH CHECK), and touch a publishes row (its USING)."""
    allowed: set[str] = set()
    with session(url, login) as conn:
        if reaches_nothing(conn):
            return frozenset()
        for ns in NAMESPACES:
            target = f"w-{login}"
            try:
                conn.execute(
                    "INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, "
                    "lock_objid) VALUES ('publish', %(ns)s, %(t)s, 1396919371, "
                    "schedlock_lock_objid('schedlock/v1/publish/' || %(ns)s || '/' || %(t)s)) "
                    "ON CONFLICT DO NOTHING",
                    {"ns": ns, "t": target},
                )
                inserted = True
            except psycopg.errors.InsufficientPrivilege:
                inserted = False
            updated = conn.execute(
                "UPDATE schedlock_publishes SET updated_at = updated_at WHERE namespace = %s",
                (ns,),
            ).rowcount
            assert inserted == (updated == 1), (login, ns, inserted, updated)
            if inserted:
                allowed.add(ns)
    return frozenset(allowed)


def policies_agree(url: str, postgres: PostgresService) -> None:
    """No change left to make (the owner's view), and every role reads what it serves."""
    drift = postgres.execute("SELECT * FROM schedlock_role_policies_drift()", url=url)
    assert drift == [], drift
    for login in (PARENT, OPERATOR, EVERY, CHILD, BOTH):
        expected = served(url, login)
        assert visible(url, login) == dict.fromkeys(TABLES, expected), login
    # NOINHERIT gets PARENT's policies (and what it serves) only once it SET ROLEs to it;
    # before, it lacks even USAGE on schedlock's schema (PARENT's grant): it reaches nothing.
    with session(url, NOINHERIT) as conn:
        assert reaches_nothing(conn)
    expected = served(url, NOINHERIT, PARENT)
    assert expected == served(url, PARENT)
    assert visible(url, NOINHERIT, PARENT) == dict.fromkeys(TABLES, expected)


def test_policies_and_mapping_agree_after_every_grant_form(
    db: str, postgres: PostgresService
) -> None:
    steps: list[tuple[str, tuple[str, ...], bool, bool, dict[str, frozenset[str]]]] = [
        # role, namespaces, only, as operator -> what the direct roles serve afterwards
        (PARENT, ("a",), False, False, {PARENT: frozenset("a")}),
        (EVERY, (), False, False, {EVERY: EVERY_NAMESPACE}),
        (PARENT, ("b",), False, False, {PARENT: frozenset("ab")}),
        (OPERATOR, ("b", "c"), False, True, {OPERATOR: frozenset("bc")}),
        (PARENT, ("c",), True, False, {PARENT: frozenset("c")}),
        (EVERY, ("a",), True, False, {EVERY: frozenset("a")}),  # '*' narrowed
        (PARENT, (), False, False, {PARENT: EVERY_NAMESPACE}),  # '*' and c
        (PARENT, ("b",), True, False, {PARENT: frozenset("b")}),
    ]
    for role, namespaces, only, operator, expected in steps:
        grant(db, role, *namespaces, only=only, operator=operator)
        for login, serves in expected.items():
            assert served(db, login) == serves, (role, namespaces, only)
        assert served(db, CHILD) == served(db, PARENT)
        assert served(db, BOTH) == served(db, PARENT) | served(db, OPERATOR)
        policies_agree(db, postgres)
        assert writable(db, PARENT) == served(db, PARENT)
        assert writable(db, CHILD) == served(db, PARENT)
    # The owner takes a role off the mapping altogether: its policies go with it.
    postgres.execute("DELETE FROM schedlock_namespace_roles WHERE role = %s", PARENT, url=db)
    assert served(db, PARENT) == frozenset()
    policies_agree(db, postgres)
    assert writable(db, PARENT) == frozenset()
    ours = postgres.execute(
        "SELECT count(*) FROM pg_policy WHERE polname LIKE 'schedlock\\_role\\_%%'", url=db
    )
    assert ours == [(4 * 2,)]  # EVERY's and OPERATOR's, one per table
    # A key's own lock ids only: the restrictive policy stays whatever the role's says.
    with session(db, EVERY) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(
            "INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, lock_objid) "
            "VALUES ('publish', 'a', 'forged', 1396919371, 42)"
        )


def test_a_grant_that_changes_nothing_writes_no_policy(db: str, postgres: PostgresService) -> None:
    """Policies are written only when the mapping changes them: an unchanged grant (a deploy
    job run again) takes no ACCESS EXCLUSIVE lock and keeps the same policies."""
    grant(db, PARENT, "a", "b")
    query = "SELECT oid, polname FROM pg_policy WHERE polname LIKE 'schedlock\\_role\\_%%'"
    before = postgres.execute(query, url=db)
    grant(db, PARENT, "b")
    grant(db, PARENT, "a", "b", only=True)
    assert postgres.execute(query, url=db) == before
    assert postgres.execute("SELECT schedlock_apply_role_policies()", url=db) == [(0,)]


def test_a_narrowing_reaches_an_open_sessions_prepared_statement(
    db: str, postgres: PostgresService
) -> None:
    grant(db, PARENT, "a", "b")
    count = "SELECT count(*) FROM schedlock_publishes WHERE namespace = ANY (%s)"
    with session(db, PARENT) as conn:
        for _ in range(6):  # past psycopg's prepare threshold: a prepared, cached plan
            assert conn.execute(count, (list(NAMESPACES),), prepare=True).fetchone() == (2,)
        grant(db, PARENT, "a", only=True)
        assert conn.execute(count, (list(NAMESPACES),), prepare=True).fetchone() == (1,)


def test_the_migration_keeps_every_roles_view_up_and_down(
    db: str, postgres: PostgresService
) -> None:
    """Mapped on schema 10 (0008's function-based policies), each role reads the same rows on
    11 (its own policies) and again after the down step, which replays to schema 10's exact
    definition; a mapping row written on 11 without this release's grant (by an older binary's
    `migrate --grant-…`, or by hand) gets its policies from the trigger."""
    owner = open_store(db)
    asyncio.run(owner.migrate(to=BEFORE))
    grant(db, PARENT, "a", "b")
    grant(db, OPERATOR, "c", operator=True)
    grant(db, EVERY)
    logins = (PARENT, OPERATOR, EVERY, CHILD, BOTH)
    on_10 = {login: visible(db, login) for login in logins}
    assert on_10[PARENT] == dict.fromkeys(TABLES, frozenset("ab"))
    assert on_10[BOTH] == dict.fromkeys(TABLES, EVERY_NAMESPACE)
    schema_10 = pg_definitions(db)

    asyncio.run(owner.migrate(to=ROLE_POLICIES))
    assert {login: visible(db, login) for login in logins} == on_10
    policies_agree(db, postgres)
    served_policy = postgres.execute(
        "SELECT count(*) FROM pg_policy WHERE polname = 'schedlock_served'", url=db
    )
    assert served_policy == [(0,)]
    schema_11 = pg_definitions(db)

    asyncio.run(owner.migrate(to=BEFORE))
    assert pg_definitions(db) == schema_10
    assert {login: visible(db, login) for login in logins} == on_10
    asyncio.run(owner.migrate(to=ROLE_POLICIES))
    assert pg_definitions(db) == schema_11

    postgres.execute(
        "INSERT INTO schedlock_namespace_roles (role, namespace) VALUES (%s, 'c')", PARENT, url=db
    )
    assert visible(db, PARENT) == dict.fromkeys(TABLES, frozenset("abc"))
    policies_agree(db, postgres)


def test_a_grant_waits_for_the_tables_lock_a_bounded_time(
    db: str, postgres: PostgresService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long transaction reads the publishes (a pg_dump, a report): the grant's policy change
    cannot lock the table.  It gives up after each lock_timeout and tries again, so a sidecar's
    statement queued behind it waits no longer than that; after its last try it fails with the
    reason and has granted nothing.  Once the transaction ends, the same grant goes through."""
    monkeypatch.setattr(pg_store, "POLICY_LOCK_ATTEMPTS", 4)
    monkeypatch.setattr(pg_store, "POLICY_LOCK_PAUSE_SECONDS", 0.2)
    grant(db, PARENT, "a")
    blocker = postgres.connect(db)
    blocker.execute("BEGIN")
    blocker.execute("SELECT count(*) FROM schedlock_publishes")
    waits: list[float] = []
    stop = threading.Event()

    def sidecar_statements() -> None:
        with postgres.connect(db) as conn:
            while not stop.is_set():
                started = time.monotonic()
                conn.execute("UPDATE schedlock_publishes SET updated_at = now() WHERE id = 1")
                waits.append(time.monotonic() - started)
                time.sleep(0.01)

    probe = threading.Thread(target=sidecar_statements)
    probe.start()
    try:
        started = time.monotonic()
        with pytest.raises(StoreError, match="could not write the row-level security policies"):
            grant(db, PARENT, "b")
        took = time.monotonic() - started
    finally:
        stop.set()
        probe.join()
        blocker.execute("ROLLBACK")
        blocker.close()
    assert 4 * pg_store.POLICY_LOCK_TIMEOUT_MS / 1000 <= took < 10
    assert waits and max(waits) < 1.0, max(waits)
    assert served(db, PARENT) == frozenset("a")  # nothing of the failed grant stayed
    grant(db, PARENT, "b")
    assert served(db, PARENT) == frozenset("ab")
    policies_agree(db, postgres)


def test_a_grant_retried_after_a_lock_timeout_reports_once(
    db: str, postgres: PostgresService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction holding the table ends while the grant retries: the grant goes through,
    and its report names the role once (the failed tries' parts are dropped)."""
    monkeypatch.setattr(pg_store, "POLICY_LOCK_PAUSE_SECONDS", 0.2)
    blocker = postgres.connect(db)
    blocker.execute("BEGIN")
    blocker.execute("SELECT count(*) FROM schedlock_terms")
    timer = threading.Timer(0.7, lambda: blocker.execute("ROLLBACK"))
    timer.start()
    try:
        report = asyncio.run(
            open_store(db).grant(
                GrantRequest(sidecar_role=PARENT, operator_role=None, namespaces=("c",))
            )
        )
    finally:
        timer.join()
        blocker.close()
    assert report.serves == {PARENT: ("c",)}
    assert report.columns_only == [PARENT]
    policies_agree(db, postgres)
