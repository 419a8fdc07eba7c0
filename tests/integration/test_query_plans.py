"""The hot-path queries' plans on a table with history: live-row indexes, no scan of history.

A long-lived installation keeps millions of finished rows (issue 19: the heartbeat took 1.3 s
and `schedlock status` 18 minutes on 5 M of them).  Each query a leader, the operator or
`schedlock status` runs often must read only live rows (a partial index) or probe one end of
an index, whatever the history.  The test loads 200,000 finished rows and a few live ones,
captures the exact named query and parameters each store verb sends (the verb runs, its
session records and stops), and asserts the plan PostgreSQL makes for it: the expected index,
and no sequential scan of schedlock_publishes.  A plan regression fails here.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from schedlock.store import Completion, GrantRequest, LockKey, open_store
from schedlock.store.postgres import CODEC, PostgresConnector, PostgresSession, Q
from schedlock.store.rows import Params, Row
from schedlock.store.verbs import LockVerbs, SqlStore
from testbed.pg_fixtures import PostgresService

PUBLISH = LockKey("publish", "default", "demo")
RECURRING = LockKey("recurring", "default", "demo")
HISTORY = 200_000
SCHEDULE_UID = "history-schedule"
SCOPED_ROLE = "schedlock_plans_default"
TERM = 3


class Captured(Exception):
    """A verb's query, stopped before it reached a database."""

    def __init__(self, name: str, params: Params) -> None:
        super().__init__(name)
        self.name = name
        self.params = params


class CapturingSession(PostgresSession):
    """A session with no connection: its first query is captured, and ends the verb."""

    def __init__(self) -> None:
        pass  # no connection to keep

    async def fetch(self, name: str, params: Params) -> list[Row]:
        raise Captured(name, params)

    async def execute(self, name: str, params: Params) -> int:
        raise Captured(name, params)


class CapturingLockVerbs(LockVerbs):
    """The lock session's verbs, whose statements go to a CapturingSession."""

    def __init__(self, key: LockKey) -> None:
        self.key, self.holder, self.codec = key, "plan-test", CODEC
        self.session = CapturingSession()

    async def _fetch(self, name: str, params: Params) -> list[Row]:
        return await self.session.fetch(name, params)

    async def _execute(self, name: str, params: Params) -> int:
        return await self.session.execute(name, params)


class CapturingConnector(PostgresConnector):
    """The PostgreSQL connector, whose sessions capture the query instead of running it."""

    def __init__(self) -> None:
        super().__init__("postgresql://capture", application_name="plan-test")

    @asynccontextmanager
    async def session(self) -> AsyncIterator[PostgresSession]:
        yield CapturingSession()


def captured(verb: Callable[[], Coroutine[Any, Any, object]]) -> Captured:
    try:
        asyncio.run(verb())
    except Captured as query:
        return query
    raise AssertionError("the verb ran no query")


LOCK = CapturingLockVerbs(PUBLISH)
SLOTS = CapturingLockVerbs(RECURRING)
STORE = SqlStore(CapturingConnector())

CLAIM, FIRING = "schedlock_publishes_claim", "schedlock_publishes_firing"
UNFIRED, BY_SCHEDULE = "schedlock_publishes_unfired_slots", "schedlock_publishes_schedule"
PKEY = "schedlock_publishes_pkey"
# verb -> the indexes of schedlock_publishes its plan may use: live-row indexes (claim, firing,
# unfired_slots), the primary key for rows named by id, the probe of one schedule's latest slot.
HOT_PATH: dict[str, tuple[Callable[[], Coroutine[Any, Any, object]], set[str]]] = {
    "heartbeat": (lambda: LOCK.heartbeat(TERM), {CLAIM, FIRING}),
    "heartbeat_recurring": (lambda: SLOTS.heartbeat(TERM), {CLAIM, FIRING}),
    "claim_due": (lambda: LOCK.claim_due(TERM, 10), {CLAIM, PKEY}),
    "next_due": (lambda: LOCK.claim_due(TERM, 0), {CLAIM}),
    "complete": (
        lambda: LOCK.complete(TERM, [Completion(id=1, outcome="published", status=200)]),
        {PKEY, FIRING},
    ),
    "adopt_orphans": (lambda: LOCK.adopt_orphans(TERM), {FIRING}),
    "key_status": (STORE.key_status, {CLAIM, FIRING}),
    "latest_slot": (lambda: STORE.latest_slot(SCHEDULE_UID), {BY_SCHEDULE}),
    "cancel_schedule": (lambda: STORE.cancel_schedule(SCHEDULE_UID), {UNFIRED}),
}

# Read the latest row of an index range: a join that sorted every slot of the schedule would
# also use the index (212 ms at 10,000 slots, measured), so the plan's shape is asserted too.
PROBES = {"latest_slot"}

LOAD = """
INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, lock_objid, term, holder)
VALUES ('publish', 'default', 'demo', 11, 12, %(term)s, 'plan-test'),
       ('recurring', 'default', 'demo', 11, 13, %(term)s, 'plan-test');
INSERT INTO schedlock_schedules (namespace, name, uid, target, expression)
SELECT 'default', 'history', CASE WHEN n = 1 THEN %(schedule_uid)s ELSE 'other-' || n END,
       'demo', '@every 10s'
FROM generate_series(1, %(schedules)s) AS n;
-- The history: one-shot rows and recurring slots of the schedules, every finished state (most
-- published), ten seconds apart over the past weeks, as the store leaves them.
INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, schedule_id, target, due_at,
                                 next_attempt_at, state, attempts, term, holder, last_status,
                                 fired_at, finished_at, created_at, updated_at)
SELECT CASE WHEN g %% 2 = 0 THEN 'recurring' ELSE 'publish' END, 'default', 'history',
       'history-' || g, CASE WHEN g %% 2 = 0 THEN s.first + g / 2 %% %(schedules)s END,
       'demo', t, t,
       CASE WHEN g %% 50 = 0 THEN 'failed' WHEN g %% 50 = 1 THEN 'missed'
            WHEN g %% 50 = 2 THEN 'cancelled' ELSE 'published' END,
       1, 1, 'plan-test', 200, t, t + interval '1 second', t, t + interval '1 second'
FROM generate_series(1, %(history)s) AS g,
     LATERAL (SELECT now() - interval '30 days' + g * interval '10 seconds' AS t) AS at,
     (SELECT min(id) AS first FROM schedlock_schedules) AS s;
-- A few live rows of each key: due, later, firing, suspended (one-shots only).
INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, schedule_id, target, due_at,
                                 next_attempt_at, state, attempts, term, holder)
SELECT k.scheduler, 'default', 'live', 'live-' || k.scheduler || '-' || g,
       CASE WHEN k.scheduler = 'recurring' THEN s.id END, 'demo',
       now() + (g - 6) * interval '1 minute', now() + (g - 6) * interval '1 minute',
       CASE WHEN g <= 3 THEN 'firing'
            WHEN g = 12 AND k.scheduler = 'publish' THEN 'suspended' ELSE 'scheduled' END,
       CASE WHEN g <= 3 THEN 1 ELSE 0 END, CASE WHEN g <= 3 THEN %(term)s END,
       CASE WHEN g <= 3 THEN 'plan-test' END
FROM generate_series(1, 12) AS g, (VALUES ('publish'), ('recurring')) AS k(scheduler),
     (SELECT id FROM schedlock_schedules WHERE uid = %(schedule_uid)s) AS s;
"""


@pytest.fixture(scope="module")
def history(postgres: PostgresService, migrated_template: str) -> Iterator[str]:
    """A migrated database with HISTORY finished rows and 24 live ones, analysed."""
    url = postgres.create_database(template=migrated_template)
    with psycopg.connect(url, autocommit=True) as conn:
        params = {"term": TERM, "schedule_uid": SCHEDULE_UID, "history": HISTORY, "schedules": 50}
        with conn.transaction():
            for statement in filter(str.strip, LOAD.split(";\n")):
                conn.execute(statement, params)
        conn.execute("VACUUM ANALYZE schedlock_publishes")
        conn.execute("ANALYZE")
    yield url
    postgres.drop_database(url)


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def explain(url: str, name: str, params: Params, role: str | None = None) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        if role is not None:  # planned as that role: with its row-level security policies
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        row = conn.execute(
            f"EXPLAIN (VERBOSE, FORMAT JSON) {Q[name]}", CODEC.encode(params)
        ).fetchone()
        conn.rollback()
    assert row is not None
    document = row[0] if isinstance(row[0], list) else json.loads(row[0])
    plan: dict[str, Any] = document[0]["Plan"]
    return plan


def indexes_of_publishes(plan: dict[str, Any]) -> set[str]:
    return {
        node["Index Name"]
        for node in plan_nodes(plan)
        if node.get("Index Name", "").startswith("schedlock_publishes_")
    }


def scans_of_history(plan: dict[str, Any]) -> list[str]:
    return [
        node["Node Type"]
        for node in plan_nodes(plan)
        if node.get("Relation Name") == "schedlock_publishes"
        and node["Node Type"] in ("Seq Scan", "Sample Scan", "Tid Range Scan")
    ]


def test_the_history_is_loaded(history: str) -> None:
    with psycopg.connect(history) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state IN ('published', 'failed', 'missed', "
            "'cancelled')), count(*) FILTER (WHERE state IN ('scheduled', 'firing', "
            "'suspended')) FROM schedlock_publishes"
        ).fetchone()
    assert row == (HISTORY, 24)


@pytest.fixture(scope="module")
def scoped_role(postgres: PostgresService, history: str) -> str:
    """A runtime role that may serve the history's namespace only (migration 0008): its
    statements carry its row-level security policies, constants (migration 0011)."""
    exists = postgres.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", SCOPED_ROLE)
    if not exists:
        postgres.execute(f'CREATE ROLE "{SCOPED_ROLE}" LOGIN')
    store = open_store(history)
    # Both components' grants: it plans the sidecar's verbs and the operator's (cancel_schedule
    # writes a schedule's state, a column no sidecar may write since migration 0010).
    grant = store.grant(
        GrantRequest(sidecar_role=SCOPED_ROLE, operator_role=SCOPED_ROLE, namespaces=("default",))
    )
    asyncio.run(grant)
    policies = postgres.execute(
        "SELECT polrelid::regclass::text, pg_get_expr(polqual, polrelid) FROM pg_policy "
        "WHERE polroles = ARRAY[%s::regrole::oid]",
        SCOPED_ROLE,
        url=history,
    )
    tables = ("schedlock_publishes", "schedlock_reserves", "schedlock_schedules", "schedlock_terms")
    assert sorted(policies) == [(table, "(namespace = 'default'::text)") for table in tables]
    return SCOPED_ROLE


@pytest.mark.parametrize("as_role", [False, True], ids=["owner", "namespace-role"])
@pytest.mark.parametrize("verb", sorted(HOT_PATH))
def test_hot_path_query_reads_only_live_rows(
    history: str, scoped_role: str, verb: str, as_role: bool
) -> None:
    call, allowed = HOT_PATH[verb]
    query = captured(call)
    plan = explain(history, query.name, query.params, scoped_role if as_role else None)
    assert not scans_of_history(plan), (query.name, json.dumps(plan, indent=1))
    used = indexes_of_publishes(plan)
    assert used and used <= allowed, (query.name, used)
    if as_role:  # the role's own policies (migration 0011): constants, no function to run
        assert "_namespaces(" not in json.dumps(plan)  # 0008's schedlock_served_namespaces()
    if verb in PROBES:  # one end of the index, in its order: nothing sorts the history
        nodes = list(plan_nodes(plan))
        assert not [n for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")], plan
        assert any(n.get("Scan Direction") == "Backward" for n in nodes), plan


def test_deleting_a_schedule_cascades_through_its_index(history: str) -> None:
    """The ON DELETE CASCADE's own statement (as the foreign key's trigger plans it, generic)."""
    with psycopg.connect(history) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(
            "PREPARE cascade (bigint) AS "
            "DELETE FROM ONLY schedlock_publishes WHERE $1 OPERATOR(pg_catalog.=) schedule_id"
        )
        row = conn.execute("EXPLAIN (FORMAT JSON) EXECUTE cascade (1)").fetchone()
        conn.rollback()
    assert row is not None
    plan = row[0][0]["Plan"]
    assert not scans_of_history(plan)
    assert indexes_of_publishes(plan) == {BY_SCHEDULE}


def test_key_status_answers_the_same_on_live_rows(history: str) -> None:
    """The rewritten backlog counts what the old one did: due scheduled plus firing rows."""

    async def run() -> list[Any]:
        store = open_store(history)
        try:
            return await store.key_status()
        finally:
            await store.close()

    keys = {k.scheduler: k for k in asyncio.run(run())}
    for scheduler in ("publish", "recurring"):
        assert keys[scheduler].backlog == 6  # 3 firing, 3 scheduled and due (of 12 live)
        next_due = keys[scheduler].next_due
        assert next_due is not None and next_due < datetime.now(UTC)


def hot_updates(url: str) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relname = 'schedlock_terms'"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_heartbeats_are_hot_updates_on_full_pages(migrated_database: str) -> None:
    """Migration 0004's fillfactor: 300 keys fill several pages, and the first heartbeat of
    each (the store's own query) still finds room on its page for a HOT update."""
    keys = [LockKey("publish", "default", f"app-{n}") for n in range(300)]
    with psycopg.connect(migrated_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, "
            "lock_objid, term, holder) SELECT 'publish', 'default', 'app-' || n, 21, n, %s, "
            "'a-holder-name-as-long-as-a-pod-name-7d9f8c6b5-x2x4z' FROM generate_series(0, 299) n",
            (TERM,),
        )
        pages = conn.execute(
            "SELECT pg_relation_size('schedlock_terms') / current_setting('block_size')::int"
        ).fetchone()
        assert pages is not None and pages[0] >= 3
        for key in keys:
            query = captured(functools.partial(CapturingLockVerbs(key).heartbeat, TERM))
            assert conn.execute(Q[query.name], CODEC.encode(query.params)).fetchone()
    deadline = time.monotonic() + 15
    while hot_updates(migrated_database)[0] < len(keys) and time.monotonic() < deadline:
        time.sleep(0.2)  # the statistics reach the view when the backend reports them
    updated, hot = hot_updates(migrated_database)
    assert updated == len(keys) and hot == updated
