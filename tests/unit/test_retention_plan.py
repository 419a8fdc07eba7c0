"""The pruner's pure parts (cutoffs, waits, settings) and its pacing on virtual time."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from schedlock.core.logs import Event
from schedlock.core.settings import SettingError, build
from schedlock.operator.injection import inject_pod
from schedlock.operator.settings import OperatorSettings
from schedlock.sidecar.metrics import SidecarMetrics
from schedlock.sidecar.settings import SidecarSettings
from schedlock.store import StoreError
from schedlock.store.models import HistoryStats, MaintenanceLease
from schedlock.store.retention import (
    JITTER,
    MIN_PAUSE_SECONDS,
    PassReport,
    Pruner,
    RetentionPolicy,
    Step,
    next_attempt_in,
    permission_problem,
    plan,
    retention_by_state,
)
from testbed.memory_store import MemoryStore
from testbed.virtual_time import run

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
DAY = timedelta(days=1)


def test_cutoffs_per_state_on_the_database_clock() -> None:
    steps = plan(NOW, RetentionPolicy())
    assert steps == [
        Step("publishes", NOW - DAY, "published"),
        Step("publishes", NOW - DAY, "cancelled"),
        Step("publishes", NOW - 7 * DAY, "failed"),
        Step("publishes", NOW - 7 * DAY, "missed"),
        Step("schedules", NOW - DAY),
        Step("terms", NOW - DAY),
        Step("reserves", NOW),
    ]


def test_a_retention_of_zero_keeps_its_rows_and_both_zero_disable_pruning() -> None:
    keep_failed = plan(NOW, RetentionPolicy(failed_retention_seconds=0))
    assert {s.state for s in keep_failed if s.table == "publishes"} == {"published", "cancelled"}
    keep_done = plan(NOW, RetentionPolicy(retention_seconds=0))
    assert [(s.table, s.state) for s in keep_done] == [
        ("publishes", "failed"),
        ("publishes", "missed"),
        ("reserves", None),
    ]
    off = RetentionPolicy(retention_seconds=0, failed_retention_seconds=0)
    assert not off.enabled and plan(NOW, off) == []


def test_the_holder_comes_back_every_interval_the_others_after_the_lease() -> None:
    policy = RetentionPolicy(interval_seconds=60)
    rng = random.Random(7)
    lease = MaintenanceLease("other", NOW + timedelta(seconds=150))
    for _ in range(50):
        mine = next_attempt_in(policy, won=True, lease=lease, db_now=NOW, rng=rng)
        assert 60 <= mine <= 60 * (1 + JITTER)
        theirs = next_attempt_in(policy, won=False, lease=lease, db_now=NOW, rng=rng)
        assert 150 <= theirs <= 150 + 60 * JITTER
    expired = MaintenanceLease("other", NOW - timedelta(seconds=5))
    assert next_attempt_in(policy, won=False, lease=expired, db_now=NOW, rng=rng) >= 60
    assert policy.lease_seconds == 180  # three intervals: the holder renews well inside it


def test_settings_are_declared_once_for_the_sidecar_and_the_operator() -> None:
    env = {
        "SCHEDLOCK_DATABASE_URL": "postgresql://db/app",
        "SCHEDLOCK_TARGET": "app",
        "SCHEDLOCK_RETENTION_SECONDS": "7200",
        "SCHEDLOCK_FAILED_RETENTION_SECONDS": "0",
        "SCHEDLOCK_PRUNE_INTERVAL_SECONDS": "30",
        "SCHEDLOCK_PRUNE_BATCH_SIZE": "500",
    }
    expected = RetentionPolicy(7200, 0, 30, 500)
    assert RetentionPolicy.of(build(SidecarSettings, None, env)) == expected
    assert RetentionPolicy.of(build(OperatorSettings, None, env)) == expected
    assert RetentionPolicy.of(SidecarSettings(target="app")) == RetentionPolicy()
    with pytest.raises(SettingError, match="SCHEDLOCK_RETENTION_SECONDS"):
        build(SidecarSettings, None, {**env, "SCHEDLOCK_RETENTION_SECONDS": "-1"})
    with pytest.raises(SettingError, match="SCHEDLOCK_PRUNE_BATCH_SIZE"):
        build(OperatorSettings, None, {**env, "SCHEDLOCK_PRUNE_BATCH_SIZE": "1"})


class PermissionDenied(Exception):
    sqlstate = "42501"


def test_a_missing_privilege_is_told_apart() -> None:
    refused = StoreError("permission denied for table schedlock_maintenance")
    refused.__cause__ = PermissionDenied()
    assert permission_problem(refused)
    assert not permission_problem(StoreError("connection refused"))


class Tables:
    """A pruning pass's session (``Maintenance``) in the in-memory store: rows per step, batches
    that take virtual time."""

    def __init__(self, rows: int, batch_seconds: float, lose_lease_after: float | None) -> None:
        self.rows = rows
        self.batch_seconds = batch_seconds
        self.lose_lease_after = lose_lease_after
        self.batches: list[tuple[float, float]] = []  # (start, end) on the loop's clock
        self.claims: list[float] = []
        self.started = 0.0

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def begin(self, statement_timeout: float, lock_timeout: float) -> None:
        self.started = self.started or self.now()

    async def db_now(self) -> datetime:
        return NOW + timedelta(seconds=self.now())

    async def claim(self, task: str, holder: str, lease_until: datetime) -> MaintenanceLease | None:
        self.claims.append(self.now())
        lost = (
            self.lose_lease_after is not None and self.now() - self.started > self.lose_lease_after
        )
        return None if lost else MaintenanceLease(holder, lease_until)

    async def lease(self, task: str) -> MaintenanceLease:
        return MaintenanceLease("someone else", NOW)

    async def prune_publishes(self, state: str, cutoff: datetime, limit: int) -> int:
        start = self.now()
        await asyncio.sleep(self.batch_seconds)
        self.batches.append((start, self.now()))
        taken = min(limit, self.rows) if state == "published" else 0
        self.rows -= taken
        return taken

    async def prune_schedules(self, cutoff: datetime, limit: int) -> int:
        return 0

    async def prune_terms(self, cutoff: datetime, limit: int) -> int:
        return 0

    async def prune_reserves(self, cutoff: datetime) -> int:
        return 0

    async def history_stats(self) -> HistoryStats:
        return HistoryStats(published_age_seconds=12.5, publishes_bytes=8192.0)


def prune(
    tables: Tables, policy: RetentionPolicy, counted: list[tuple[str, int, int]] | None = None
) -> PassReport:
    """One pass; ``counted`` gets (table, rows, batches done by then) for each counted batch."""

    def count(table: str, rows: int) -> None:
        if counted is not None:
            counted.append((table, rows, len(tables.batches)))

    async def main() -> PassReport:
        return await Pruner(
            MemoryStore(maintenance_session=tables), "me", policy, counted=count
        ).run_once()

    return run(main())


def test_batches_are_bounded_and_paused_as_long_as_they_took() -> None:
    tables = Tables(rows=10_000, batch_seconds=0.2, lose_lease_after=None)
    counted: list[tuple[str, int, int]] = []
    report = prune(tables, RetentionPolicy(batch_size=1000, interval_seconds=1), counted)
    assert report.won and report.complete
    assert report.deleted["publishes"] == 10_000
    # Each batch is counted as it commits, before the next one runs (the metric moves while
    # a long pass goes on); the empty batch that ends the step is not.
    assert counted == [("publishes", 1000, n) for n in range(1, 11)]
    publishes = tables.batches[:11]  # 10 full batches, then the empty one that ends the step
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(publishes)]
    assert all(gap >= 0.2 for gap in gaps[:9])  # at most half of the session's time
    # The lease is renewed about once an interval while the pass goes on.
    assert 3 <= len(tables.claims) <= 6
    fast = Tables(rows=3000, batch_seconds=0.0, lose_lease_after=None)
    prune(fast, RetentionPolicy(batch_size=1000))
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(fast.batches)]
    assert min(gaps[:2]) == pytest.approx(MIN_PAUSE_SECONDS)


def test_a_pass_that_pruned_logs_what_it_deleted(caplog: pytest.LogCaptureFixture) -> None:
    """One ``history_pruned`` info line per pass that deleted rows (docs/operations.md's
    fields); a pass with nothing to delete logs nothing."""
    caplog.set_level(logging.INFO, "schedlock")
    prune(Tables(rows=2500, batch_seconds=0.0, lose_lease_after=None), RetentionPolicy())
    (line,) = [r for r in caplog.records if getattr(r, "event", None) == Event.HISTORY_PRUNED]
    assert line.levelno == logging.INFO
    fields = vars(line)
    deleted = {t: fields[f"{t}_deleted"] for t in ("publishes", "schedules", "terms", "reserves")}
    assert deleted == {"publishes": 2500, "schedules": 0, "terms": 0, "reserves": 0}
    assert fields["complete"] is True and fields["batches"] >= 3 and fields["seconds"] >= 0
    caplog.clear()
    prune(Tables(rows=0, batch_seconds=0.0, lose_lease_after=None), RetentionPolicy())
    assert not [r for r in caplog.records if getattr(r, "event", None) == Event.HISTORY_PRUNED]


def test_a_pass_that_lost_its_lease_stops() -> None:
    tables = Tables(rows=100_000, batch_seconds=0.5, lose_lease_after=1.5)
    report = prune(tables, RetentionPolicy(batch_size=1000, interval_seconds=1))
    assert report.won and not report.complete
    assert report.deleted["publishes"] < 100_000


def test_contenders_that_do_not_lead_never_open_a_session() -> None:
    tables = Tables(rows=0, batch_seconds=0.0, lose_lease_after=None)
    leading = False

    async def main() -> None:
        stopping = asyncio.Event()
        pruner = Pruner(
            MemoryStore(maintenance_session=tables), "me", RetentionPolicy(interval_seconds=10)
        )
        task = asyncio.create_task(pruner.run(stopping, lambda: leading))
        await asyncio.sleep(100)
        assert tables.claims == []
        lead()
        await asyncio.sleep(25)
        stopping.set()
        await task

    def lead() -> None:
        nonlocal leading
        leading = True

    run(main())
    assert 1 <= len(tables.claims) <= 3  # about one an interval once it leads


def test_a_pass_report_feeds_the_sidecar_metrics() -> None:
    metrics = SidecarMetrics()
    metrics.init_history(retention_by_state(RetentionPolicy()))
    report = PassReport("me", won=True, stats=HistoryStats(published_age_seconds=90.0))
    report.deleted["publishes"] = 40  # counted batch by batch, not again from the report
    metrics.count_pruned("publishes", 30)
    metrics.count_pruned("publishes", 10)
    metrics.observe_pass(report)
    metrics.count_pruned("publishes", 40)
    metrics.observe_pass(report)
    samples: dict[str, Any] = {
        f"{name}{sorted(labels.items())}": value
        for name, labels, value in metrics.registry.samples()
    }
    assert samples["schedlock_history_pruned_rows_total[('table', 'publishes')]"] == 80
    assert samples["schedlock_history_pruned_rows_total[('table', 'terms')]"] == 0
    assert samples["schedlock_history_oldest_finished_age_seconds[('state', 'published')]"] == 90
    assert samples["schedlock_history_oldest_finished_age_seconds[('state', 'failed')]"] == 0
    assert samples["schedlock_history_retention_seconds[('state', 'failed')]"] == 7 * 86400


def test_injected_sidecars_prune_by_the_operators_retention() -> None:
    env = {
        "SCHEDLOCK_DATABASE_URL": "postgresql://db/app",
        "SCHEDLOCK_RETENTION_SECONDS": "7200",
        "SCHEDLOCK_FAILED_RETENTION_SECONDS": "0",
    }
    config = build(OperatorSettings, None, env).injection
    metadata = {
        "name": "app-1",
        "labels": {"schedlock.dev/inject": "true", "app.kubernetes.io/name": "billing"},
    }
    changed = inject_pod(metadata, {"containers": [{"name": "app", "image": "app:1"}]}, config)
    assert changed is not None
    [sidecar] = changed[1]["initContainers"]
    given = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert given["SCHEDLOCK_RETENTION_SECONDS"] == "7200"
    assert given["SCHEDLOCK_FAILED_RETENTION_SECONDS"] == "0"
    assert given["SCHEDLOCK_PRUNE_INTERVAL_SECONDS"] == "60"
    # The sidecar reads back exactly what the operator prunes by.
    sidecar_env = {k: v for k, v in given.items() if v is not None}
    sidecar_env["SCHEDLOCK_DATABASE_URL"] = env["SCHEDLOCK_DATABASE_URL"]  # from its Secret
    assert RetentionPolicy.of(build(SidecarSettings, None, sidecar_env)) == RetentionPolicy.of(
        build(OperatorSettings, None, env)
    )
