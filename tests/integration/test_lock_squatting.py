"""Lock squatting seen by the store (migration 0009): a session of a role that may not serve a
key's namespace holding the key's advisory lock is named, with its backend pid, to the key's
waiting standby (a notice while its one ``lock`` statement runs) and to ``key_status()`` —
never a session of a role that serves the namespace.  Real PostgreSQL, real roles.

The whole story with real sidecars and passwords is in test_compromised_pod.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg
import pytest

from schedlock.store import (
    LEADER_CLASS_ID,
    ForeignHolder,
    GrantRequest,
    KeyStatus,
    LockKey,
    LockSession,
    Store,
    TargetLock,
    open_store,
)
from testbed.pg_fixtures import OPERATOR_ROLE, SIDECAR_ROLE, PostgresService, as_role

KEY = LockKey("publish", "team-b", "demo")
OTHER = LockKey("recurring", "team-b", "demo")
TARGET = TargetLock((KEY, OTHER))  # B's sidecars: one session for both keys
SQUATTER = "squatter_a"  # a sidecar role of namespace team-a only
B_OPERATOR = "operator_b"  # an operator role scoped to namespace team-b


@pytest.fixture
def squatted(migrated_database: str, postgres: PostgresService) -> str:
    for role in (SQUATTER, B_OPERATOR):
        if not postgres.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", role):
            postgres.execute(f'CREATE ROLE "{role}" LOGIN')
    store = open_store(migrated_database)

    async def grant() -> None:
        await store.grant(
            GrantRequest(sidecar_role=SQUATTER, operator_role=None, namespaces=("team-a",))
        )
        await store.grant(
            GrantRequest(sidecar_role=None, operator_role=B_OPERATOR, namespaces=("team-b",))
        )
        # B's key is registered by B's sidecar (the all-namespace role of the template)
        sidecar, session = await b_sidecar(migrated_database, "b")
        await session.close()
        await sidecar.close()
        await store.close()

    asyncio.run(grant())
    return migrated_database


async def b_sidecar(url: str, holder: str) -> tuple[Store, LockSession]:
    """B's sidecar named ``holder`` (the all-namespace sidecar role of the template): its store
    and its target session for both of B's keys, connected, holding no lock yet."""
    store = open_store(as_role(url, SIDECAR_ROLE))
    session = store.lock_session(KEY, holder, 15, TARGET)
    await session.connect()
    return store, session


def hold_by_hand(
    url: str, role: str, lock: LockKey | TargetLock = KEY
) -> psycopg.Connection[tuple[object, ...]]:
    """A session of ``role`` holding ``lock``, as `SELECT pg_advisory_lock(…)` by hand."""
    conn = psycopg.connect(as_role(url, role), autocommit=True)
    conn.execute("SELECT pg_advisory_lock(%s, %s)", (lock.classid, lock.objid))
    return conn


async def waiting_until_told(
    standby: LockSession, heard: list[ForeignHolder | None]
) -> asyncio.Task[None]:
    """The standby waiting for its lock, once its wait has said what it heard of the holder
    (into ``heard``; within a slice or two of the wait)."""
    told = asyncio.Event()

    def on_holder(holder: ForeignHolder | None) -> None:
        heard.append(holder)
        told.set()

    waiting = asyncio.create_task(standby.acquire(on_holder))
    await asyncio.wait_for(told.wait(), 15)
    return waiting


def run_then_close(
    main: Callable[[], Coroutine[Any, Any, None]], held: psycopg.Connection[tuple[object, ...]]
) -> None:
    """Run ``main`` to its end, then close the session ``held`` holding a lock by hand,
    whatever happened."""
    try:
        asyncio.run(main())
    finally:
        held.close()


def backend_pid(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    return conn.info.backend_pid


async def publish_status(url: str) -> KeyStatus:
    """`schedlock status`'s line for B's publish key, as the role of ``url`` sees it."""
    store = open_store(url)
    try:
        (status,) = [
            k
            for k in await store.key_status()
            if k.namespace == "team-b" and k.scheduler == "publish"
        ]
    finally:
        await store.close()
    return status


async def granted_once_ended(
    postgres: PostgresService, pid: int, waiting: asyncio.Task[None], standby: LockSession
) -> None:
    """An admin ends the squatting session ``pid``: the standby waiting is granted the lock at
    once (and lets it go)."""
    assert postgres.terminate_backend(pid)
    await asyncio.wait_for(waiting, 15)
    await standby.release(None)


def test_a_waiting_standby_hears_of_a_foreign_holder_and_status_names_it(
    squatted: str, postgres: PostgresService
) -> None:
    squatter = hold_by_hand(squatted, SQUATTER)
    pid = backend_pid(squatter)
    heard: list[ForeignHolder | None] = []

    async def run() -> None:
        standby = open_store(as_role(squatted, SIDECAR_ROLE)).lock_session(KEY, "b-standby", 15)
        await standby.connect()
        waiting = await waiting_until_told(standby, heard)
        assert heard == [ForeignHolder(pid=pid, role=SQUATTER)]
        assert not waiting.done()
        # The admin's status and a role scoped to team-b both name the holder.
        for url in (squatted, as_role(squatted, B_OPERATOR)):
            status = await publish_status(url)
            assert (status.foreign_holder_role, status.foreign_holder_pid) == (SQUATTER, pid)
        await granted_once_ended(postgres, pid, waiting, standby)
        await standby.close()

    run_then_close(run, squatter)
    assert heard == [ForeignHolder(pid=pid, role=SQUATTER)]  # said once, not every slice


def test_a_leader_trying_a_squatted_key_hears_of_the_holder_and_leads_the_other_key(
    squatted: str, postgres: PostgresService
) -> None:
    """B's target session holds the leadership lock; the squatter holds the publish key's own
    lock: taking that key gives nothing and names the holder, the recurring key is taken on
    the same session, and the publish key is taken once an admin ends the squatter."""
    squatter = hold_by_hand(squatted, SQUATTER)
    pid = backend_pid(squatter)
    heard: list[ForeignHolder | None] = []

    async def run() -> None:
        store, leader = await b_sidecar(squatted, "b-leader")
        assert await leader.take_standby_place(1) == 0
        await leader.acquire(heard.append)
        await leader.leave_standby_place()
        assert await leader.lock_key(KEY, heard.append) is None
        assert heard == [ForeignHolder(pid=pid, role=SQUATTER)]
        recurring = await leader.lock_key(OTHER, heard.append)
        assert recurring is not None and recurring.key == OTHER
        assert (await recurring.begin_term()).term >= 1
        (status,) = [k for k in await store.key_status() if k.scheduler == "publish"]
        assert (status.foreign_holder_role, status.foreign_holder_pid) == (SQUATTER, pid)
        assert postgres.terminate_backend(pid)
        publish = None
        for _ in range(50):
            publish = await leader.lock_key(KEY, heard.append)
            if publish is not None:
                break
            await asyncio.sleep(0.1)
        assert publish is not None
        assert heard[-1] is None  # the holder is gone: said once
        # One server session holds the leadership lock and both keys' locks.
        held = postgres.execute(
            "SELECT count(DISTINCT pid), count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND granted AND pid = ANY(%s) AND classid::int IN (%s, %s)",
            postgres.backends(squatted, application_name="b-leader"),
            LEADER_CLASS_ID,
            KEY.classid,
        )
        assert held == [(1, 3)], held
        await publish.release(None)
        await recurring.release(None)
        await leader.release(None)
        await store.close()

    run_then_close(run, squatter)


def test_a_standby_waiting_for_a_squatted_leadership_lock_hears_of_it(
    squatted: str, postgres: PostgresService
) -> None:
    """The squatter holds B's target's leadership lock: B's standby hears of it while it waits,
    and `schedlock status` names it for both of B's keys."""
    squatter = hold_by_hand(squatted, SQUATTER, TARGET)
    pid = backend_pid(squatter)
    heard: list[ForeignHolder | None] = []

    async def run() -> None:
        store, standby = await b_sidecar(squatted, "b-standby")
        waiting = await waiting_until_told(standby, heard)
        statuses = [k for k in await store.key_status() if k.namespace == "team-b"]
        assert {k.scheduler for k in statuses} == {"publish", "recurring"}
        for status in statuses:
            assert (status.foreign_holder_role, status.foreign_holder_pid) == (SQUATTER, pid)
            assert status.standbys == ("b-standby",) or status.waiters <= 1
        await granted_once_ended(postgres, pid, waiting, standby)
        await store.close()

    run_then_close(run, squatter)
    assert heard == [ForeignHolder(pid=pid, role=SQUATTER)]


def test_a_holder_that_serves_the_namespace_is_never_foreign(squatted: str) -> None:
    """B's own leader, or a role serving every namespace, holds the lock: nothing is said."""
    honest = hold_by_hand(squatted, SIDECAR_ROLE)
    heard: list[ForeignHolder | None] = []

    async def run() -> None:
        standby = open_store(as_role(squatted, SIDECAR_ROLE)).lock_session(KEY, "b-standby", 15)
        await standby.connect()
        waiting = asyncio.create_task(standby.acquire(heard.append))
        # Wait for 3 slices of the wait to have looked (the server's count of the standby's
        # transactions), then stop waiting.
        for _ in range(100):
            if await _slices_done(squatted, "b-standby") >= 3:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the standby's wait never went through 3 slices")
        honest.close()
        await asyncio.wait_for(waiting, 15)
        status = await publish_status(squatted)
        assert status.foreign_holder_role is None and status.foreign_holder_pid is None
        await standby.close()

    run_then_close(run, honest)
    assert heard == []


async def _slices_done(url: str, application_name: str) -> int:
    """How many times the waiting standby's statement started a new transaction (one per
    slice of its wait): xact_start moves forward at each COMMIT of the DO block."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT extract(epoch FROM xact_start - query_start) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (application_name,),
        )
        row = await cur.fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


def test_the_function_answers_only_a_caller_that_serves_the_namespace(squatted: str) -> None:
    """No role learns another namespace's mapping through it: the squatter asking about B's key
    while holding it hears nothing."""
    squatter = hold_by_hand(squatted, SQUATTER)
    try:
        with psycopg.connect(as_role(squatted, SQUATTER), autocommit=True) as conn:
            asked = conn.execute(
                "SELECT * FROM schedlock_foreign_lock_holder(%s, %s, %s)",
                (KEY.classid, KEY.objid, KEY.namespace),
            ).fetchall()
            assert asked == []
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT schedlock_role_namespaces(%s)", (SIDECAR_ROLE,))
        with psycopg.connect(as_role(squatted, OPERATOR_ROLE), autocommit=True) as conn:
            asked = conn.execute(
                "SELECT role FROM schedlock_foreign_lock_holder(%s, %s, %s)",
                (KEY.classid, KEY.objid, KEY.namespace),
            ).fetchall()
            assert asked == [(SQUATTER,)]  # the all-namespace operator role of the template
    finally:
        squatter.close()
