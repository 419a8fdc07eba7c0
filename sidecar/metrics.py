"""The sidecar's Prometheus metrics, on an explicit registry (tests read it; nothing global is
touched; ``schedlock.core.metrics`` writes them).

Labels are bounded: ``scheduler`` (publish|recurring), ``namespace`` and ``target`` of the
lock key, ``outcome`` and ``role`` from fixed sets.
"""

from __future__ import annotations

from collections.abc import Mapping

from schedlock import __version__
from schedlock.core.metrics import Counter, Gauge, Histogram, Info, Registry
from schedlock.store.retention import FINISHED_STATES, TABLES, PassReport

KEY_LABELS = ("scheduler", "namespace", "target")
OUTCOMES = ("published", "retry", "failed", "missed")
ROLES = ("leader", "standby", "reserve")

LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
GAP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 60, 120)


class SidecarMetrics:
    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry or Registry()
        r = self.registry
        self.leader = Gauge(
            "schedlock_leader",
            "1 while this replica holds the lock of the key (scheduler, namespace, target), "
            "else 0.",
            KEY_LABELS,
            registry=r,
        )
        self.transitions = Counter(
            "schedlock_leadership_transitions_total",
            "Leadership changes of this replica, by direction: acquired, lost (session died or "
            "stepped down) or released (graceful hand-over).",
            (*KEY_LABELS, "direction"),
            registry=r,
        )
        self.handover_gap = Histogram(
            "schedlock_handover_gap_seconds",
            "Leaderless time measured at takeover: from the previous term's last heartbeat "
            "(or release) to this term's start, on the database clock.",
            KEY_LABELS,
            buckets=GAP_BUCKETS,
            registry=r,
        )
        self.lateness = Histogram(
            "schedlock_fire_lateness_seconds",
            "Time from a row's due time to the moment its request was sent to the app.",
            KEY_LABELS,
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.fires = Counter(
            "schedlock_fires_total",
            "Delivery outcomes: published (2xx), retry (scheduled again), failed, missed "
            "(past its starting deadline).",
            (*KEY_LABELS, "outcome"),
            registry=r,
        )
        self.backlog = Gauge(
            "schedlock_due_backlog",
            "Rows of the key that are due and not finished, as seen by the leader at its "
            "last heartbeat (0 on followers).",
            KEY_LABELS,
            registry=r,
        )
        self.oldest_due_age = Gauge(
            "schedlock_oldest_due_age_seconds",
            "Age of the oldest due, unfinished row of the key at the leader's last heartbeat.",
            KEY_LABELS,
            registry=r,
        )
        self.last_tick = Gauge(
            "schedlock_last_tick_timestamp_seconds",
            "Unix time of the leader's last successful loop iteration or heartbeat for the key.",
            KEY_LABELS,
            registry=r,
        )
        self.term = Gauge(
            "schedlock_term",
            "Leadership term this replica holds for the key (0 while following).",
            KEY_LABELS,
            registry=r,
        )
        self.foreign_holder = Gauge(
            "schedlock_lock_foreign_holder",
            "1 while this replica, waiting for the key's lock as a standby, sees it held by a "
            "session whose login role may not serve the key's namespace (lock squatting: "
            "advisory locks have no ACL; the key's rows wait), else 0.",
            KEY_LABELS,
            registry=r,
        )
        self.database_up = Gauge(
            "schedlock_database_up",
            "1 when the sidecar's database sessions are connected, else 0.",
            registry=r,
        )
        self.sessions = Gauge(
            "schedlock_database_sessions",
            "Database sessions this sidecar holds open for its lock keys right now: one per key "
            "it leads or stands by for, plus a reserve's check while it lasts.",
            registry=r,
        )
        self.role = Gauge(
            "schedlock_role",
            "1 for this replica's role for the key: leader (holds the lock), standby (waits for "
            "it on its own session) or reserve (no session, checks now and then for a free "
            "standby place); all 0 while it does not compete (its app is away) or reconnects.",
            (*KEY_LABELS, "role"),
            registry=r,
        )
        self.refused = Counter(
            "schedlock_database_connections_refused_total",
            "Connections the database refused for lack of slots (too many clients, reserved "
            "slots) or that would have used a reserved slot; the sidecar backs off with jitter.",
            registry=r,
        )
        self.target_up = Gauge(
            "schedlock_target_up",
            "1 while the app answers the sidecar's readiness check of it (the sidecar then "
            "competes for leadership), else 0 (it holds no lock and fires nothing).",
            registry=r,
        )
        # History (schedlock.store.retention): the database's, measured at every attempt of
        # this sidecar for the pruning lease, whoever holds it (the same on every contender).
        self.pruned = Counter(
            "schedlock_history_pruned_rows_total",
            "Rows this sidecar pruned, by table (publishes, schedules, terms, reserves); a "
            "cancelled schedule's slots go with it uncounted.",
            ("table",),
            registry=r,
        )
        self.oldest_finished_age = Gauge(
            "schedlock_history_oldest_finished_age_seconds",
            "Age (since its last change) of the oldest row of each finished state in the "
            "database, at this sidecar's last look (every pruning attempt); 0 when none.",
            ("state",),
            registry=r,
        )
        self.retention = Gauge(
            "schedlock_history_retention_seconds",
            "The retention this sidecar prunes each finished state by (0: kept forever).",
            ("state",),
            registry=r,
        )
        self.table_bytes = Gauge(
            "schedlock_history_table_bytes",
            "Size on disk of each schedlock table, indexes and TOAST included (PostgreSQL), at "
            "this sidecar's last look.",
            ("table",),
            registry=r,
        )
        self.build = Info(
            "schedlock_build", "Build information.", {"version": __version__}, registry=r
        )

    def init_key(self, scheduler: str, namespace: str, target: str) -> None:
        """Export every series of a key from the start, so absent means a dead exporter."""
        labels = (scheduler, namespace, target)
        self.leader.labels(*labels).set(0)
        self.foreign_holder.labels(*labels).set(0)
        self.term.labels(*labels).set(0)
        self.backlog.labels(*labels).set(0)
        self.oldest_due_age.labels(*labels).set(0)
        self.handover_gap.labels(*labels)
        self.lateness.labels(*labels)
        self.last_tick.labels(*labels)
        for role in ROLES:
            self.role.labels(*labels, role).set(0)
        for direction in ("acquired", "lost", "released"):
            self.transitions.labels(*labels, direction)
        for outcome in OUTCOMES:
            self.fires.labels(*labels, outcome)

    def init_history(self, retention: Mapping[str, float]) -> None:
        """Export the history series of a sidecar that prunes (``retention``: state -> s)."""
        for table in TABLES:
            self.pruned.labels(table)
        for state in FINISHED_STATES:
            self.retention.labels(state).set(retention[state])
            self.oldest_finished_age.labels(state).set(0)

    def count_pruned(self, table: str, rows: int) -> None:
        """A committed pruning batch (counted as it commits, not when its pass ends)."""
        self.pruned.labels(table).inc(rows)

    def observe_pass(self, report: PassReport) -> None:
        """A pruning attempt's look at the history (its rows were counted batch by batch)."""
        if report.stats is None:
            return
        for state, age in report.stats.oldest().items():
            self.oldest_finished_age.labels(state).set(max(age or 0.0, 0.0))
        for table, size in report.stats.sizes().items():
            if size is not None:
                self.table_bytes.labels(table).set(size)
