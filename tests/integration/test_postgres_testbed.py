"""The PostgreSQL test bed is real: locks block, backends can be terminated, databases are private."""

from __future__ import annotations

import threading
import time

import psycopg

from testbed.pg_fixtures import PostgresService


def test_advisory_lock_on_one_connection_blocks_another(
    postgres: PostgresService, database: str
) -> None:
    holder = postgres.connect(database)
    waiter = postgres.connect(database)
    holder.execute("SELECT pg_advisory_lock(42, 7)")
    assert waiter.execute("SELECT pg_try_advisory_lock(42, 7)").fetchone() == (False,)

    granted = threading.Event()

    def wait_for_lock() -> None:
        waiter.execute("SELECT pg_advisory_lock(42, 7)")
        granted.set()

    thread = threading.Thread(target=wait_for_lock)
    thread.start()
    time.sleep(0.3)
    assert not granted.is_set(), "a second session got a held advisory lock"
    holder.close()  # the session ends, the lock goes with it
    assert granted.wait(5), "the waiter was not granted the lock after the holder's session ended"
    thread.join()
    waiter.close()


def test_terminate_backend_ends_the_session(postgres: PostgresService, database: str) -> None:
    victim = postgres.connect(database, application_name="victim")
    pids = postgres.backends(database, application_name="victim")
    assert len(pids) == 1
    assert postgres.terminate_backend(pids[0])
    try:
        victim.execute("SELECT 1")
        raise AssertionError("a terminated backend still answered")
    except psycopg.OperationalError:
        pass
    finally:
        victim.close()


def test_each_test_gets_a_private_database(postgres: PostgresService, database: str) -> None:
    postgres.execute("CREATE TABLE marker (x int)", url=database)
    other = postgres.create_database()
    try:
        rows = postgres.execute("SELECT to_regclass('marker') IS NULL", url=other)
        assert rows == [(True,)]
    finally:
        postgres.drop_database(other)
