"""Retention: finished history is pruned after a retention, by one elected process at a time.

What goes, and when (cutoffs on the database clock, :func:`plan`, pure):

* ``schedlock_publishes`` rows ``published`` or ``cancelled`` whose last change
  (``updated_at``) is older than ``retention``; ``failed`` and ``missed`` ones older than
  ``failed_retention`` (kept longer: they are what someone investigates).  Scheduled, firing
  and suspended rows are live and never pruned, whoever leads their key or none does;
* cancelled schedules (their object was deleted) older than ``retention`` with no live slot;
  their finished slots cascade;
* ``schedlock_terms`` rows of keys gone for longer than ``retention``, only when nothing can
  still need the key's term counter (the conditions are in the ``prune_terms`` query);
* roster rows (``schedlock_reserves``) past their expiry, which every reader ignores already.

A retention of 0 keeps its rows forever; both 0 and the pruner never runs (no session at all).

Election.  The lease row ``schedlock_maintenance('prune')`` (migration 0005) elects the
pruner across every process of the database, in every mode: a contender claims it with one
UPDATE on the database clock when it is free or already its own, for ``LEASE_INTERVALS`` prune
intervals, and renews it while it prunes; the others learn when the lease ends and do not try
again before.  So one process prunes per interval, the holder keeps the job while it lives
(it comes back every interval, well inside its lease) and a dead holder is replaced within a
lease.  The lease decides who spends the effort, not what is safe: two passes deleting the
same finished rows would only race to delete them.

Never blocking a claim.  A pass runs on a short session of its own — never a lock session —
and deletes in batches of at most ``batch_size`` rows taken ``FOR UPDATE SKIP LOCKED`` (it
waits for no row lock and touches no scheduled or firing row), each bounded by a statement
timeout, with a pause as long as the batch took (at least 10 ms) between batches: at most half
of one session's time, whatever the load, and every batch commits on its own.

Sessions.  PostgreSQL: one connection for a pass — opened for it and closed after it (the
sidecar), or one of the pool's (the operator) — once per interval for the holder and about
once per lease for every other contender.  SQLite: each statement takes the one connection for
itself, so the firing loops run between batches.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from schedlock.core.aio import sleep_unless
from schedlock.core.logs import Event
from schedlock.core.settings import RetentionSettings
from schedlock.store.contract import Maintenance, Store
from schedlock.store.errors import StoreError
from schedlock.store.models import HistoryStats, MaintenanceLease, RowState

log = logging.getLogger("schedlock.store.retention")

TASK = "prune"
LEASE_INTERVALS = 3  # the lease outlives this many intervals: the holder renews well inside it
JITTER = 0.1  # of the interval, added to every wait: contenders started together spread out
STATEMENT_TIMEOUT_SECONDS = 5.0  # one batch at most; past it the pass ends, the next retries
LOCK_TIMEOUT_SECONDS = 1.0
MIN_PAUSE_SECONDS = 0.01
SCHEDULE_BATCH = 100  # cancelled schedules per batch: each one cascades to its slots
INSUFFICIENT_PRIVILEGE = "42501"

# Finished state -> which retention keeps it.
FAILED_STATES = frozenset({RowState.FAILED, RowState.MISSED})
FINISHED_STATES = (RowState.PUBLISHED, RowState.CANCELLED, RowState.FAILED, RowState.MISSED)
TABLES = ("publishes", "schedules", "terms", "reserves")


@dataclass(frozen=True)
class RetentionPolicy:
    """How long history is kept and how the pruner paces itself (seconds, rows)."""

    retention_seconds: float = 24 * 3600.0
    failed_retention_seconds: float = 7 * 24 * 3600.0
    interval_seconds: float = 60.0
    batch_size: int = 1000

    @classmethod
    def of(cls, settings: RetentionSettings) -> RetentionPolicy:
        return cls(
            retention_seconds=settings.retention_seconds,
            failed_retention_seconds=settings.failed_retention_seconds,
            interval_seconds=settings.prune_interval_seconds,
            batch_size=settings.prune_batch_size,
        )

    @property
    def enabled(self) -> bool:
        return self.retention_seconds > 0 or self.failed_retention_seconds > 0

    @property
    def lease_seconds(self) -> float:
        return self.interval_seconds * LEASE_INTERVALS

    def retention_of(self, state: str) -> float:
        """The retention of a finished state (0: kept forever)."""
        return self.failed_retention_seconds if state in FAILED_STATES else self.retention_seconds


@dataclass(frozen=True)
class Step:
    """One kind of row a pass deletes: older than ``cutoff`` (and in ``state``, for publishes)."""

    table: str
    cutoff: datetime
    state: str | None = None


def plan(now: datetime, policy: RetentionPolicy) -> list[Step]:
    """What a pass started at ``now`` (database clock) deletes, in order."""
    if not policy.enabled:
        return []
    steps = [
        Step("publishes", now - timedelta(seconds=policy.retention_of(state)), state)
        for state in FINISHED_STATES
        if policy.retention_of(state) > 0
    ]
    if policy.retention_seconds > 0:
        cutoff = now - timedelta(seconds=policy.retention_seconds)
        # Schedules after the rows (their finished slots are mostly gone by then, so the
        # cascade is small); terms last, once the rows that keep a key alive had their turn.
        steps += [Step("schedules", cutoff), Step("terms", cutoff)]
    steps.append(Step("reserves", now))
    return steps


def next_attempt_in(
    policy: RetentionPolicy,
    *,
    won: bool,
    lease: MaintenanceLease | None,
    db_now: datetime | None,
    rng: random.Random,
) -> float:
    """Seconds until this contender tries again: the holder after an interval, any other not
    before the lease it saw ends (at least an interval); plus jitter either way."""
    wait = policy.interval_seconds
    if not won and lease is not None and lease.lease_until is not None and db_now is not None:
        wait = max(wait, (lease.lease_until - db_now).total_seconds())
    return wait + rng.uniform(0, JITTER * policy.interval_seconds)


@dataclass
class PassReport:
    """What one :meth:`Pruner.run_once` did (for metrics, logs and benchmarks)."""

    holder: str
    won: bool  # this process held the lease and pruned
    lease: MaintenanceLease | None = None
    db_now: datetime | None = None
    deleted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    batches: int = 0
    seconds: float = 0.0
    complete: bool = False  # every step ran out of rows (False: stopped, lease lost)
    stats: HistoryStats | None = None

    @property
    def total(self) -> int:
        return sum(self.deleted.values())

    def fields(self) -> dict[str, object]:
        """The fields of the ``history_pruned`` line (docs/operations.md)."""
        return {
            **{f"{table}_deleted": n for table, n in self.deleted.items()},
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "complete": self.complete,
        }


def permission_problem(exc: StoreError) -> bool:
    """Whether the database refused the pass for lack of a privilege (a role granted before
    this release: ``schedlock migrate --grant-…`` grants the pruner's)."""
    return getattr(exc.__cause__, "sqlstate", None) == INSUFFICIENT_PRIVILEGE


class Pruner:
    """Contends for the lease every interval and, holding it, prunes (:meth:`run_once`).

    ``report`` receives every pass's :class:`PassReport` (the sidecar's metrics), ``counted``
    every committed batch's table and row count as it commits (a pass through a backlog is
    one pass: a counter fed at its end would stand still for minutes); a harness calls
    :meth:`run_once` directly and reads the report it returns.
    """

    def __init__(
        self,
        store: Store,
        holder: str,
        policy: RetentionPolicy,
        *,
        report: Callable[[PassReport], None] | None = None,
        counted: Callable[[str, int], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.holder = holder
        self.policy = policy
        self.report = report or (lambda _report: None)
        self.counted = counted or (lambda _table, _rows: None)
        self.rng = rng or random.Random()
        self.last: PassReport | None = None
        self._told_privileges = False

    async def run(
        self, stopping: asyncio.Event, contending: Callable[[], bool] = lambda: True
    ) -> None:
        """Try every interval (jittered) while ``contending()`` until ``stopping``."""
        if not self.policy.enabled:
            return
        # Contenders that start together (a rollout) spread over the first interval.
        wait = self.rng.uniform(0, self.policy.interval_seconds)
        while not await sleep_unless(wait, stopping):
            wait = self.policy.interval_seconds * (1 + self.rng.uniform(0, JITTER))
            if not contending():
                continue
            try:
                done = await self.run_once(stopping)
            except StoreError as exc:
                self._failed(exc)
                continue
            wait = next_attempt_in(
                self.policy, won=done.won, lease=done.lease, db_now=done.db_now, rng=self.rng
            )

    def _failed(self, exc: StoreError) -> None:
        if permission_problem(exc):
            if not self._told_privileges:
                self._told_privileges = True
                log.warning(
                    "cannot prune history: this role lacks the privileges",
                    extra={
                        "event": Event.PRUNE_NOT_PERMITTED,
                        "error": str(exc),
                        "fix": "as the schema owner run `schedlock migrate --grant-sidecar ROLE` "
                        "(or --grant-operator) again",
                    },
                )
            return
        log.warning(
            "history prune pass failed, retrying next interval",
            extra={"event": Event.PRUNE_FAILED, "error": str(exc)},
        )

    async def run_once(self, stopping: asyncio.Event | None = None) -> PassReport:
        """Claim the lease; holding it, prune every step in batches.  Any contender measures
        the history (:class:`HistoryStats`) on the same session, so the metrics exist
        wherever a contender runs, whoever prunes."""
        stopping = stopping or asyncio.Event()
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = PassReport(holder=self.holder, won=False)
        async with self.store.maintenance() as session:
            await session.begin(STATEMENT_TIMEOUT_SECONDS, LOCK_TIMEOUT_SECONDS)
            now = result.db_now = await session.db_now()
            result.lease = await session.claim(TASK, self.holder, self._lease_from(now))
            if result.lease is None:
                result.lease = await session.lease(TASK)
            else:
                result.won = True
                result.complete = await self._prune(
                    session, plan(now, self.policy), result, stopping
                )
            result.stats = await session.history_stats()
        result.seconds = loop.time() - started
        self.last = result
        self.report(result)
        if result.total:
            log.info(
                "pruned finished history", extra={"event": Event.HISTORY_PRUNED, **result.fields()}
            )
        return result

    def _lease_from(self, now: datetime) -> datetime:
        return now + timedelta(seconds=self.policy.lease_seconds)

    async def _prune(
        self, session: Maintenance, steps: list[Step], result: PassReport, stopping: asyncio.Event
    ) -> bool:
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        for step in steps:
            limit = self._limit(step)
            while True:
                batch_started = loop.time()
                deleted = await self._batch(session, step, limit)
                result.deleted[step.table] += deleted
                result.batches += 1
                if deleted:
                    self.counted(step.table, deleted)
                if deleted < limit:
                    break  # this step is done
                # As long a pause as the batch took: at most half of one session's time.
                pause = max(MIN_PAUSE_SECONDS, loop.time() - batch_started)
                if await sleep_unless(pause, stopping):
                    return False
                if loop.time() - renewed >= self.policy.interval_seconds:
                    now = await session.db_now()
                    if await session.claim(TASK, self.holder, self._lease_from(now)) is None:
                        return False  # another process holds it now (this one was too slow)
                    renewed = loop.time()
        return True

    def _limit(self, step: Step) -> int:
        if step.table == "schedules":
            return min(self.policy.batch_size, SCHEDULE_BATCH)
        if step.table == "reserves":
            return 1 << 62  # one statement: the roster holds a row per reserve replica
        return self.policy.batch_size

    async def _batch(self, session: Maintenance, step: Step, limit: int) -> int:
        if step.table == "publishes":
            assert step.state is not None
            return await session.prune_publishes(step.state, step.cutoff, limit)
        if step.table == "schedules":
            return await session.prune_schedules(step.cutoff, limit)
        if step.table == "terms":
            return await session.prune_terms(step.cutoff, limit)
        return await session.prune_reserves(step.cutoff)


def retention_by_state(policy: RetentionPolicy) -> Mapping[str, float]:
    """Finished state -> its retention in seconds (0: kept forever), as the metrics export it."""
    return {state: policy.retention_of(state) for state in FINISHED_STATES}
