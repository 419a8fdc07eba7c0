"""Plain data exchanged with the store: no driver types cross this boundary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class RowState(StrEnum):
    """A row's state (the ``state`` column of ``schedlock_publishes``).

    A row moves scheduled -> firing -> published | failed | missed (or back to scheduled for
    a retry) only on the lock session of its scheduler's key.
    """

    SCHEDULED = "scheduled"
    FIRING = "firing"
    PUBLISHED = "published"
    FAILED = "failed"
    MISSED = "missed"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"


# The outcomes an object's status may already record (a row is never fired again after one).
RECORDED_OUTCOMES = frozenset({RowState.PUBLISHED, RowState.FAILED, RowState.MISSED})


class Channel(StrEnum):
    """The NOTIFY channels (PostgreSQL; SQLite relies on timers and the safety poll)."""

    ROWS = "schedlock_rows"
    """A row became due-able (migration 0001's triggers): payload ``scheduler/namespace/target``."""
    OUTCOMES = "schedlock_outcomes"
    """A batch of outcomes was recorded: JSON with the key, the term and the row ``ids``."""


@dataclass(frozen=True)
class FireRow:
    """A row claimed (or adopted as an orphan) by the leader, ready to deliver."""

    id: int
    uid: str
    namespace: str
    name: str
    target: str
    due_at: datetime
    payload: dict[str, Any]
    attempt: int
    max_attempts: int
    backoff_seconds: float
    starting_deadline_seconds: int | None
    db_now: datetime
    orphan: bool = False
    problem: str | None = None
    """Why the row must end ``failed`` without being sent (its payload cannot be read, or a
    crashed leader's row has no attempts left); None: deliver it."""
    counted: bool = True
    """The claim counted an attempt for this row (False: an orphan ended without one)."""


@dataclass(frozen=True)
class Completion:
    """What happened to one claimed row."""

    id: int
    outcome: str
    """published, retry, failed or missed."""
    next_attempt_at: datetime | None = None
    """When a retry is due (None: unchanged)."""
    status: int | None = None
    """The app's HTTP status, if it answered."""
    error: str | None = None
    sent: bool = True
    """False: the request never left (the claim's attempt is given back)."""


@dataclass(frozen=True)
class TermStart:
    term: int
    previous_holder: str | None
    gap_seconds: float | None
    previous_released: bool


@dataclass(frozen=True)
class Heartbeat:
    alive: bool
    backlog: int
    oldest_due_age: float | None


@dataclass(frozen=True)
class ClaimResult:
    rows: list[FireRow]
    next_due_in: float | None  # seconds until the next scheduled row (None: nothing scheduled)


@dataclass(frozen=True)
class DueSchedule:
    id: int
    uid: str
    namespace: str
    name: str
    target: str
    expression: str
    time_zone: str
    starting_deadline_seconds: int | None
    watermark_at: datetime | None
    db_now: datetime


@dataclass(frozen=True, kw_only=True)
class ScheduleAdvance:
    """Where a recurring schedule moves after a materializing pass (its fields are the
    ``advance_schedule`` query's parameters)."""

    watermark_at: datetime
    """Slots up to here are dealt with."""
    next_slot_at: datetime
    """When the schedule is next due."""
    fired_slot_at: datetime | None
    """The slot a row was inserted for (the schedule's ``last_slot_at``); None: none fired."""


@dataclass(frozen=True, kw_only=True)
class RowSpec:
    """What a one-shot publish and a schedule share, as the operator or CLI declares them
    (keyed by ``uid``; its fields are the upsert queries' parameters, by name)."""

    namespace: str
    name: str
    uid: str
    target: str
    payload: dict[str, Any] = field(default_factory=dict)
    generation: int = 1
    max_attempts: int = 3
    backoff_seconds: float = 1.0
    starting_deadline_seconds: int | None = None
    suspended: bool = False


@dataclass(frozen=True, kw_only=True)
class PublishSpec(RowSpec):
    """A one-shot publish."""

    due_at: datetime


@dataclass(frozen=True, kw_only=True)
class ScheduleSpec(RowSpec):
    """A recurring schedule (cron or ``@every``)."""

    expression: str
    time_zone: str = "UTC"


@dataclass(frozen=True)
class UpsertResult:
    id: int | None  # None: an equal or newer generation was already stored (nothing changed)
    state: str | None
    inserted: bool


@dataclass(frozen=True)
class PublishRecord:
    id: int
    scheduler: str
    namespace: str
    name: str
    uid: str
    generation: int
    target: str
    due_at: datetime
    next_attempt_at: datetime
    payload: dict[str, Any]
    state: str
    attempts: int
    max_attempts: int
    term: int | None
    holder: str | None
    last_status: int | None
    last_error: str | None
    fired_at: datetime | None
    finished_at: datetime | None
    problem: str | None = None  # why the payload could not be read (then it is {})


@dataclass(frozen=True)
class KeyStatus:
    scheduler: str
    namespace: str
    target: str
    term: int
    holder: str | None  # holder recorded with the current term
    lock_holder: str | None  # application_name of the session holding the lock right now
    waiters: int
    since: datetime | None
    heartbeat_at: datetime | None
    released_at: datetime | None
    backlog: int
    next_due: datetime | None
    last_fire: datetime | None
    # application_name of each session waiting for the lock (the standbys), and the holders of
    # the live reserve rows (replicas with no session, checking rarely for a standby place).
    standbys: tuple[str, ...] = ()
    reserves: tuple[str, ...] = ()
    # A session of a role that may not serve the namespace holding the key's lock (PostgreSQL).
    foreign_holder_role: str | None = None
    foreign_holder_pid: int | None = None


@dataclass(frozen=True)
class ForeignHolder:
    """A session holding a key's advisory lock whose login role may not serve the key's
    namespace (lock squatting: advisory locks have no ACL; migration 0009)."""

    pid: int  # its backend pid (what `pg_terminate_backend` takes)
    role: str  # its login role


# What a waiter hears of a foreign holder of its lock (None: gone), and what a listener is
# handed for each notification (its text, or its bytes when the encoding cannot decode them).
OnHolder = Callable[[ForeignHolder | None], None]
OnPayload = Callable[[str | bytes], None]


@dataclass(frozen=True)
class ReserveRoster:
    """A reserve's place among the live reserves of its key, read at one of its checks."""

    db_now: float  # Unix time on the database clock, which all reserves share
    rank: int  # 0-based position of this holder among the live reserves, by name
    reserves: int  # live reserves of the key, this one counted


EVERY_NAMESPACE = "*"
"""The namespace mapping's word for every namespace (migration 0008): a single-tenant role."""


@dataclass(frozen=True)
class SessionBudget:
    """The database's sessions as schedlock's replicas use them now (``schedlock status``): a
    leader's one session serves every key of its target, a standby's waits for all of them;
    reserves hold none.  ``max_connections`` is None where the database has no such limit."""

    leaders: int
    standbys: int
    sessions: int  # distinct sessions holding or waiting for any schedlock lock
    client_sessions: int  # every client session of the server, schedlock's and the apps'
    max_connections: int | None


@dataclass(frozen=True)
class ServedNamespaces:
    """The connected role and the namespaces it may serve (migration 0008's mapping, which
    row-level security enforces): ``*`` every one, none at all when it was never granted."""

    role: str
    namespaces: tuple[str, ...]

    @property
    def every(self) -> bool:
        return EVERY_NAMESPACE in self.namespaces

    def covers(self, namespace: str) -> bool:
        """Whether the role may serve ``namespace`` (``*``: whether it serves every one)."""
        return self.every or namespace in self.namespaces


@dataclass(frozen=True, kw_only=True)
class GrantRequest:
    """Whom ``schedlock migrate --grant-…`` grants to and what they may serve."""

    sidecar_role: str | None = None
    operator_role: str | None = None
    namespaces: tuple[str, ...] = ()
    """Added to each role's namespaces (none: every namespace, ``*``, single-tenant)."""
    only: bool = False
    """The namespaces replace the role's instead of adding to them."""
    narrow: bool = False
    """Revoke the table-wide writes an earlier release granted the sidecar's role."""

    @property
    def scope(self) -> tuple[str, ...]:
        return self.namespaces or (EVERY_NAMESPACE,)


@dataclass(frozen=True)
class GrantReport:
    """What ``schedlock migrate --grant-…`` did (empty on SQLite, which has no roles)."""

    serves: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Each role granted to, and every namespace it may serve now (``*``: every one)."""
    revoked_public_create: str | None = None
    """The schema from which CREATE was revoked from PUBLIC (None: PUBLIC could not create)."""
    columns_only: list[str] = field(default_factory=list)
    """Sidecar roles that may now update only the columns a sidecar's loops change."""
    narrowed: list[str] = field(default_factory=list)
    """Sidecar roles whose table-wide writes (earlier releases' grants) were revoked, leaving
    the columns and functions of migration 0010 (``--narrow``)."""
    table_wide: list[str] = field(default_factory=list)
    """Sidecar roles that still hold an earlier release's table-wide writes (no ``--narrow``)."""
    kept_broad: list[str] = field(default_factory=list)
    """Sidecar roles left with table-wide writes because they are the operator's role too."""


@dataclass(frozen=True)
class SchemaStatus:
    """Where the database's schema is against what this binary knows."""

    current: int
    """The last migration applied to the database (0: none)."""
    latest: int
    """The last migration this binary ships."""
    blocking: int | None = None
    """When ``current > latest``: the first migration beyond ``latest`` that is not additive,
    which this binary cannot run on (None: every one is additive, and it runs)."""
    location: str | None = None
    """PostgreSQL's schema holding the tables (the configured one, or ``public`` for an install
    an earlier release made there); None on SQLite."""
    usable: bool = True
    """False: the schema holds an install this role lacks USAGE on (``current`` reads 0:
    PostgreSQL leaves such a schema off the role's path)."""

    @property
    def too_new(self) -> bool:
        """The schema is beyond what this binary runs on."""
        return self.current > self.latest and self.blocking is not None


@dataclass(frozen=True)
class ScheduleRecord:
    id: int
    uid: str
    namespace: str
    name: str
    generation: int
    target: str
    expression: str
    time_zone: str
    state: str
    watermark_at: datetime | None
    last_slot_at: datetime | None
    next_slot_at: datetime | None


@dataclass(frozen=True)
class RowVersion:
    """What the operator's re-assertion compares: a row's uid, generation and state."""

    kind: str  # "publish" (a one-shot row) or "schedule"
    uid: str
    generation: int
    state: str


@dataclass(frozen=True)
class RecordedOutcome:
    """A terminal outcome an object's status already records, to restore a lost row in it."""

    state: str  # published | failed | missed
    attempts: int = 0
    fired_at: datetime | None = None
    last_error: str | None = None
    term: int | None = None
    holder: str | None = None


# -- retention (schedlock.store.retention) ------------------------------------------------------


@dataclass(frozen=True)
class MaintenanceLease:
    """Who holds a maintenance task's lease, and until when (database clock)."""

    holder: str | None
    lease_until: datetime | None


@dataclass(frozen=True)
class HistoryStats:
    """How much history the tables keep: the oldest row of each finished state (seconds;
    None: no such row) and each table's size on disk (bytes; None: not known, SQLite)."""

    published_age_seconds: float | None = None
    cancelled_age_seconds: float | None = None
    failed_age_seconds: float | None = None
    missed_age_seconds: float | None = None
    publishes_bytes: float | None = None
    schedules_bytes: float | None = None
    terms_bytes: float | None = None
    reserves_bytes: float | None = None

    def oldest(self) -> dict[str, float | None]:
        """Finished state -> age of its oldest row."""
        return {
            RowState.PUBLISHED: self.published_age_seconds,
            RowState.CANCELLED: self.cancelled_age_seconds,
            RowState.FAILED: self.failed_age_seconds,
            RowState.MISSED: self.missed_age_seconds,
        }

    def sizes(self) -> dict[str, float | None]:
        """Table (without the ``schedlock_`` prefix) -> bytes on disk."""
        return {
            "publishes": self.publishes_bytes,
            "schedules": self.schedules_bytes,
            "terms": self.terms_bytes,
            "reserves": self.reserves_bytes,
        }


@dataclass(frozen=True)
class SyncCursor:
    """Where the operator's status sync resumes: its stored watermark (None: no cursor yet)
    and the database clock, read together."""

    watermark_at: datetime | None
    now: datetime


SWEEP_PAGE = 500  # rows per read of the operator's sweep (a shorter page is the last)


@dataclass(frozen=True)
class SweepPosition:
    """Where the operator's sweep goes on: rows changed at ``at`` with an id above
    ``after_id``, then every row changed after ``at`` (database clock)."""

    at: datetime
    after_id: int = 0
