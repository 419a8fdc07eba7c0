"""The PostgreSQL test bed is real: locks block, backends can be terminated, databases are private."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

from testbed.pg_fixtures import PostgresService
from testbed.sidecars import REPO, wait_for


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


def test_a_server_whose_owner_dies_is_stopped_and_removed(tmp_path: Path) -> None:
    """A pytest killed mid-run (or piped into ``head``) never stops its servers: the guard
    beside each postmaster ends it and removes its data once the owner is gone."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path / "pg")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    postmaster, data = owner.stdout.readline().split()
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    wait_for(lambda: not _alive(int(postmaster)), 20, what="the orphaned postmaster to end")
    wait_for(lambda: not Path(data).exists(), 10, what="its data directory removed")


OWNER = """
import sys, time
from pathlib import Path
from testbed.pg import PostgresServer, server_dir
server = PostgresServer(Path(sys.argv[1]))
server.start()
print(server.process.pid, server_dir(server.workdir), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone too: the postmaster's parent (the dead owner) is no longer there to
    # reap it, init does.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"
