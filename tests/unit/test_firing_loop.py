"""The leader's firing loop (``schedlock.sidecar.firing``) against the in-memory store and app
(``testbed.memory_store``), on virtual time (``testbed.virtual_time``): wake-ups at the due
time and on NOTIFY, the concurrency bound, the lease check, a graceful stop within the grace,
the app away.

``tests/integration/test_delivery.py`` and the e2e tests run the same loop against PostgreSQL
and a real HTTP app; these pin the loop's decisions and timings exactly, in milliseconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import pytest

from schedlock.core.aio import now
from schedlock.sidecar.delivery import BodyError, Delivery
from schedlock.sidecar.firing import Firer, FiringOptions
from schedlock.sidecar.lock import Leadership
from schedlock.sidecar.metrics import SidecarMetrics
from schedlock.store import Channel, Completion, FireRow, LeadershipLost
from testbed.memory_store import KEY, MemoryApp, MemorySession, MemoryStore
from testbed.virtual_time import quiet, run

STEP_DOWN = 8.0


def row(number: int) -> FireRow:
    wall = datetime.now(UTC)
    return FireRow(
        id=number,
        uid=f"row-{number}",
        namespace="default",
        name=f"row-{number}",
        target="demo",
        due_at=wall,
        payload={},
        attempt=1,
        max_attempts=3,
        backoff_seconds=1.0,
        starting_deadline_seconds=None,
        db_now=wall,
    )


@dataclass
class Term:
    rows: MemoryStore
    app: MemoryApp
    leadership: Leadership
    stopping: asyncio.Event
    task: asyncio.Task[None]
    beating: asyncio.Task[None] | None

    async def stop(self) -> float:
        """SIGTERM (or the app gone): the virtual seconds the term took to end."""
        stopped_at = now()
        self.stopping.set()
        await asyncio.wait_for(self.task, 60)
        if self.beating is not None:
            self.beating.cancel()
        return now() - stopped_at


def start(
    rows: MemoryStore,
    app: MemoryApp,
    *,
    concurrency: int = 10,
    poll: float = 60.0,
    grace: float = 10.0,
    beating: bool = True,
    session: MemorySession | None = None,
) -> Term:
    """A term of the loop; ``beating``: with the elector's heartbeats confirming the lease;
    ``session``: the key's lock session (by default a new one of ``rows``)."""
    options = FiringOptions(
        batch_size=10, concurrency=concurrency, poll_seconds=poll, shutdown_grace_seconds=grace
    )
    firer = Firer(app, SidecarMetrics(), options, app=app)
    leadership = Leadership(
        key=KEY,
        session=session or rows.lock_session(KEY, "me", STEP_DOWN + 2),
        term=3,
        step_down_after=STEP_DOWN,
        last_heartbeat_ok=now(),
    )
    stopping = asyncio.Event()
    task = asyncio.create_task(firer(leadership, stopping), name="term-under-test")
    beat = asyncio.create_task(heartbeats(leadership)) if beating else None
    return Term(rows, app, leadership, stopping, task, beat)


async def heartbeats(leadership: Leadership) -> None:
    """What the elector's heartbeat does for the loop: keep the lease confirmed."""
    while True:
        await asyncio.sleep(3)
        leadership.last_heartbeat_ok = now()


# -- the tests ----------------------------------------------------------------------------------


def test_rows_fire_at_their_due_time_not_at_the_poll() -> None:
    async def body() -> None:
        rows, app = MemoryStore(), MemoryApp()
        t0 = now()
        rows.add_due(row(1))
        rows.add_due(row(2), 30)
        term = start(rows, app, poll=600)
        await asyncio.sleep(31)
        assert [(at - t0, n) for at, n in app.started] == [(0, 1), (30, 2)]
        assert rows.outcomes() == {1: "published", 2: "published"}
        assert len(rows.claims) <= 5, "a timer to the next due row: no polling in between"
        await term.stop()

    run(body())


def test_notify_for_this_key_wakes_the_loop_at_once_and_others_do_not() -> None:
    async def body() -> None:
        rows, app = MemoryStore(), MemoryApp()
        term = start(rows, app, poll=STEP_DOWN / 2)
        await asyncio.sleep(1)
        claims = len(rows.claims)
        rows.add_due(row(1))
        rows.notify(Channel.ROWS, "publish/default/other")
        # nor garbage (anyone may NOTIFY the channel): ignored, never raised into the pump
        for garbage in ("x" * 7000, '{"ids":[1e999]}', "publish/default", b"\xff/default/demo"):
            rows.notify(Channel.ROWS, garbage)
        await quiet()
        assert len(rows.claims) == claims and app.started == [], "not our key: no wake-up"
        woken = now()
        rows.notify(Channel.ROWS, "publish/default/demo")
        await quiet()
        assert [(round(at - woken, 3), n) for at, n in app.started] == [(0, 1)]
        await term.stop()

    run(body())


def test_claims_never_exceed_the_free_delivery_slots() -> None:
    async def body() -> None:
        rows, app = MemoryStore(), MemoryApp(takes=1.0)
        t0 = now()
        for number in range(5):
            rows.add_due(row(number))
        term = start(rows, app, concurrency=2)
        await asyncio.sleep(3.5)
        assert app.most_inflight == 2
        assert all(limit <= 2 for _, limit in rows.claims)
        assert sorted(round(at - t0, 3) for at, _ in app.started) == [0, 0, 1, 1, 2]
        assert len(rows.outcomes()) == 5
        await term.stop()

    run(body())


def test_without_heartbeats_the_loop_steps_down_and_sends_nothing() -> None:
    async def body() -> None:
        rows, app = MemoryStore(), MemoryApp()
        t0 = now()
        rows.add_due(row(1), 10)
        term = start(rows, app, beating=False)
        with pytest.raises(LeadershipLost):
            await asyncio.wait_for(term.task, 60)
        assert now() - t0 == pytest.approx(10), "found at the next wake-up (the row's timer)"
        assert app.started == [] and rows.completed == [], "the row stays for the next term"

    run(body())


@dataclass(eq=False)
class OutcomesRefused(MemorySession):
    """A session whose outcome writes fail: the term moved on under it."""

    async def complete(self, term: int, completions: Sequence[Completion]) -> int:
        raise LeadershipLost(f"term {term} is over: outcomes refused")


def test_a_failed_outcome_write_ends_the_term_at_once() -> None:
    async def body() -> None:
        rows, app = MemoryStore(), MemoryApp(takes=1)
        t0 = now()
        rows.add_due(row(1))
        term = start(rows, app, poll=600, session=OutcomesRefused(rows, KEY, "me"))
        with pytest.raises(LeadershipLost, match="outcomes refused"):
            await asyncio.wait_for(term.task, 700)
        assert now() - t0 == 1, "as the write failed, not at the next poll"
        assert term.beating is not None
        term.beating.cancel()

    run(body())


def test_a_retry_is_due_on_the_database_clock_moved_on_by_the_delivery() -> None:
    async def body() -> None:
        rows, app = MemoryStore(), MemoryApp(takes=10, status=503)
        claimed = row(1)
        rows.add_due(claimed)
        term = start(rows, app)
        await asyncio.sleep(11)
        [(_, retry)] = rows.completed
        assert retry.outcome == "retry" and retry.next_attempt_at is not None
        # answered 10 s after the claim, retried 0.5-1 s (the back-off of 1 s) after that
        waited = (retry.next_attempt_at - claimed.db_now).total_seconds()
        assert 10.5 <= waited <= 11, waited
        await term.stop()

    run(body())


def test_with_heartbeats_the_same_row_is_sent() -> None:
    async def body() -> None:
        rows, app = MemoryStore(), MemoryApp()
        rows.add_due(row(1), 10)
        term = start(rows, app)
        await asyncio.sleep(11)
        assert rows.outcomes() == {1: "published"}
        await term.stop()

    run(body())


@pytest.mark.parametrize(
    ("takes", "ends_after", "outcomes"),
    [
        (5.0, 4.0, {1: "published"}),  # waited for the delivery, not for the whole grace
        (20.0, 10.0, {}),  # cut at the grace: left 'firing', re-fired with the same key
    ],
)
def test_a_graceful_stop_lets_in_flight_deliveries_finish_within_the_grace(
    takes: float, ends_after: float, outcomes: dict[int, str]
) -> None:
    async def body() -> None:
        rows, app = MemoryStore(), MemoryApp(takes=takes)
        rows.add_due(row(1))
        term = start(rows, app, grace=10.0)
        await asyncio.sleep(1)
        assert await term.stop() == pytest.approx(ends_after)
        assert rows.outcomes() == outcomes

    run(body())


def test_while_the_app_is_away_rows_go_back_unsent() -> None:
    async def body() -> None:
        rows, app = MemoryStore(), MemoryApp(present=False)
        rows.add_due(row(1))
        term = start(rows, app)
        await asyncio.sleep(1)
        assert app.started == []
        [(_, completion)] = rows.completed
        assert (completion.outcome, completion.sent) == ("retry", False)
        await term.stop()

    run(body())


@dataclass
class BrokenApp(MemoryApp):
    """An app whose delivery of some rows fails before anything is sent: a body that cannot be
    built (BodyError) or a bug on that row's path (any other exception)."""

    broken: dict[int, Exception] = field(default_factory=dict)

    async def deliver(self, row: FireRow, term: int) -> Delivery:
        if row.id in self.broken:
            raise self.broken[row.id]
        return await super().deliver(row, term)


def test_a_row_is_the_unit_of_failure() -> None:
    """Rows that cannot be sent, each for its own reason, end ``failed`` unsent with that
    reason; the rest of the same claim publishes and the term goes on firing (issue 21)."""

    async def body() -> None:
        rows = MemoryStore()
        app = BrokenApp(
            broken={
                2: BodyError("the delivery body cannot be built: payload nests too deep"),
                3: RuntimeError("a bug on this row's path\nsecond line"),
            }
        )
        for number in range(1, 7):
            rows.add_due(row(number))
        rows.due[3] = (rows.due[3][0], replace(rows.due[3][1], attempt=4))  # row 4: 4 of 3
        rows.due[4] = (rows.due[4][0], replace(rows.due[4][1], problem="payload cannot be read"))
        rows.due[5] = (rows.due[5][0], replace(rows.due[5][1], problem="x", counted=False))
        term = start(rows, app)
        await asyncio.sleep(1)
        done = {c.id: c for _, c in rows.completed}
        assert {n: c.outcome for n, c in done.items()} == {
            1: "published",
            2: "failed",
            3: "failed",
            4: "failed",
            5: "failed",
            6: "failed",
        }
        assert (
            done[2].error == "not sent: the delivery body cannot be built: payload nests too deep"
        )
        assert done[3].error == "not sent: RuntimeError: a bug on this row's path"
        assert done[4].error == "no attempts left (3 allowed)"
        assert done[5].error == "payload cannot be read"
        # Unsent: the claim's attempt is given back, except for an orphan that never had one.
        assert [done[n].sent for n in (2, 3, 4, 5, 6)] == [False, False, False, False, True]
        assert sorted(n for _, n in app.started) == [1], "only the good row reached the app"
        rows.add_due(row(7))
        rows.notify(Channel.ROWS, "publish/default/demo")
        await asyncio.sleep(1)
        assert rows.outcomes()[7] == "published", "the term goes on"
        await term.stop()

    run(body())
