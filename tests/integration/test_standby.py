"""A real streaming standby: never led or written on, found through a multi-host URL, promoted.

Advisory locks are granted on a hot standby too, so a sidecar connected there could believe it
leads.  Every session the store opens checks ``pg_is_in_recovery()`` and the read-only settings
first; these tests point real stores and real sidecar processes at a real standby made with
``pg_basebackup -R`` from a real primary, then promote it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from schedlock.store import LockKey, PublishSpec, ReadOnlyServer, open_store
from schedlock.store.postgres import read_only_reason
from testbed.pg import PostgresServer, replicate_from, wait_streaming
from testbed.sidecars import (
    ReceiverProcess,
    SidecarProcess,
    http_get,
    stand_in_app_url,
    wait_for,
)

DB = "standby_test"


@dataclass
class Pair:
    primary: PostgresServer
    standby: PostgresServer

    def url(self, server: PostgresServer) -> str:
        return server.url(DB)

    @property
    def multi_host_url(self) -> str:
        """Standby first: libpq skips it because of target_session_attrs=read-write."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.standby.port},127.0.0.1:{self.primary.port}"
            f"/{DB}?target_session_attrs=read-write&connect_timeout=2"
        )


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    primary = PostgresServer(tmp_path / "primary", settings={"synchronous_commit": "on"})
    primary.start()
    primary.psql(f'CREATE DATABASE "{DB}"')

    async def migrate() -> None:
        store = open_store(primary.url(DB))
        await store.migrate()
        await store.close()

    asyncio.run(migrate())
    standby = replicate_from(primary, PostgresServer(tmp_path / "standby"))
    standby.start()
    wait_streaming(primary, "standby")
    try:
        yield Pair(primary, standby)
    finally:
        standby.destroy()
        primary.destroy()


def spec(uid: str) -> PublishSpec:
    return PublishSpec(
        namespace="default",
        name=uid,
        uid=uid,
        target="demo",
        due_at=datetime.now(UTC) + timedelta(hours=1),
    )


def test_the_reason_names_the_server_and_the_setting() -> None:
    assert (
        read_only_reason("db:5432", in_recovery=False, default_read_only="off", read_only="off")
        is None
    )
    standby = read_only_reason("db:5432", in_recovery=True, default_read_only="off", read_only="on")
    assert standby is not None and "server db:5432 is a standby" in standby
    assert "target_session_attrs=read-write" in standby
    read_only = read_only_reason(
        "db:5432", in_recovery=False, default_read_only="on", read_only="on"
    )
    assert read_only is not None and "default_transaction_read_only is on" in read_only
    assert "\n" not in standby + read_only  # one line, for /readyz


def test_no_store_session_opens_on_a_standby(pair: Pair) -> None:
    async def scenario() -> None:
        store = open_store(pair.url(pair.standby), application_name="on-standby")
        for verb in (
            store.schema_status(),
            store.upsert_publish(spec("a")),
            store.lock_session(LockKey("publish", "default", "demo"), "h", 10).connect(),
        ):
            with pytest.raises(ReadOnlyServer, match=f"127.0.0.1:{pair.standby.port} is a standby"):
                await verb
        await store.close()

        # A multi-host URL lands on the primary whatever the order: libpq's own mechanism.
        multi = open_store(pair.multi_host_url, application_name="multi")
        assert (await multi.upsert_publish(spec("b"))).inserted
        session = multi.lock_session(LockKey("publish", "default", "demo"), "h", 10)
        await session.connect()
        await session.acquire()
        assert (await session.begin_term()).term == 1
        await session.release(1)
        await multi.close()

    asyncio.run(scenario())
    assert pair.primary.psql("SELECT count(*) FROM schedlock_publishes", DB) == "1"


def sidecar(tmp_path: Path, name: str, url: str, target_url: str) -> SidecarProcess:
    return SidecarProcess.for_app(
        name,
        tmp_path / "sidecars",
        url,
        target_url,
        SCHEDLOCK_MIGRATE="off",
        SCHEDLOCK_LEASE_SECONDS="3",
        SCHEDLOCK_HEARTBEAT_SECONDS="0.8",
    ).start()


READ_ONLY = "the server is read-only or a standby"  # /readyz's words: it never names the server


def never_leads_while(process: SidecarProcess, seconds: float, detail: str) -> None:
    """Not ready and schedlock_leader 0 for ``seconds``: /readyz says why in words that name
    no server (anyone who reaches the pod reads it), the log has the ``detail``."""
    deadline = time.monotonic() + seconds
    seen_reason = False
    while time.monotonic() < deadline:
        assert process.alive(), process.log_text()[-3000:]
        status, body = http_get(process.url("/readyz"))
        if status:
            assert status == 503, body
            assert "127.0.0.1" not in body, body
            seen_reason = seen_reason or READ_ONLY in body
        leader = [v for k, v in process.metrics().items() if k.startswith("schedlock_leader{")]
        assert all(v == 0 for v in leader), process.metrics()
        time.sleep(0.2)
    assert seen_reason, http_get(process.url("/readyz"))
    assert detail in process.log_text(), process.log_text()[-3000:]


def test_a_sidecar_on_a_hot_standby_stays_not_ready_and_never_leads_until_promoted(
    tmp_path: Path, pair: Pair
) -> None:
    process = sidecar(tmp_path, "on-standby", pair.url(pair.standby), stand_in_app_url())
    try:
        wait_for(lambda: http_get(process.url("/readyz"))[0] == 503, 20, what="/readyz 503")
        never_leads_while(process, 6, f"server 127.0.0.1:{pair.standby.port} is a standby")
        _, reason = http_get(process.url("/readyz"))
        assert reason.count("\n") <= 1, reason
        # A fail-over: the standby is promoted, the same sidecar leads it without a restart.
        pair.primary.stop("immediate")
        pair.standby.promote()
        wait_for(process.leads, 30, interval=0.1, what="the sidecar to lead the promoted server")
        assert process.ready()
    finally:
        process.stop()


def test_fail_over_on_a_multi_host_url_and_the_old_primary_back_read_only(
    tmp_path: Path, pair: Pair
) -> None:
    receiver = ReceiverProcess(tmp_path / "receiver").start()
    on_multi = sidecar(tmp_path, "multi", pair.multi_host_url, receiver.url)
    on_old = None
    try:
        on_multi.wait_ready(30)
        wait_for(on_multi.leads, 20, interval=0.1, what="a leader on the primary")
        # Kill the primary, promote the standby: the multi-host sidecar finds the new primary.
        killed = time.monotonic()
        pair.primary.stop("immediate")
        pair.standby.promote()
        wait_for(
            lambda: (
                on_multi.metrics().get(
                    'schedlock_leadership_transitions_total{direction="acquired",namespace="default",'
                    'scheduler="publish",target="demo"}',
                    0,
                )
                >= 2
            ),
            30,
            interval=0.05,
            what="a second term on the promoted server",
        )
        takeover = time.monotonic() - killed
        print(f"takeover after kill + promote: {takeover:.2f} s")
        assert on_multi.leads()
        # The old primary comes back read-only: a sidecar pointed at it never leads it.
        pair.primary.settings = {**pair.primary.settings, "default_transaction_read_only": "on"}
        pair.primary.start()
        on_old = sidecar(tmp_path, "on-old", pair.url(pair.primary), receiver.url)
        never_leads_while(on_old, 6, f"server 127.0.0.1:{pair.primary.port} is read-only")
        assert on_multi.leads()
    finally:
        for process in (on_multi, on_old):
            if process is not None:
                process.stop()
        receiver.stop()
