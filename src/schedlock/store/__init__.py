"""The database contract: the one module that talks to PostgreSQL or SQLite.

Domain verbs only — callers never see SQL or a driver.  :class:`Store` and
:class:`LockSession` are the contract; :func:`open_store` picks the dialect from the URL
(``postgresql://…`` or ``sqlite:///path``).  The verbs are written once
(:mod:`schedlock.store.verbs`) over a connector per dialect (:mod:`schedlock.store.postgres`,
:mod:`schedlock.store.sqlite`) that runs named queries (``queries/common.sql`` for both,
``queries/<dialect>.sql`` for the rest); migrations in ``migrations/NNNN_name.<dialect>.sql``
have the same ids and order on both dialects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from schedlock.core.aio import Backoff, sleep_unless
from schedlock.core.logs import Event
from schedlock.core.redact import redact
from schedlock.core.settings import DEFAULT_SCHEMA
from schedlock.store.contract import HeldLock, LockSession, Store
from schedlock.store.errors import (
    BadDatabaseUrl,
    ConnectionsExhausted,
    LeadershipLost,
    LockKeyCollision,
    MigrationRefused,
    MissingPrivileges,
    NamespaceNotServed,
    ReadOnlyServer,
    SchemaChanged,
    SchemaError,
    SchemaNotCurrent,
    SchemaTooNew,
    StoreError,
    StoreUnavailable,
    UnlockFailed,
    UnsafeConnection,
    schema_too_new,
    summary,
)
from schedlock.store.keys import (
    LEADER_CLASS_ID,
    SCHEDLOCK_CLASS_ID,
    STANDBY_CLASS_ID,
    SYNC_LOCK_OBJID,
    LockKey,
    TargetLock,
)
from schedlock.store.models import (
    EVERY_NAMESPACE,
    RECORDED_OUTCOMES,
    SWEEP_PAGE,
    Channel,
    ClaimResult,
    Completion,
    DueSchedule,
    FireRow,
    ForeignHolder,
    GrantReport,
    GrantRequest,
    Heartbeat,
    KeyStatus,
    PublishRecord,
    PublishSpec,
    RecordedOutcome,
    ReserveRoster,
    RowState,
    RowVersion,
    ScheduleAdvance,
    ScheduleRecord,
    ScheduleSpec,
    SchemaStatus,
    ServedNamespaces,
    SessionBudget,
    SweepPosition,
    SyncCursor,
    TermStart,
    UpsertResult,
)

SCHEMA_RETRY_FIRST = 0.5  # seconds: waiting for a usable schema, doubling to SCHEMA_RETRY_CAP
SCHEMA_RETRY_CAP = 10.0

__all__ = [
    "EVERY_NAMESPACE",
    "LEADER_CLASS_ID",
    "RECORDED_OUTCOMES",
    "SCHEDLOCK_CLASS_ID",
    "STANDBY_CLASS_ID",
    "SWEEP_PAGE",
    "SYNC_LOCK_OBJID",
    "BadDatabaseUrl",
    "Channel",
    "ClaimResult",
    "Completion",
    "ConnectionsExhausted",
    "DueSchedule",
    "FireRow",
    "ForeignHolder",
    "GrantReport",
    "GrantRequest",
    "Heartbeat",
    "HeldLock",
    "KeyStatus",
    "LeadershipLost",
    "LockKey",
    "LockKeyCollision",
    "LockSession",
    "MigrationRefused",
    "MissingPrivileges",
    "NamespaceNotServed",
    "PublishRecord",
    "PublishSpec",
    "ReadOnlyServer",
    "RecordedOutcome",
    "ReserveRoster",
    "RowState",
    "RowVersion",
    "ScheduleAdvance",
    "ScheduleRecord",
    "ScheduleSpec",
    "SchemaChanged",
    "SchemaError",
    "SchemaNotCurrent",
    "SchemaStatus",
    "SchemaTooNew",
    "ServedNamespaces",
    "SessionBudget",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "SweepPosition",
    "SyncCursor",
    "TargetLock",
    "TermStart",
    "UnlockFailed",
    "UnsafeConnection",
    "UpsertResult",
    "ensure_schema",
    "open_store",
    "summary",
    "wait_for_schema",
]


async def ensure_schema(
    store: Store,
    *,
    migrate: bool,
    component: str | None = None,
    namespaces: Sequence[str] = (),
) -> None:
    """Migrate when asked, then require a schema this binary runs on (its own, or a newer one
    whose every newer migration is additive) and, for a ``component`` (``sidecar`` or
    ``operator``), every privilege it needs, and that the role may serve each of
    ``namespaces`` (``*``: every namespace, an operator watching the whole cluster).

    Raises SchemaTooNew, SchemaNotCurrent, MissingPrivileges (or StoreUnavailable): callers
    retry and report; NamespaceNotServed, which no retry fixes.
    """
    if migrate:
        await store.migrate()
    status = await store.schema_status()
    if status.too_new:
        raise schema_too_new(status.current, status.latest, status.blocking)
    if status.current < status.latest and status.usable:
        raise SchemaNotCurrent(
            f"schema at migration {status.current}, {status.latest} needed: "
            "run `schedlock migrate` with the owner role"
        )
    if not status.usable and component is None:
        raise MissingPrivileges(
            f"this role lacks USAGE on schema {status.location!r}, which holds schedlock's "
            "tables: as the schema owner run `schedlock migrate --grant-sidecar ROLE` (or "
            "--grant-operator) for it"
        )
    if component is not None:
        role, missing = await store.missing_privileges(component)
        if missing:
            raise MissingPrivileges(
                f"role {role!r} lacks {', '.join(missing)}: as the schema owner run "
                f"`schedlock migrate --grant-{component} {role}`",
                summary=f"privileges missing: as the schema owner run "
                f"`schedlock migrate --grant-{component} ROLE` (the log names the role and "
                "the privileges)",
            )
    if not namespaces:
        return
    served = await store.served_namespaces()
    unserved = [namespace for namespace in namespaces if not served.covers(namespace)]
    if not unserved:
        return
    grant = f"schedlock migrate --grant-{component or 'sidecar'} {served.role}"
    if unserved[0] == EVERY_NAMESPACE:
        raise NamespaceNotServed(
            f"role {served.role!r} may not serve every namespace: as the schema owner run "
            f"`{grant}`, or watch only the namespaces it serves (watchNamespaces)"
        )
    raise NamespaceNotServed(
        f"role {served.role!r} may not serve namespace{'s' if len(unserved) > 1 else ''} "
        f"{', '.join(map(repr, unserved))}: as the schema owner run "
        f"`{grant} {' '.join(f'--namespace {ns}' for ns in unserved)}`"
    )


async def wait_for_schema(
    store: Store,
    *,
    migrate: bool,
    component: str,
    namespaces: Sequence[str] = (),
    stopping: asyncio.Event,
    report: Callable[[StoreError | None], None],
    log: logging.Logger,
    fatal: tuple[type[StoreError], ...] = (),
) -> bool:
    """:func:`ensure_schema` with the kit's back-off (0.5 s doubling to 10 s, with jitter) until
    it passes or ``stopping``.

    A database that is down, not migrated, newer than this binary or missing privileges never
    ends the process: each failure is logged and handed to ``report`` (the caller's readiness
    reason), and success reports None.  Errors in ``fatal`` propagate.  False when stopped.
    """
    backoff = Backoff(SCHEMA_RETRY_FIRST, SCHEMA_RETRY_CAP)

    # Each failure: the caller's readiness shows its summary (words), the log has both (the
    # detail was scrubbed of the URL's secrets when the store made the error).
    def failed(exc: StoreError, level: int, message: str, event: Event, **more: object) -> None:
        report(exc)
        log.log(
            level, message, extra={"event": event, "reason": exc.summary, "error": str(exc), **more}
        )

    while not stopping.is_set():
        delay = round(backoff.next(), 2)
        try:
            await ensure_schema(store, migrate=migrate, component=component, namespaces=namespaces)
        except fatal:
            raise
        except SchemaTooNew as exc:
            # Refuse to run, but stay up and say why: `schedlock migrate --to` run by the
            # newer release, or an upgraded image, fixes it without a crash loop.
            message = "database schema is newer than this binary"
            failed(exc, logging.ERROR, message, Event.DATABASE_SCHEMA_NEWER)
        except (StoreUnavailable, SchemaNotCurrent) as exc:
            message = "database not ready, retrying"
            failed(exc, logging.WARNING, message, Event.DATABASE_NOT_READY, retry_in_s=delay)
        except StoreError as exc:
            message = "database not usable yet, retrying"
            failed(exc, logging.WARNING, message, Event.DATABASE_NOT_USABLE, retry_in_s=delay)
        else:
            report(None)
            return True
        await sleep_unless(delay, stopping)
    return False


def open_store(
    url: str,
    *,
    application_name: str = "schedlock",
    pool_size: int = 0,
    schema: str = DEFAULT_SCHEMA,
) -> Store:
    """The store for a database URL (no I/O happens until a verb is called).

    ``pool_size`` > 0: PostgreSQL admin verbs share a pool of at most that many sessions
    (0: one connection per verb); SQLite has one connection whatever it says.  ``schema``:
    PostgreSQL's schema for schedlock's tables (SQLite has none).
    """
    from schedlock.store.verbs import SqlStore

    scheme = url.split(":", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        from schedlock.store.postgres import PostgresConnector

        return SqlStore(
            PostgresConnector(
                url, application_name=application_name, pool_size=pool_size, schema=schema
            )
        )
    if scheme == "sqlite":
        from schedlock.store.sqlite import SqliteConnector

        return SqlStore(SqliteConnector(url))
    raise BadDatabaseUrl(f"unsupported database URL: {redact(url)}")
