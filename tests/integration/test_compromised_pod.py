"""The compromised pod (issue 20): namespace A's credential, used as an attacker would, reaches
nothing of namespace B's while B's sidecars run — the database refuses it.

A real PostgreSQL that checks passwords (scram-sha-256 for every role but the superuser), two
namespaces, each with its own login role and password granted by the real CLI with
``schedlock migrate --grant-sidecar ROLE --namespace NS``; B's two sidecars and A's one fire
into recording apps.  As A's role, every attack of the issue's list is tried by hand (raw SQL,
as a compromised app container holding ``SCHEDLOCK_DATABASE_URL`` would) and by an unmodified
``schedlock sidecar`` pointed at B, started before B's sidecars and again while they lead.
Each is refused or matches no row; at the end every row of B fired once to B's app with the
payload it was written with, and A's honest sidecar fired every row of A.

Within its own namespace too (least privilege, migration 0010): A's role may change only the
columns its loops change, writes a slot row or a term only through the schema's functions
(which copy the slot from its schedule and check the namespace), inserts no publishes row and
deletes only finished rows — while A's honest sidecar, granted by this release's CLI, fires A's
one-shot rows and the slots of A's schedule, takes its terms and keeps its reserves' roster.

The whole module runs three times: on a database as PostgreSQL 15+ creates it; on one whose
``public`` schema grants CREATE to PUBLIC (PostgreSQL 14 and older, upgraded databases), where
A's role may create objects in ``public`` that shadow ours (a table, ``sha256``) and none of them
is ever used (schedlock's search_path names only its own schema, and its functions pin theirs);
and on such a database with schedlock installed in ``public`` by an earlier release, where
``migrate --grant-…`` revokes PUBLIC's CREATE and says so.

Out of reach of any grant: advisory locks have no ACL, so A's role can still hold
``pg_advisory_lock`` on B's key ids by hand (lock squatting) and B's rows wait.  It is
detected, last here: within seconds B's waiting sidecars name A's role and its backend pid on
``/readyz`` (still 200), in ``schedlock_lock_foreign_holder`` and their log, and ``schedlock
status`` names them too (as the admin and as an operator role scoped to B); an admin's
``pg_terminate_backend`` ends it, B leads again and every row fires once.  B's standbys waiting
behind B's own leader all along never said a foreign holder.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from schedlock.core.logs import Event, records
from schedlock.store import LockKey, open_store
from testbed.pg import PostgresServer
from testbed.pg_fixtures import RUNTIME_ENV
from testbed.rows import fetch, insert_rows, row_states, wait_published
from testbed.sidecars import SidecarGroup, SidecarProcess, http_get, wait_for
from testbed.sidecars import schedlock_cli as cli

NS_A, NS_B = "team-a", "team-b"
ROLE_A, ROLE_B, OPS_B = "tenant_a", "tenant_b", "ops_b"  # ops_b: an operator role of B only
PASSWORDS = {ROLE_A: "a-pass-7f3", ROLE_B: "b-pass-9c1", OPS_B: "ops-pass-4d2"}
TABLES = ("schedlock_publishes", "schedlock_schedules", "schedlock_terms", "schedlock_reserves")
B_ROWS, A_ROWS = 20, 10
REFUSED_BY_POLICY = "violates row-level security policy"
NOT_GRANTED = "permission denied"
A_SCHEDULE = "rec-a"  # an @every schedule of A's: its slots are 'rec-a@<time>'


@dataclass
class Tenancy:
    server: PostgresServer
    admin: str
    url_a: str
    url_b: str
    public_create: bool
    schema: str  # where the install lives
    granted: dict[str, str] = field(default_factory=dict)  # role -> the CLI's output
    squatter_first: SidecarProcess | None = None
    team_a: SidecarGroup | None = None
    team_b: SidecarGroup | None = None


def squatter(tenancy: Tenancy, workdir: Path, name: str) -> SidecarProcess:
    """An unmodified sidecar holding A's credential, configured for namespace B."""
    env = {"SCHEDLOCK_NAMESPACE": NS_B, **RUNTIME_ENV}
    return SidecarProcess.for_stand_in_app(name, workdir, tenancy.url_a, **env).start()


@pytest.fixture(
    scope="module",
    params=[(False, "schedlock"), (True, "schedlock"), (True, "public")],
    ids=["default-schema", "public-create", "legacy-public"],
)
def tenancy(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tenancy]:
    public_create, schema = request.param
    workdir = tmp_path_factory.mktemp("compromised")
    server = PostgresServer(workdir / "pg", passwords=True)
    server.start()
    try:
        server.psql("CREATE DATABASE tenants")
        if public_create:
            server.psql("GRANT CREATE ON SCHEMA public TO PUBLIC", dbname="tenants")
        for role, password in PASSWORDS.items():
            server.psql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        admin = server.url("tenants")
        # An earlier release's install (in public), or this one's: every later command runs
        # with the default schema setting, as an upgraded install's do.
        assert cli("migrate", url=admin, SCHEDLOCK_DATABASE_SCHEMA=schema).returncode == 0
        tenancy = Tenancy(
            server,
            admin,
            url_a=server.url("tenants", ROLE_A, PASSWORDS[ROLE_A]),
            url_b=server.url("tenants", ROLE_B, PASSWORDS[ROLE_B]),
            public_create=public_create,
            schema=schema,
        )
        for role, namespace in ((ROLE_A, NS_A), (ROLE_B, NS_B)):
            done = cli("migrate", "--grant-sidecar", role, "--namespace", namespace, url=admin)
            assert done.returncode == 0, done.stderr
            tenancy.granted[role] = done.stdout
        done = cli("migrate", "--grant-operator", OPS_B, "--namespace", NS_B, url=admin)
        assert done.returncode == 0, done.stderr
        # Started before B's sidecars: it must exit, never holding B's key in the meantime.
        tenancy.squatter_first = squatter(tenancy, workdir / "squat", "squatter-first")
        tenancy.team_b = SidecarGroup(
            workdir / "b", tenancy.url_b, namespace=NS_B, replicas=2, extra_env=RUNTIME_ENV
        ).start()
        tenancy.team_a = SidecarGroup(
            workdir / "a", tenancy.url_a, namespace=NS_A, replicas=1, extra_env=RUNTIME_ENV
        ).start()
        tenancy.team_b.wait_leader()
        insert_rows(admin, B_ROWS, start_in=8, spacing=0.1, namespace=NS_B, prefix="b")
        insert_rows(admin, A_ROWS, start_in=8, spacing=0.1, namespace=NS_A, prefix="a")
        server.psql(
            "INSERT INTO schedlock_schedules (namespace, name, uid, target, expression, state) "
            f"VALUES ('{NS_B}', 'b-nightly', 'b-nightly', 'demo', '0 3 * * *', 'suspended'), "
            # active, and never due while the module runs: a schedule A tries to take a slot of
            f"('{NS_B}', 'b-yearly', 'b-yearly', 'demo', '0 0 1 1 *', 'active'), "
            f"('{NS_A}', '{A_SCHEDULE}', '{A_SCHEDULE}', 'demo', '@every 2s', 'active')",
            dbname="tenants",
        )
        server.psql(
            f'UPDATE schedlock_schedules SET payload = \'{{"s": "a"}}\' '
            f"WHERE uid = '{A_SCHEDULE}'",
            dbname="tenants",
        )
        yield tenancy
    finally:
        for group in (tenancy.team_a, tenancy.team_b):
            if group is not None:
                group.stop()
        if tenancy.squatter_first is not None:
            tenancy.squatter_first.stop()
        server.destroy()


def as_a(tenancy: Tenancy) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(tenancy.url_a, autocommit=True)


def b_rows(tenancy: Tenancy, table: str) -> int:
    found = fetch(tenancy.admin, f"SELECT count(*) FROM {table} WHERE namespace = %s", NS_B)
    return int(found[0][0])


def test_the_grant_scopes_each_role_and_says_what_it_did(tenancy: Tenancy) -> None:
    said = tenancy.granted[ROLE_A]
    assert f"{ROLE_A} may serve namespace {NS_A} only" in said
    assert f"{ROLE_A} may update only the columns a sidecar's loops change" in said
    assert "every namespace" not in said
    revoked = "revoked CREATE on schema public from PUBLIC"
    # Where schedlock lives in public, the first grant revokes what PUBLIC had there and the
    # second finds nothing left; its own schema never granted PUBLIC anything, and public is
    # then the app's business, not schedlock's.
    assert (revoked in said) is (tenancy.public_create and tenancy.schema == "public")
    assert revoked not in tenancy.granted[ROLE_B]


def test_a_reads_nothing_of_b(tenancy: Tenancy) -> None:
    with as_a(tenancy) as conn:
        for table in TABLES:
            assert b_rows(tenancy, table) > 0 or table == "schedlock_reserves"
            found = conn.execute(f"SELECT count(*) FROM {table} WHERE namespace = %s", (NS_B,))
            assert found.fetchone() == (0,), table
        # ... nor the mapping (only through the function, and only its own)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM schedlock_namespace_roles")
        own = conn.execute("SELECT schedlock_served_namespaces(%s)", (ROLE_B,)).fetchone()
        assert own == ([],)


# Each statement as A's role against B's rows: matched no row (row-level security, 0008), or
# refused outright, before any row is looked at, for writing a column A's role may not write
# at all (0010).  The columns A may write are tried too, so row-level security is shown.
@pytest.mark.parametrize(
    ("statement", "refused"),
    [
        (
            "UPDATE schedlock_publishes SET payload = '{\"evil\": true}', "
            "next_attempt_at = now() WHERE namespace = %s",
            True,
        ),
        ("UPDATE schedlock_publishes SET next_attempt_at = now() WHERE namespace = %s", False),
        ("UPDATE schedlock_publishes SET state = 'failed' WHERE namespace = %s", False),
        (
            "UPDATE schedlock_schedules SET payload = '{\"evil\": true}', state = 'active' "
            "WHERE namespace = %s",
            True,
        ),
        ("UPDATE schedlock_schedules SET next_slot_at = now() WHERE namespace = %s", False),
        (
            "UPDATE schedlock_terms SET term = term + 1, holder = 'attacker' WHERE namespace = %s",
            True,
        ),
        ("UPDATE schedlock_terms SET heartbeat_at = NULL WHERE namespace = %s", False),
        ("UPDATE schedlock_reserves SET expires_at = now() WHERE namespace = %s", False),
        ("DELETE FROM schedlock_publishes WHERE namespace = %s", False),
        ("DELETE FROM schedlock_schedules WHERE namespace = %s", False),
        ("DELETE FROM schedlock_terms WHERE namespace = %s", False),
        ("DELETE FROM schedlock_reserves WHERE namespace = %s", False),
        ("SELECT * FROM schedlock_begin_term('publish', %s, 'demo', 'attacker')", False),
        ("SELECT * FROM schedlock_begin_term('recurring', %s, 'demo', 'attacker')", False),
    ],
    ids=lambda v: (
        " ".join(v.split()[:2]) + " " + v.split()[2 if v.startswith("U") else 3][:30]
        if isinstance(v, str)
        else ("refused" if v else "0-rows")
    ),
)
def test_a_changes_no_row_of_b(tenancy: Tenancy, statement: str, refused: bool) -> None:
    terms = "SELECT scheduler, term, holder FROM schedlock_terms WHERE namespace = %s ORDER BY 1"
    before = fetch(tenancy.admin, terms, NS_B)
    with as_a(tenancy) as conn:
        if refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=NOT_GRANTED):
                conn.execute(statement, (NS_B,))
        else:
            assert conn.execute(statement, (NS_B,)).rowcount == 0
    # B's leaders run undisturbed all along: no term of B moves, none names the attacker.
    assert fetch(tenancy.admin, terms, NS_B) == before


def test_a_cannot_write_a_row_into_b(tenancy: Tenancy) -> None:
    with as_a(tenancy) as conn:
        # No INSERT on the publishes at all (0010): a slot row only through the function.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=NOT_GRANTED):
            conn.execute(
                "INSERT INTO schedlock_publishes (namespace, name, uid, target, due_at, "
                "next_attempt_at, payload) VALUES (%s, 'forged', 'forged-1', 'demo', now(), "
                "now(), '{\"evil\": true}')",
                (NS_B,),
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # no INSERT granted at all
            conn.execute(
                "INSERT INTO schedlock_schedules (namespace, name, uid, target, expression) "
                "VALUES (%s, 'forged', 'forged-s', 'demo', '@every 1s')",
                (NS_B,),
            )
        # Moving one of its own rows there: the namespace is not a column it may update.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=NOT_GRANTED):
            conn.execute(
                "UPDATE schedlock_publishes SET namespace = %s WHERE namespace = %s",
                (NS_B, NS_A),
            )
    assert not fetch(tenancy.admin, "SELECT 1 FROM schedlock_publishes WHERE uid = 'forged-1'")


def test_a_cannot_squat_a_key_b_has_not_registered_yet(tenancy: Tenancy) -> None:
    future = LockKey("publish", NS_B, "next-app")
    with as_a(tenancy) as conn:
        # The key itself, in B's namespace ...
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=REFUSED_BY_POLICY):
            conn.execute(
                "INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, "
                "lock_objid) VALUES (%s, %s, %s, %s, %s)",
                (future.scheduler, future.namespace, future.target, future.classid, future.objid),
            )
        # ... or a key of A's own holding B's key's lock ids (B's sidecar would see a collision)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=REFUSED_BY_POLICY):
            conn.execute(
                "INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, "
                "lock_objid) VALUES ('publish', %s, 'decoy', %s, %s)",
                (NS_A, future.classid, future.objid),
            )
    # B's sidecar for that key registers it and finds no collision.

    async def connect_as_b() -> None:
        session = open_store(tenancy.url_b).lock_session(future, "b-next-app", 15)
        await session.connect()
        await session.close()

    asyncio.run(connect_as_b())
    assert fetch(
        tenancy.admin,
        "SELECT lock_objid FROM schedlock_terms WHERE namespace = %s AND target = 'next-app'",
        NS_B,
    ) == [(future.objid,)]


def test_an_unmodified_sidecar_with_a_credential_for_b_exits_2(
    tenancy: Tenancy, tmp_path: Path
) -> None:
    late = squatter(tenancy, tmp_path, "squatter-late")
    try:
        for sidecar in (tenancy.squatter_first, late):
            assert sidecar is not None
            assert sidecar.wait(30) == 2
            line = (
                f"schedlock sidecar: error: role '{ROLE_A}' may not serve namespace '{NS_B}': "
                f"as the schema owner run `schedlock migrate --grant-sidecar {ROLE_A} "
                f"--namespace {NS_B}`"
            )
            assert line in sidecar.log_text().splitlines()
    finally:
        late.stop()


def test_a_role_creates_nothing_in_the_schema(tenancy: Tenancy) -> None:
    schema = tenancy.schema
    with as_a(tenancy) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"CREATE TABLE {schema}.schedlock_publishes_shadow (id int)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                f"CREATE FUNCTION {schema}.sha256(bytea) RETURNS bytea LANGUAGE sql AS 'SELECT $1'"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO schedlock_namespace_roles VALUES (%s, %s)", (ROLE_A, NS_B))


def test_what_a_role_creates_in_public_is_never_used(tenancy: Tenancy) -> None:
    """Where PUBLIC may still create in ``public`` and schedlock lives in its own schema, A's
    role plants look-alikes there: a publishes table holding a forged row of B's due now, and
    a ``sha256`` that would make every key's lock id the same.  schedlock's sessions resolve
    names in its schema only and its functions pin theirs: the forged row never fires (B's app
    gets exactly B's rows, the last test) and A still registers no term under B's lock ids."""
    if not (tenancy.public_create and tenancy.schema != "public"):
        pytest.skip("only where PUBLIC may create in public and schedlock lives elsewhere")
    with as_a(tenancy) as conn:
        conn.execute(
            "CREATE TABLE public.schedlock_publishes "
            "(LIKE schedlock.schedlock_publishes INCLUDING DEFAULTS)"
        )
        conn.execute(
            "INSERT INTO public.schedlock_publishes (id, namespace, name, uid, target, payload, "
            f"due_at, next_attempt_at) VALUES (-1, '{NS_B}', 'forged', 'forged', 'demo', "
            """'{"evil": 1}', now(), now())"""
        )
        conn.execute(
            "CREATE FUNCTION public.sha256(bytea) RETURNS bytea LANGUAGE sql AS 'SELECT $1'"
        )


@pytest.mark.parametrize(
    ("table", "assignment"),
    [
        ("schedlock_publishes", "payload = '{\"evil\": true}'"),
        ("schedlock_publishes", "due_at = now()"),
        ("schedlock_publishes", "target = 'elsewhere'"),
        ("schedlock_publishes", "namespace = namespace"),
        ("schedlock_publishes", "max_attempts = 100"),
        ("schedlock_publishes", "name = 'renamed'"),
        ("schedlock_publishes", "uid = uid || '-x'"),
        ("schedlock_schedules", "payload = '{\"evil\": true}'"),
        ("schedlock_schedules", "expression = '@every 1s'"),
        ("schedlock_schedules", "target = 'elsewhere'"),
        ("schedlock_schedules", "state = 'active'"),
        ("schedlock_terms", "term = term + 1"),
        ("schedlock_terms", "holder = 'attacker'"),
        ("schedlock_terms", "lock_objid = lock_objid + 1"),
    ],
    ids=lambda v: v.split()[0].removeprefix("schedlock_"),
)
def test_a_cannot_rewrite_its_own_rows_beyond_the_columns_its_loops_change(
    tenancy: Tenancy, table: str, assignment: str
) -> None:
    with (
        as_a(tenancy) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege, match=NOT_GRANTED),
    ):
        conn.execute(f"UPDATE {table} SET {assignment} WHERE namespace = %s", (NS_A,))


def test_a_cannot_insert_a_row_into_its_own_namespace(tenancy: Tenancy) -> None:
    with (
        as_a(tenancy) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege, match=NOT_GRANTED),
    ):
        conn.execute(
            "INSERT INTO schedlock_publishes (namespace, name, uid, target, due_at, "
            "next_attempt_at, payload) VALUES (%s, 'forged', 'forged-a', 'demo', now(), "
            "now(), '{\"evil\": true}')",
            (NS_A,),
        )
    assert not fetch(tenancy.admin, "SELECT 1 FROM schedlock_publishes WHERE uid = 'forged-a'")


def test_the_slot_function_takes_only_a_schedule_a_may_serve_at_its_current_term(
    tenancy: Tenancy,
) -> None:
    def schedule_id(uid: str) -> int:
        return int(
            fetch(tenancy.admin, "SELECT id FROM schedlock_schedules WHERE uid = %s", uid)[0][0]
        )

    def recurring_term(namespace: str) -> int:
        found = fetch(
            tenancy.admin,
            "SELECT term FROM schedlock_terms WHERE scheduler = 'recurring' AND namespace = %s "
            "AND target = 'demo'",
            namespace,
        )
        return int(found[0][0])

    b_yearly, own = schedule_id("b-yearly"), schedule_id(A_SCHEDULE)
    attempts = [
        (b_yearly, recurring_term(NS_B)),  # B's schedule, at B's real term
        (10**12, recurring_term(NS_A)),  # a schedule id that does not exist
        (own, -1),  # A's own schedule, at a term that is not its key's
    ]
    with as_a(tenancy) as conn:
        for schedule, term in attempts:
            inserted = conn.execute(
                "SELECT schedlock_insert_slot(%s, now() + interval '1 hour', %s, 16384)",
                (schedule, term),
            ).fetchone()
            assert inserted == (0,), (schedule, term)
    forged = "SELECT count(*) FROM schedlock_publishes WHERE schedule_id = %s AND due_at > now()"
    assert fetch(tenancy.admin, forged, b_yearly) == [(0,)]
    assert fetch(tenancy.admin, forged, own) == [(0,)]


def test_a_bumps_no_term_of_its_own_without_holding_the_keys_lock(tenancy: Tenancy) -> None:
    """Only the session holding a key's lock starts a term (A's sidecar holds A's): a term
    bumped from outside would supersede the leader's fenced writes mid-delivery."""
    terms = "SELECT scheduler, term, holder FROM schedlock_terms WHERE namespace = %s ORDER BY 1"
    before = fetch(tenancy.admin, terms, NS_A)
    with as_a(tenancy) as conn:
        for scheduler in ("publish", "recurring"):
            bumped = conn.execute(
                "SELECT * FROM schedlock_begin_term(%s, %s, 'demo', 'attacker')",
                (scheduler, NS_A),
            )
            assert bumped.fetchall() == [], scheduler
    assert fetch(tenancy.admin, terms, NS_A) == before


def test_a_deletes_only_its_own_finished_rows(tenancy: Tenancy) -> None:
    tenancy.server.psql(
        "INSERT INTO schedlock_publishes (namespace, name, uid, target, due_at, "
        "next_attempt_at, state, updated_at) SELECT "
        f"'{NS_A}', 'old', 'old-a-' || n, 'demo', now() - interval '2 days', "
        "now() - interval '2 days', 'published', now() - interval '2 days' "
        "FROM generate_series(1, 3) AS n",
        dbname="tenants",
    )
    with as_a(tenancy) as conn:
        live = "state IN ('scheduled', 'firing', 'suspended')"
        gone = conn.execute(
            f"DELETE FROM schedlock_publishes WHERE namespace = %s AND {live}", (NS_A,)
        )
        assert gone.rowcount == 0
        gone = conn.execute("DELETE FROM schedlock_schedules WHERE namespace = %s", (NS_A,))
        assert gone.rowcount == 0  # active
        gone = conn.execute("DELETE FROM schedlock_terms WHERE namespace = %s", (NS_A,))
        assert gone.rowcount == 0  # its sidecar holds the keys' locks
        gone = conn.execute(
            "DELETE FROM schedlock_publishes WHERE namespace = %s AND uid LIKE 'old-a-%%'", (NS_A,)
        )
        assert gone.rowcount == 3
    assert fetch(
        tenancy.admin, "SELECT count(*) FROM schedlock_schedules WHERE uid = %s", A_SCHEDULE
    ) == [(1,)]


def test_a_keeps_its_own_reserves_roster(tenancy: Tenancy) -> None:
    key = LockKey("publish", NS_A, "spare")
    mine = "SELECT count(*) FROM schedlock_reserves WHERE holder = 'a-reserve'"

    async def enlist_and_leave() -> None:
        session = open_store(tenancy.url_a).lock_session(key, "a-reserve", 15)
        await session.connect()  # registers the key: its own columns only
        try:
            await session.enlist_reserve(30, 10)
            await session.enlist_reserve(30, 10)  # a refresh: an update of its times
            assert fetch(tenancy.admin, mine) == [(1,)]
            assert (await session.reserve_roster()).reserves == 1
            await session.leave_reserves()
            assert fetch(tenancy.admin, mine) == [(0,)]
        finally:
            await session.close()

    asyncio.run(enlist_and_leave())


def test_every_row_fires_to_its_own_app(tenancy: Tenancy) -> None:
    """Last: after every attack above, B's rows all fired once, to B's app, as written."""
    assert tenancy.team_a is not None and tenancy.team_b is not None
    assert tenancy.team_a.receiver is not None and tenancy.team_b.receiver is not None
    wait_published(tenancy.admin, "b", B_ROWS, timeout=60)
    wait_published(tenancy.admin, "a", A_ROWS, timeout=60)
    published_slots = (
        "SELECT count(*) FROM schedlock_publishes WHERE uid LIKE %s AND state = 'published'"
    )
    wait_for(
        lambda: fetch(tenancy.admin, published_slots, f"{A_SCHEDULE}@%")[0][0] >= 2,
        timeout=30,
        what="two slots of A's schedule published",
    )
    got_b, got_a = tenancy.team_b.receiver.entries(), tenancy.team_a.receiver.entries()
    slots = [e for e in got_a if str(e["uid"]).startswith(f"{A_SCHEDULE}@")]
    got_a = [e for e in got_a if e not in slots]
    # A's slots, written by the function from A's schedule: its payload, to A's app.
    assert len(slots) >= 2 and all(e["payload"] == {"s": "a"} for e in slots)
    assert {e["namespace"] for e in slots} == {NS_A}
    # A's sidecar took its keys' terms (through the term function) and leads them.
    terms = "SELECT scheduler, term, holder FROM schedlock_terms WHERE namespace = %s AND target = 'demo'"
    a_terms = fetch(tenancy.admin, terms, NS_A)
    assert {t[0] for t in a_terms} == {"publish", "recurring"}
    assert all(t[1] >= 1 and t[2] in {s.name for s in tenancy.team_a} for t in a_terms)
    assert sorted(e["uid"] for e in got_b) == sorted(f"b-{i}" for i in range(B_ROWS))
    assert {e["namespace"] for e in got_b} == {NS_B}
    assert all(e["payload"] == {"n": int(e["uid"][2:])} for e in got_b)
    assert {str(e["holder"]) for e in got_b} <= {s.name for s in tenancy.team_b}
    assert sorted(e["uid"] for e in got_a) == sorted(f"a-{i}" for i in range(A_ROWS))
    assert {e["namespace"] for e in got_a} == {NS_A}
    assert all(e["payload"] == {"n": int(e["uid"][2:])} for e in got_a)
    assert row_states(tenancy.admin, "b") == {"published": B_ROWS}


# -- lock squatting: not prevented (advisory locks have no ACL), detected ---------------------

SQUATTED = LockKey("publish", NS_B, "demo")
SQ_ROWS = 5


def _holder_pid(tenancy: Tenancy) -> int | None:
    """The backend pid holding SQUATTED's lock, as the admin sees it in pg_locks."""
    found = fetch(
        tenancy.admin,
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
        "classid = %s::int::oid AND objid = %s::int::oid AND objsubid = 2",
        SQUATTED.classid,
        SQUATTED.objid,
    )
    return int(found[0][0]) if found else None


def _waiting(tenancy: Tenancy, pid: int) -> bool:
    return bool(
        fetch(
            tenancy.admin,
            "SELECT 1 FROM pg_locks WHERE pid = %s AND locktype = 'advisory' AND NOT granted",
            pid,
        )
    )


def _foreign_gauge(sidecar: SidecarProcess) -> float | None:
    for name, value in sidecar.metrics().items():
        if name.startswith("schedlock_lock_foreign_holder{") and 'scheduler="publish"' in name:
            return value
    return None


def _readyz(sidecar: SidecarProcess) -> tuple[int, str]:
    status, text = http_get(sidecar.url("/readyz"))
    return status, text.strip()


def _status(url: str) -> dict[str, object]:
    done = cli("status", "--json", url=url)
    assert done.returncode == 0, done.stderr
    (key,) = [
        k
        for k in json.loads(done.stdout)
        if (k["scheduler"], k["namespace"], k["target"]) == ("publish", NS_B, "demo")
    ]
    return dict(key)


def _take_the_lock_from_b(
    tenancy: Tenancy, squatter: psycopg.Connection[tuple[object, ...]]
) -> None:
    """A's session queues for B's key (plain pg_advisory_lock, no time-out: B's leaders only
    ever try a key's own lock, never queue for it) and the admin ends B's leader's session, as
    a crash would: the lock goes to A.  Repeated in the rare case a standby of B
    was ahead (with every row of B published, a hand-over costs nothing)."""
    pid = squatter.info.backend_pid
    locked = threading.Thread(
        target=squatter.execute,
        args=("SELECT pg_advisory_lock(%s, %s)", (SQUATTED.classid, SQUATTED.objid)),
        daemon=True,
    )
    locked.start()
    wait_for(lambda: _waiting(tenancy, pid), timeout=10, what="A's session to queue for B's key")
    for _ in range(5):
        holder = wait_for(lambda: _holder_pid(tenancy), timeout=30, what="a holder of B's key")
        if holder == pid:
            break
        fetch(tenancy.admin, "SELECT pg_terminate_backend(%s)", holder)

        def gone(was: int | None = holder) -> bool:
            return _holder_pid(tenancy) != was

        wait_for(gone, timeout=30, what="B's leader gone")
    else:
        pytest.fail("A's session never got B's key")
    locked.join(10)


def test_b_never_saw_a_foreign_holder_behind_its_own_leader(tenancy: Tenancy) -> None:
    """The negative, before any squatting: B's standbys have waited behind B's own leader since
    the module began (and through the attacks above)."""
    assert tenancy.team_b is not None
    for sidecar in tenancy.team_b:
        assert _foreign_gauge(sidecar) == 0
        assert not list(records(sidecar.log_text(), Event.LOCK_HELD_BY_FOREIGN_ROLE))
        assert _readyz(sidecar) == (200, "ok")
    assert _status(tenancy.admin)["foreignHolder"] is None


def test_a_holding_bs_lock_by_hand_is_named_everywhere_until_an_admin_ends_it(
    tenancy: Tenancy,
) -> None:
    assert tenancy.team_b is not None and tenancy.team_b.receiver is not None
    team_b = list(tenancy.team_b)
    wait_published(tenancy.admin, "b", B_ROWS, timeout=60)  # nothing of B in flight
    squatter = psycopg.connect(tenancy.url_a, autocommit=True)
    pid = squatter.info.backend_pid
    try:
        _take_the_lock_from_b(tenancy, squatter)
        insert_rows(tenancy.admin, SQ_ROWS, start_in=0, namespace=NS_B, prefix="sq")
        named = f"lock held by role '{ROLE_A}' (backend pid {pid}) since "
        # The B sidecar that leads B's target (its leadership lock; it tries the publish key's
        # own lock every second) names it on /readyz, still 200; so do the metric ...
        leader_b = wait_for(
            lambda: [s for s in team_b if named in _readyz(s)[1]],
            timeout=30,
            what="B's leader's /readyz to name the foreign holder",
        )[0]
        status, text = _readyz(leader_b)
        assert status == 200 and text.startswith("ok, key's lock held by a role"), text
        assert f"publish/{NS_B}/demo: {named}" in text
        assert _foreign_gauge(leader_b) == 1
        # ... and the log
        said = list(records(leader_b.log_text(), Event.LOCK_HELD_BY_FOREIGN_ROLE))
        assert said and {(r["role"], r["pid"], r["key"]) for r in said} == {
            (ROLE_A, pid, str(SQUATTED))
        }
        # The other waits for the leadership lock, behind B's own leader: nothing foreign.
        for other in (s for s in team_b if s is not leader_b):
            assert named not in _readyz(other)[1] and _foreign_gauge(other) == 0
        # schedlock status, as the admin and as B's operator role (under row-level security)
        ops_b = tenancy.server.url("tenants", OPS_B, PASSWORDS[OPS_B])
        for url in (tenancy.admin, ops_b):
            assert _status(url)["foreignHolder"] == {"role": ROLE_A, "pid": pid}
        table = cli("status", url=ops_b).stdout
        assert f"FOREIGN:{ROLE_A}(pid {pid})" in table
        assert f"SELECT pg_terminate_backend({pid})" in table
        assert row_states(tenancy.admin, "sq") == {"scheduled": SQ_ROWS}  # nobody leads B
        # The runbook's fix: an admin ends the session; B leads again, every row fires once.
        fetch(tenancy.admin, "SELECT pg_terminate_backend(%s)", pid)
        tenancy.team_b.wait_leader(timeout=30)
        wait_published(tenancy.admin, "sq", SQ_ROWS, timeout=60)
    finally:
        squatter.close()
    uids = [e["uid"] for e in tenancy.team_b.receiver.entries()]
    assert sorted(u for u in uids if u.startswith("sq-")) == [f"sq-{i}" for i in range(SQ_ROWS)]
    assert sorted(u for u in uids if u.startswith("b-")) == sorted(f"b-{i}" for i in range(B_ROWS))
    for sidecar in team_b:

        def ready(s: SidecarProcess = sidecar) -> bool:
            return _readyz(s) == (200, "ok")

        wait_for(
            ready,
            timeout=30,
            what=f"{sidecar.name}'s /readyz back to ok",
        )
        assert _foreign_gauge(sidecar) == 0
    gone = list(records(leader_b.log_text(), Event.LOCK_FOREIGN_HOLDER_GONE))
    assert gone and (gone[-1]["role"], gone[-1]["pid"]) == (ROLE_A, pid)
    assert _status(tenancy.admin)["foreignHolder"] is None
