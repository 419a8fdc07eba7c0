"""Leadership follows the app, in-process: the hysteresis, what counts as "the app is not there"
versus an HTTP failure, the readiness check, and the elector's states against a fake session."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import pytest
from aiohttp import web

from schedlock.core.httpio import BadAnswer, CannotConnect, Disconnected, HttpClient, TlsFailed
from schedlock.core.settings import SettingError, build, check_url
from schedlock.core.timings import LeaseTimings
from schedlock.sidecar import target
from schedlock.sidecar.delivery import Deliverer, lost_connection
from schedlock.sidecar.lock import Elector, Leadership, Role
from schedlock.sidecar.metrics import SidecarMetrics
from schedlock.sidecar.settings import SidecarSettings
from schedlock.sidecar.target import (
    Check,
    Health,
    TargetWatch,
    Thresholds,
    answer_is_ready,
    derive_check,
    next_check_in,
    probe,
    worth_confirming,
)
from schedlock.store import FireRow
from testbed.memory_store import KEY, MemoryApp, MemorySession, MemoryStore
from testbed.sidecars import sample_value

TWO_TWO = Thresholds(failures=2, successes=2)


# -- the hysteresis (pure) -------------------------------------------------------------------


def run_checks(results: str, thresholds: Thresholds = TWO_TWO) -> str:
    """Feed "+"/"-" check results from the start; the reachability after each ("U"/"d")."""
    health = Health()
    seen = ""
    for result in results:
        health = health.observe(result == "+", thresholds)
        seen += "U" if health.reachable else "d"
    return seen


def test_starts_unreachable_and_needs_the_success_threshold_in_a_row() -> None:
    assert not Health().reachable
    assert run_checks("+") == "d"
    assert run_checks("++") == "dU"
    assert run_checks("+-+") == "ddd", "a failure in between restarts the count"
    assert run_checks("+++", Thresholds(failures=1, successes=3)) == "ddU"


def test_a_reachable_app_needs_the_failure_threshold_in_a_row() -> None:
    assert run_checks("++-") == "dUU"
    assert run_checks("++--") == "dUUd"
    assert run_checks("++-+-+-+") == "dUUUUUUU", "isolated failures never hand over"
    assert run_checks("++-", Thresholds(failures=1, successes=2)) == "dUd"


def test_no_flapping_back_without_the_success_threshold() -> None:
    assert run_checks("++--+-+--++") == "dUUdddddddU"


def test_a_lost_delivery_confirmed_by_a_failed_check_is_unreachable_at_once() -> None:
    health = Health(reachable=True, streak=0)
    assert not health.lost_connection().reachable
    assert health.lost_connection().observe(True, TWO_TWO) == Health(False, 1)


# -- the check (pure parts) ------------------------------------------------------------------


def test_at_start_a_passing_check_is_confirmed_at_once_then_the_interval_holds() -> None:
    """Until the app was first reachable, the hysteresis' next check follows a passing one
    at once; afterwards (and after any failed check) the interval."""
    unreachable = Health()
    assert next_check_in(unreachable, passed=True, interval=1.0, ever_reachable=False) == 0.05
    assert next_check_in(unreachable, passed=False, interval=1.0, ever_reachable=False) == 1.0
    assert next_check_in(Health(True), passed=True, interval=1.0, ever_reachable=True) == 1.0
    # An app back after an outage: the hysteresis against flapping waits the interval.
    assert next_check_in(unreachable, passed=True, interval=1.0, ever_reachable=True) == 1.0
    assert next_check_in(unreachable, passed=True, interval=0.02, ever_reachable=False) == 0.02


async def test_the_watch_confirms_at_start_without_waiting_an_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sidecar next to a listening app: checks at 0 and 0.05 s, reachable, then 1 s apart."""
    import schedlock.sidecar.target as target

    pauses: list[float] = []
    stopping = asyncio.Event()

    async def pause(seconds: float | None, *events: asyncio.Event) -> bool:
        assert seconds is not None
        pauses.append(seconds)
        if len(pauses) == 3:
            stopping.set()
        return stopping.is_set()

    async def there(*_: object) -> None:
        return None

    monkeypatch.setattr(target, "sleep_unless", pause)
    monkeypatch.setattr(target, "probe", there)
    watch = TargetWatch(
        Check("tcp", "tcp://127.0.0.1:1"),
        interval=1.0,
        timeout=1.0,
        thresholds=TWO_TWO,
        metrics=SidecarMetrics(),
    )
    await watch.run(stopping)
    assert pauses == [0.05, 1.0, 1.0]
    assert watch.up


def test_the_default_check_connects_to_the_hook_host_and_port() -> None:
    assert derive_check("http://127.0.0.1:8080/schedlock", "") == Check(
        "tcp", "tcp://127.0.0.1:8080"
    )
    assert derive_check("https://app.local/hook", "").url == "tcp://app.local:443"
    assert derive_check("http://app/hook", "").address == ("app", 80)
    ipv6 = derive_check("http://[::1]:3000/hook", "")
    assert ipv6.url == "tcp://[::1]:3000" and ipv6.address == ("::1", 3000)


def test_a_configured_check_is_used_as_given() -> None:
    assert derive_check("http://127.0.0.1:8080/x", "http://127.0.0.1:8081/ready") == Check(
        "http", "http://127.0.0.1:8081/ready"
    )
    assert derive_check("http://127.0.0.1:8080/x", "tcp://127.0.0.1:9000").address == (
        "127.0.0.1",
        9000,
    )


@pytest.mark.parametrize(("status", "ready"), [(200, True), (204, True), (302, True)])
def test_an_http_check_passes_on_200_to_399(status: int, ready: bool) -> None:
    assert answer_is_ready(status) is ready


@pytest.mark.parametrize("status", [404, 408, 429, 500, 503])
def test_an_http_check_fails_on_any_other_answer(status: int) -> None:
    assert not answer_is_ready(status)


@pytest.mark.parametrize(
    "raw",
    ["http://127.0.0.1:8080/ready", "https://app/healthz", "tcp://127.0.0.1:8080", "tcp://[::1]:1"],
)
def test_check_urls_that_are_accepted(raw: str) -> None:
    assert check_url(raw) == raw


@pytest.mark.parametrize(
    "raw",
    ["tcp://127.0.0.1", "tcp://host:80/path", "ftp://x/y", "127.0.0.1:8080", "http://h:99999/"],
)
def test_check_urls_that_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=r"tcp://host:port"):
        check_url(raw)


def test_settings_defaults_and_a_bad_value() -> None:
    base = {"SCHEDLOCK_DATABASE_URL": "sqlite:///x.db", "SCHEDLOCK_TARGET": "demo"}
    settings = build(SidecarSettings, None, base)
    assert settings.target_ready_url == ""
    assert (settings.target_check_seconds, settings.target_check_timeout) == (1.0, 1.0)
    assert (settings.target_failure_threshold, settings.target_success_threshold) == (2, 2)
    fast = build(SidecarSettings, None, {**base, "SCHEDLOCK_TARGET_CHECK_SECONDS": "0.2"})
    assert fast.target_check_timeout == 1.0, "a check never times out faster than 1 s"
    slow = build(SidecarSettings, None, {**base, "SCHEDLOCK_TARGET_CHECK_SECONDS": "30"})
    assert slow.target_check_timeout == 5.0
    with pytest.raises(SettingError, match="SCHEDLOCK_TARGET_READY_URL"):
        build(SidecarSettings, None, {**base, "SCHEDLOCK_TARGET_READY_URL": "tcp://nohost"})
    with pytest.raises(SettingError, match="SCHEDLOCK_TARGET_SUCCESS_THRESHOLD"):
        build(SidecarSettings, None, {**base, "SCHEDLOCK_TARGET_SUCCESS_THRESHOLD": "0"})


# -- what counts as "the app is not there" --------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "lost"),
    [
        (ConnectionRefusedError(111, "Connection refused"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (CannotConnect(ConnectionRefusedError(111, "Connect call failed")), True),
        (Disconnected("the app closed the connection before answering"), True),
        (TimeoutError(), False),
        (TlsFailed("certificate verify failed"), False),
        (BadAnswer("the app's answer is not HTTP/1.1"), False),
    ],
)
def test_lost_connection_versus_an_answer(exc: BaseException, lost: bool) -> None:
    assert lost_connection(exc) is lost


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def tcp_app(handle: Handler) -> AsyncIterator[int]:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def http_app(status: int) -> AsyncIterator[int]:
    async def hook(_: web.Request) -> web.Response:
        return web.Response(status=status, text="from the app")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


ROW = FireRow(
    id=1,
    uid="uid-1",
    namespace="default",
    name="one",
    target="demo",
    due_at=datetime(2026, 1, 1, tzinfo=UTC),
    payload={},
    attempt=1,
    max_attempts=3,
    backoff_seconds=1.0,
    starting_deadline_seconds=None,
    db_now=datetime(2026, 1, 1, tzinfo=UTC),
    orphan=False,
)


async def deliver_to(port: int, timeout: float = 2.0) -> tuple[int | None, bool]:
    async with Deliverer(
        f"http://127.0.0.1:{port}/schedlock", timeout_seconds=timeout, concurrency=1
    ) as deliverer:
        delivery = await deliverer.deliver(ROW, term=1)
    return delivery.attempt.status, delivery.connection_lost


async def test_a_closed_port_is_a_lost_connection() -> None:
    assert await deliver_to(free_port()) == (None, True)


async def test_an_app_that_closes_without_answering_is_a_lost_connection() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.close()

    async with tcp_app(hang_up) as port:
        assert await deliver_to(port) == (None, True)


@pytest.mark.parametrize("status", [503, 429, 408, 404, 500])
async def test_any_http_answer_is_the_app_answering(status: int) -> None:
    async with http_app(status) as port:
        assert await deliver_to(port) == (status, False)


async def test_a_slow_app_is_a_timeout_not_a_lost_connection() -> None:
    answer = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        await answer.wait()
        writer.close()

    async with tcp_app(slow) as port:
        try:
            assert await deliver_to(port, timeout=0.2) == (None, False)
        finally:
            answer.set()


# -- the check and the watch, against real sockets ------------------------------------------


async def test_probe_tcp_and_http() -> None:
    assert await probe(Check("tcp", f"tcp://127.0.0.1:{free_port()}"), 1, None) is not None
    async with http_app(200) as port:
        assert await probe(Check("tcp", f"tcp://127.0.0.1:{port}"), 1, None) is None
    for status, error in ((204, None), (503, "HTTP 503")):
        async with http_app(status) as port:
            url = f"http://127.0.0.1:{port}/r"
            client = HttpClient(url, "test", keep_alive=False)
            answer = await probe(Check("http", url), 1, client)
            assert answer is None if error is None else error in str(answer)
    client = HttpClient(f"http://127.0.0.1:{free_port()}/r", "test", keep_alive=False)
    refused = await probe(Check("http", client.base_url), 1, client)
    assert refused is not None and "refused" in refused.lower()


async def wait_set(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), 10)


def watch_for(port: int, metrics: SidecarMetrics) -> TargetWatch:
    return TargetWatch(
        Check("tcp", f"tcp://127.0.0.1:{port}"),
        interval=0.02,
        timeout=1,
        thresholds=TWO_TWO,
        metrics=metrics,
    )


def reachable_watch_of_a_closed_port() -> TargetWatch:
    """A watch that last saw the app reachable; the app has gone since (its port is closed)."""
    watch = watch_for(free_port(), SidecarMetrics())
    watch.health = Health(reachable=True)
    watch.reachable.turn(True)
    return watch


def gauge(metrics: SidecarMetrics) -> float | None:
    return sample_value(metrics.registry, "schedlock_target_up")


async def test_the_watch_follows_the_app_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="schedlock.target")
    metrics = SidecarMetrics()
    stopping = asyncio.Event()
    async with http_app(200) as port:
        watch = watch_for(port, metrics)
        assert watch.reachable.off.is_set() and not watch.reachable.on.is_set()
        assert gauge(metrics) == 0
        task = asyncio.create_task(watch.run(stopping))
        await wait_set(watch.reachable.on)
        assert not watch.reachable.off.is_set() and gauge(metrics) == 1
        assert await watch.confirm(), "the app is there: a lost delivery is an attempt"
    # The app is gone now (its port closed).
    try:
        await wait_set(watch.reachable.off)
        assert not watch.reachable.on.is_set() and gauge(metrics) == 0
        assert "127.0.0.1" in watch.reason
        assert not await watch.confirm()
    finally:
        stopping.set()
        await task
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events == ["target_reachable", "target_unreachable"]


async def test_confirm_makes_the_app_unreachable_at_once_and_is_shared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watch = reachable_watch_of_a_closed_port()
    checks: list[Check] = []

    async def counted(check: Check, seconds: float, client: HttpClient | None) -> str | None:
        checks.append(check)
        return await probe(check, seconds, client)

    monkeypatch.setattr(target, "probe", counted)
    results = await asyncio.gather(*(watch.confirm() for _ in range(5)))
    assert results == [False] * 5
    assert len(checks) == 1, "five failed deliveries at once: one check, shared"
    assert watch.reachable.off.is_set() and not watch.up
    assert "delivery lost its connection" in watch.reason


@pytest.mark.parametrize(
    ("kind", "lost", "status", "confirm"),
    [
        ("tcp", True, None, True),
        ("http", True, None, True),
        ("http", False, 503, True),  # draining: its readiness endpoint will say so
        ("tcp", False, 503, False),  # nothing can tell draining from overloaded: a retry
        ("http", False, 500, False),
        ("http", False, 429, False),
        ("http", False, None, False),  # a timeout: the app is there, slow
    ],
)
def test_which_failed_deliveries_are_worth_confirming(
    kind: str, lost: bool, status: int | None, confirm: bool
) -> None:
    check = derive_check(
        "http://127.0.0.1:8080/schedlock",
        "http://127.0.0.1:8080/healthz" if kind == "http" else "",
    )
    assert check.kind == kind
    assert worth_confirming(check, connection_lost=lost, status=status) is confirm


async def test_a_503_confirmed_by_a_failing_readiness_endpoint_is_unreachable_at_once() -> None:
    watch = reachable_watch_of_a_closed_port()
    assert not await watch.confirm("delivery failed: HTTP 503 from app")
    assert watch.reachable.off.is_set() and not watch.up
    assert watch.reason.startswith("delivery failed: HTTP 503 from app; ")


# -- the elector's states, against the in-memory store (testbed.memory_store) -------------


async def until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.005)


@dataclasses.dataclass
class Subject:
    elector: Elector
    server: MemoryStore
    app: MemoryApp
    other: MemorySession  # the replica that holds the lock until grant()
    worked: list[str]

    @property
    def role(self) -> Role:
        return self.elector.role

    def steps(self) -> list[str]:
        """What our sessions did, in order."""
        return [step.removeprefix("me:") for step in self.server.steps if step.startswith("me:")]

    def grant(self) -> None:
        self.server.unlock(self.other, released=True)

    def leader_gauge(self) -> float | None:
        return sample_value(
            self.elector.metrics.registry,
            "schedlock_leader",
            {"scheduler": "publish", "namespace": "default", "target": "demo"},
        )


@contextlib.asynccontextmanager
async def elector() -> AsyncIterator[Subject]:
    server, app, worked = MemoryStore(), MemoryApp(present=False), []
    other = server.occupied_by("other")

    async def work(leadership: Leadership, ending: asyncio.Event) -> None:
        worked.append(f"term:{leadership.term}")
        await ending.wait()
        worked.append("ended")

    subject = Elector(
        server,
        (KEY,),
        holder="me",
        timings=LeaseTimings(10),
        metrics=SidecarMetrics(),
        work=work,
        app=app,
        rng=random.Random(1),
    )
    stopping = asyncio.Event()
    task = asyncio.create_task(subject.run(stopping), name="elector-under-test")
    try:
        yield Subject(subject, server, app, other, worked)
    finally:
        stopping.set()
        server.unlock(other, released=True)
        await asyncio.wait_for(task, 10)


async def test_no_session_while_the_app_is_away_then_compete() -> None:
    async with elector() as it:
        await until(lambda: it.role is Role.WAITING_FOR_APP)
        await asyncio.sleep(0)
        assert it.steps() == [], "no session, so no waiter that could be granted"
        it.app.set(True)
        await until(lambda: it.role is Role.STANDBY and "acquire" in it.steps())
        assert it.steps() == ["session", "connect", "try_acquire", "acquire"]


async def test_a_follower_whose_app_goes_away_leaves_the_queue() -> None:
    async with elector() as it:
        it.app.set(True)
        await until(lambda: "acquire" in it.steps())
        it.app.set(False)
        await until(lambda: it.role is Role.WAITING_FOR_APP)
        assert it.steps() == ["session", "connect", "try_acquire", "acquire", "close"]
        assert it.server.queue == [], "out of the lock's queue"


async def test_a_leader_whose_app_goes_away_ends_its_term_and_unlocks() -> None:
    async with elector() as it:
        it.app.set(True)
        it.grant()
        await until(lambda: it.role is Role.LEADING and it.worked == ["term:1"])
        assert it.leader_gauge() == 1
        it.app.set(False)
        await until(lambda: it.role is Role.WAITING_FOR_APP)
        assert it.worked == ["term:1", "ended"]
        assert it.steps()[-2:] == ["release:1", "close"], "a checked unlock, not a dropped session"
        assert it.leader_gauge() == 0
        released = sample_value(
            it.elector.metrics.registry,
            "schedlock_leadership_transitions_total",
            {
                "scheduler": "publish",
                "namespace": "default",
                "target": "demo",
                "direction": "released",
            },
        )
        assert released == 1
        # Back again: a candidate again, through a fresh session.
        it.app.set(True)
        await until(lambda: it.worked[-1:] == ["term:2"])
        assert it.steps().count("session") == 2


async def test_granted_as_the_app_goes_away_unlocks_without_a_term() -> None:
    async with elector() as it:
        it.app.set(True)
        await until(lambda: "acquire" in it.steps())
        it.app.set(False)
        it.grant()  # both at once: whichever the elector sees first, no term starts
        await until(lambda: it.role is Role.WAITING_FOR_APP)
        assert it.worked == [] and not any(step.startswith("term:") for step in it.steps())
        assert it.server.holder is None, "the lock is free for the next replica"
