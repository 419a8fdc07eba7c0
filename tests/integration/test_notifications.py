"""Garbage on every channel schedlock listens to, against a real PostgreSQL.

Any role that can connect may NOTIFY ``schedlock_rows`` and ``schedlock_outcomes`` with any
text up to 8,000 bytes; a ``SQL_ASCII`` database even passes bytes that decode in no encoding
(psycopg then raises ``UnicodeDecodeError`` while reading them, also in the middle of another
statement on the listening connection).  None of it may stop a loop: the store hands such a
payload on as bytes (the parsers of ``schedlock.store.notices`` read them), the leader's lock
session keeps working, and a running sidecar keeps firing.  (The operator's side, with its
status sync: ``tests/e2e/test_operator_notifications.py``.)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from schedlock.core.logs import Event, records
from schedlock.store import Channel, GrantRequest, open_store
from schedlock.store.postgres import QuietConnection, _undecodable_notifications
from testbed.pg_fixtures import OPERATOR_ROLE, SIDECAR_ROLE, PostgresService, with_dbname
from testbed.rows import insert_rows, wait_published
from testbed.sidecars import SidecarGroup

# What an attacker sends as text (pg_notify takes text): oversize-ish, non-finite numbers,
# ids outside bigint, wrong shapes, deep nesting, a digit string beyond Python's int limit.
TEXT_GARBAGE = [
    "x" * 7000,
    '{"ids":[1e999]}',
    '{"ids":[NaN]}',
    '{"ids":[9223372036854775808, -1, "7", true]}',
    '{"ids":' + "9" * 7000 + "}",
    '{"ids":{"a":1}}',
    "[" * 3900 + "]" * 3900,
    "publish/default",
    "publish//demo",
    "",
]
# Bytes that are no UTF-8 (and no ASCII): only a SQL_ASCII database lets them through (a UTF-8
# one refuses them at the NOTIFY; schedlock itself cannot run on SQL_ASCII — psycopg returns
# its text as bytes — but its listeners must not break on them).
BYTE_GARBAGE = ["E'\\\\xff\\\\xfe'", "E'{\"ids\":[1]}\\\\xc3'", "E'publish/default/demo\\\\x80'"]


def notify_text(url: str, payloads: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for channel in Channel:
            for payload in payloads:
                conn.execute("SELECT pg_notify(%s, %s)", (str(channel), payload))


def notify_bytes(url: str, literals: list[str]) -> None:
    """NOTIFY with string literals spelled in SQL (E'\\xff' makes raw bytes in SQL_ASCII)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for channel in Channel:
            for literal in literals:
                conn.execute(f"NOTIFY {channel}, {literal.replace(chr(92) * 2, chr(92))}")


@pytest.fixture
def sql_ascii_database(postgres: PostgresService) -> Iterator[str]:
    """A migrated database in SQL_ASCII (the server validates no encoding there)."""
    name = f"ascii_{id(postgres)}_{threading.get_ident()}"
    postgres.execute(
        f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'SQL_ASCII' "
        "LC_COLLATE 'C' LC_CTYPE 'C'"
    )
    url = with_dbname(postgres.admin_url, name)
    for role in (SIDECAR_ROLE, OPERATOR_ROLE):
        if not postgres.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", role):
            postgres.execute(f'CREATE ROLE "{role}" LOGIN')

    async def migrate() -> None:
        store = open_store(url)
        try:
            await store.migrate()
            await store.grant(GrantRequest(sidecar_role=SIDECAR_ROLE, operator_role=OPERATOR_ROLE))
        finally:
            await store.close()

    asyncio.run(migrate())
    yield url
    postgres.drop_database(url)


def test_the_store_hands_undecodable_payloads_on_as_bytes_and_keeps_listening(
    sql_ascii_database: str,
) -> None:
    got: list[str | bytes] = []

    async def body() -> None:
        store = open_store(sql_ascii_database)
        ready = asyncio.Event()
        listener = asyncio.create_task(store.listen(Channel.OUTCOMES, got.append, ready))
        try:
            await asyncio.wait_for(ready.wait(), 10)
            await asyncio.to_thread(notify_bytes, sql_ascii_database, BYTE_GARBAGE[:1])
            await asyncio.to_thread(notify_text, sql_ascii_database, ['{"ids":[1]}'])
            async with asyncio.timeout(10):
                while '{"ids":[1]}' not in got:
                    assert not listener.done(), listener
                    await asyncio.sleep(0.05)
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            await store.close()

    asyncio.run(body())
    assert got == [b"\xff\xfe", '{"ids":[1]}'], "the bytes handed on, the next one as text"


def test_statements_on_a_listening_connection_survive_undecodable_notifications(
    sql_ascii_database: str,
) -> None:
    """Before: a notification psycopg could not decode, arriving during a statement on a
    listening connection (a leader's lock session), made that statement raise
    UnicodeDecodeError and left the connection out of step."""
    undecodable: list[bytes] = []

    async def body() -> None:
        conn = await QuietConnection.connect(
            sql_ascii_database, autocommit=True, row_factory=dict_row
        )  # a session's connection class, as the store opens it
        try:
            _undecodable_notifications(conn, undecodable.append)
            await conn.execute("LISTEN schedlock_rows")
            for _ in range(3):
                await asyncio.to_thread(notify_bytes, sql_ascii_database, BYTE_GARBAGE)
                await conn.execute("SELECT pg_sleep(0.1)")  # the notifications arrive meanwhile
            await asyncio.to_thread(notify_text, sql_ascii_database, ["publish/default/demo"])
            await conn.execute("SELECT pg_sleep(0.1)")
            async with asyncio.timeout(10):
                async for note in conn.notifies():
                    assert note.payload == "publish/default/demo"
                    break
        finally:
            await conn.close()

    asyncio.run(body())
    assert undecodable == [b"\xff\xfe", b'{"ids":[1]}\xc3', b"publish/default/demo\x80"] * 3


def test_a_running_sidecar_keeps_firing_through_garbage_notifications(
    tmp_path: Path, migrated_database: str
) -> None:
    url = migrated_database
    group = SidecarGroup(tmp_path, url, replicas=1).start()
    try:
        sidecar = group.wait_leader()
        insert_rows(url, 20, start_in=3, spacing=0.1, prefix="good")
        for _ in range(3):
            notify_text(url, TEXT_GARBAGE)
        wait_published(url, "good", 20, timeout=30)
        # and after the garbage, a row due now still fires at once (its NOTIFY wakes the leader)
        insert_rows(url, 1, start_in=0, prefix="after")
        wait_published(url, "after", 1, timeout=10)
        assert sidecar.alive() and sidecar.ready()
    finally:
        group.stop()
    log = sidecar.log_text()
    failed = list(records(log, Event.TASK_FAILED, Event.SIDECAR_FATAL))
    assert failed == [], failed
    assert "Traceback" not in log and "UnicodeDecodeError" not in log
