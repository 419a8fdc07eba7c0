"""The leader's work for one key: wake up, claim due rows, deliver them, record outcomes.

Wake-ups: a timer to the earliest due row (computed on the database clock), NOTIFY on
``schedlock_rows`` when any writer makes a row due-able (LISTEN rides on the lock session: no
session of its own), and a slow safety poll.  Claims come
in batches no larger than the free delivery slots; deliveries run concurrently up to the bound;
outcomes are written back in batches — all on the lock session, all fenced by the term.

Leadership follows the app (``schedlock.sidecar.target``): a row is sent only while the app is
reachable, and a delivery that lost its connection is checked against the app at once.  When
the app is gone, such rows go back to ``scheduled`` with their attempt not counted (they were
not sent, or their connection was cut by the app going away) and the term ends, so the elector
hands the lock over; rows whose request was still in flight are finished within the grace or
left ``firing`` for the next term to adopt with the same idempotency key.

The ``recurring`` scheduler first turns due cron slots into rows (at most one per schedule per
wake-up, never a burst after downtime), then claims and fires them exactly like one-shot rows.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from schedlock.core.aio import Companion, RateLimit, TaskSet, now, sleep_unless, utcnow
from schedlock.core.identities import Scheduler, slot_uid
from schedlock.core.logs import Event
from schedlock.core.scheduling import (
    Outcome,
    ScheduleError,
    decide,
    is_past_deadline,
    parse_schedule,
    plan_recurring,
)
from schedlock.sidecar.delivery import BodyError, Delivery
from schedlock.sidecar.lock import Leadership
from schedlock.sidecar.metrics import SidecarMetrics
from schedlock.store import (
    Channel,
    Completion,
    DueSchedule,
    FireRow,
    LeadershipLost,
    ScheduleAdvance,
    StoreError,
)
from schedlock.store.notices import GARBLED_LOG_SECONDS, parse_rows

log = logging.getLogger("schedlock.firing")

# What each event of a term says (the record also carries ``event`` and ``key``).
SAID = {
    Event.LISTEN_FAILED: "listen failed, relying on timers",
    Event.SCHEDULE_UNPARSABLE: "schedule cannot be parsed, retrying in an hour",
    Event.SLOTS_SKIPPED: "skipped recurring slots after downtime",
    Event.DELIVERY_NOT_PUBLISHED: "delivery not published",
    Event.ROW_RETURNED: "row returned, app unreachable",
}
BAD_SCHEDULE_RETRY = timedelta(hours=1)
SCHEDULES_PER_WAKE = 100


@dataclass(frozen=True)
class FiringOptions:
    batch_size: int
    concurrency: int
    poll_seconds: float
    shutdown_grace_seconds: float


class Deliveries(Protocol):
    """What the loop asks of delivery (``schedlock.sidecar.delivery.Deliverer``)."""

    async def deliver(self, row: FireRow, term: int) -> Delivery: ...


class AppCheck(Protocol):
    """What the loop asks of its app's watch (``schedlock.sidecar.target.TargetWatch``)."""

    reason: str

    @property
    def up(self) -> bool: ...
    def worth_confirming(self, *, connection_lost: bool, status: int | None) -> bool: ...
    async def confirm(self, failure: str = ...) -> bool: ...


@dataclass(eq=False)
class Firer:
    """``LeaderWork`` for one key: called by the elector each time this replica leads."""

    deliverer: Deliveries
    metrics: SidecarMetrics
    options: FiringOptions
    _: KW_ONLY
    app: AppCheck
    rng: random.Random = field(default_factory=random.Random)

    async def __call__(self, leadership: Leadership, stopping: asyncio.Event) -> None:
        await _Term(self, leadership, stopping).run()


@dataclass(eq=False)
class _Term:
    """State of one leadership term: in-flight deliveries, pending outcomes, wake-ups."""

    firer: Firer
    leadership: Leadership
    stopping: asyncio.Event
    pending: list[Completion] = field(default_factory=list)
    flush: asyncio.Event = field(default_factory=asyncio.Event)
    flush_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # a batch is never cut in half
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    slot_freed: asyncio.Event = field(default_factory=asyncio.Event)
    # The database clock at the last claim, and the loop's clock then: the database's time now
    # is the one advanced by the other's since (no wall clock is read).
    db_read: tuple[datetime, float] | None = None

    def __post_init__(self) -> None:
        self.opts = self.firer.options
        self.session = self.leadership.session
        self.key = self.leadership.key
        self.term = self.leadership.term
        self.labels = (self.key.scheduler, self.key.namespace, self.key.target)
        self.inflight = TaskSet(f"deliveries:{self.key}", on_done=self.slot_freed.set, logger=log)

    def _say(self, level: int, event: Event, **fields: object) -> None:
        """Log ``event`` of this term: its message (``SAID``), the key and ``fields``."""
        log.log(level, SAID[event], extra={"event": event, "key": str(self.key), **fields})

    def _say_schedule(self, level: int, event: Event, due: DueSchedule, **fields: object) -> None:
        self._say(level, event, uid=due.uid, schedule=due.name, **fields)

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> None:
        graceful = False
        # An outcome writer that failed (the term moved on, the schema changed) ends the term
        # now, not at the loop's next wake-up a poll later; the term's errors are the elector's
        # to log (a companion's beside another is said in one line).
        async with Companion(
            f"complete:{self.key}",
            self._complete_loop(),
            on_done=self.wake.set,
            expected=(StoreError,),
            logger=log,
        ) as completer:
            try:
                # No waiting for the listener before the first claim: it wakes the loop once
                # it listens, which re-claims and so covers anything that became due meanwhile.
                async with Companion(f"listen:{self.key}", self._listen(), logger=log):
                    await self._loop(completer)
                graceful = True
            finally:
                await self._drain(graceful)
                if graceful:
                    async with self.flush_lock:
                        await completer.stop()
        if graceful:
            await self._flush_now()

    async def _drain(self, graceful: bool) -> None:
        """Let in-flight deliveries finish within the grace (graceful stop), else abandon them.

        An abandoned row stays ``firing``; the next term adopts it and fires it again with the
        same idempotency key — the one case of at-least-once delivery.
        """
        await self.inflight.drain(self.opts.shutdown_grace_seconds if graceful else 0.0)

    # -- the loop ---------------------------------------------------------------------------------

    async def _loop(self, completer: Companion[None]) -> None:
        self._dispatch(await self.session.adopt_orphans(self.term))
        while not self.stopping.is_set():
            completer.check()  # re-raise LeadershipLost from the outcome writer
            if not self.leadership.lease_ok():
                raise LeadershipLost("lease could not be confirmed: stepping down")
            wait = self.opts.poll_seconds
            if self.key.scheduler == Scheduler.RECURRING:
                wait = min(wait, await self._materialize())
            free = self.opts.concurrency - len(self.inflight)
            limit = min(self.opts.batch_size, free)
            self.wake.clear()
            self.slot_freed.clear()
            claim = await self.session.claim_due(self.term, limit)
            self._dispatch(claim.rows)
            self.firer.metrics.last_tick.labels(*self.labels).set(utcnow().timestamp())
            if limit > 0 and len(claim.rows) == limit:
                continue  # more may be due right now
            if limit == 0:
                await sleep_unless(wait, self.slot_freed, self.stopping)
                continue
            if claim.next_due_in is not None:
                wait = min(wait, max(claim.next_due_in, 0.0005 if not claim.rows else 0.0))
            await sleep_unless(wait, self.wake, self.stopping)

    async def _listen(self) -> None:
        """NOTIFY wake-ups on the lock session itself (no session of their own); a failure
        only costs latency (the timers and the poll still run)."""
        wanted = (self.key.scheduler, self.key.namespace, self.key.target)
        said = RateLimit(GARBLED_LOG_SECONDS)

        def on_payload(payload: str | bytes) -> None:
            # Anyone may NOTIFY this channel: garbage is simply not this key's (the triggers
            # only send well-formed keys, so nothing is lost; the safety poll runs anyway).
            key = parse_rows(payload)
            if key == wanted:
                self.wake.set()
            elif key is None and said.ready(now()):
                log.debug(
                    "notification not understood, ignored",
                    extra={
                        "event": Event.NOTIFICATION_GARBLED,
                        "channel": str(Channel.ROWS),
                        "key": str(self.key),
                    },
                )

        try:
            await self.session.listen(Channel.ROWS, on_payload)
        except StoreError as exc:
            self._say(logging.WARNING, Event.LISTEN_FAILED, error=str(exc))
        # Listening from now on: claim again, for rows that became due before LISTEN.
        self.wake.set()

    # -- recurring --------------------------------------------------------------------------------

    async def _materialize(self) -> float:
        """Turn due cron slots into rows; return seconds until the next slot of any schedule."""
        for due in await self.session.due_schedules(SCHEDULES_PER_WAKE):
            try:
                schedule = parse_schedule(due.expression, due.time_zone)
            except ScheduleError as exc:
                self._say_schedule(logging.ERROR, Event.SCHEDULE_UNPARSABLE, due, error=str(exc))
                await self.session.advance_schedule(
                    self.term,
                    due.id,
                    ScheduleAdvance(
                        watermark_at=due.watermark_at or due.db_now,
                        next_slot_at=due.db_now + BAD_SCHEDULE_RETRY,
                        fired_slot_at=None,
                    ),
                )
                continue
            plan = plan_recurring(
                schedule, due.watermark_at, due.db_now, due.starting_deadline_seconds
            )
            if plan.fire is not None:
                await self.session.insert_slot(
                    self.term, due.id, slot_uid(due.uid, plan.fire), plan.fire
                )
            if plan.skipped:
                self._say_schedule(logging.WARNING, Event.SLOTS_SKIPPED, due, skipped=plan.skipped)
            await self.session.advance_schedule(
                self.term,
                due.id,
                ScheduleAdvance(
                    watermark_at=due.db_now, next_slot_at=plan.next_slot, fired_slot_at=plan.fire
                ),
            )
        next_slot = await self.session.next_slot_in()
        return self.opts.poll_seconds if next_slot is None else max(next_slot, 0.0)

    # -- deliveries -------------------------------------------------------------------------------

    def _db_now(self) -> datetime:
        """The database clock now: its reading at the last claim, plus the time since."""
        assert self.db_read is not None, "rows are fired only once claimed"
        db_now, at = self.db_read
        return db_now + timedelta(seconds=now() - at)

    def _dispatch(self, rows: list[FireRow]) -> None:
        if rows:
            self.db_read = (rows[0].db_now, now())
        for row in rows:
            self.inflight.start(f"fire:{row.id}", self._fire(row))

    async def _fire(self, row: FireRow) -> None:
        """Deliver one row.  A row is the unit of failure: whatever goes wrong with this row
        (its payload, its body, a bug on its path) ends this row ``failed`` with the reason,
        never the term, the batch or the process."""
        try:
            await self._fire_row(row)
        except Exception as exc:  # the row's own failure: recorded on it, the term goes on
            log.error(
                "delivery task crashed",
                exc_info=exc,
                extra={"event": Event.DELIVERY_CRASHED, "key": str(self.key), "uid": row.uid},
            )
            error = str(exc) if isinstance(exc, BodyError) else f"{type(exc).__name__}: {exc}"
            self._fail_unsent(row, f"not sent: {error}".splitlines()[0][:300])

    def _fail_unsent(self, row: FireRow, error: str) -> None:
        """End ``row`` failed without sending it; the claim's attempt is given back (a
        crashed leader's orphan ended here had none counted)."""
        failed = Completion(row.id, Outcome.FAILED.value, error=error, sent=not row.counted)
        self._finish(row, failed, logging.WARNING)

    def _finish(self, row: FireRow, completion: Completion, level: int = logging.INFO) -> None:
        """Record a delivery's outcome, count it, and say so unless it published."""
        self._record(completion)
        self.firer.metrics.fires.labels(*self.labels, completion.outcome).inc()
        if completion.outcome != Outcome.PUBLISHED.value:
            self._say(
                level,
                Event.DELIVERY_NOT_PUBLISHED,
                uid=row.uid,
                attempt=row.attempt,
                outcome=completion.outcome,
                error=completion.error,
            )

    async def _fire_row(self, row: FireRow) -> None:
        metrics = self.firer.metrics
        if not self.leadership.lease_ok():
            return  # abandoned: stays 'firing', the next term re-fires it with the same key
        if row.problem is not None:
            self._fail_unsent(row, row.problem)
            return
        if row.attempt > row.max_attempts:
            # Written as is by another writer (attempts already at the limit): never sent.
            self._fail_unsent(row, f"no attempts left ({row.max_attempts} allowed)")
            return
        now = self._db_now()
        if not row.orphan and is_past_deadline(row.due_at, row.starting_deadline_seconds, now):
            late = (now - row.due_at).total_seconds()
            self._record(
                Completion(
                    row.id,
                    Outcome.MISSED.value,
                    error=f"starting deadline of {row.starting_deadline_seconds}s passed "
                    f"({late:.1f}s late) before it could fire",
                    sent=False,
                )
            )
            metrics.fires.labels(*self.labels, Outcome.MISSED.value).inc()
            return
        if not self.firer.app.up:
            self._return_unsent(row, f"not sent: app unreachable ({self.firer.app.reason})")
            return
        metrics.lateness.labels(*self.labels).observe(max(0.0, (now - row.due_at).total_seconds()))
        delivery = await self.firer.deliverer.deliver(row, self.term)
        result = delivery.attempt
        app = self.firer.app
        if app.worth_confirming(
            connection_lost=delivery.connection_lost, status=result.status
        ) and not await app.confirm(f"delivery failed: {result.error}"):
            self._return_unsent(row, f"{result.error}; app unreachable, attempt not counted")
            return
        decision = decide(
            result,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            backoff_seconds=row.backoff_seconds,
            due_at=row.due_at,
            starting_deadline=row.starting_deadline_seconds,
            now=self._db_now(),
            rng=self.firer.rng,
        )
        outcome = Completion(
            row.id,
            decision.outcome.value,
            next_attempt_at=decision.next_attempt_at,
            status=result.status,
            error=decision.error,
        )
        self._finish(row, outcome)

    def _return_unsent(self, row: FireRow, error: str) -> None:
        """Back to ``scheduled``, due as it was, its attempt not counted: the app was away."""
        self._record(Completion(row.id, Outcome.RETRY.value, error=error, sent=False))
        self._say(logging.INFO, Event.ROW_RETURNED, uid=row.uid)

    def _record(self, completion: Completion) -> None:
        self.pending.append(completion)
        self.flush.set()

    async def _complete_loop(self) -> None:
        while True:
            await self.flush.wait()
            self.flush.clear()
            await self._flush_now()

    async def _flush_now(self) -> None:
        async with self.flush_lock:
            if not self.pending:
                return
            batch, self.pending = self.pending, []
            await self.session.complete(self.term, batch)
