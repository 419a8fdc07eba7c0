"""The PostgreSQL store: admin verbs on short-lived connections, one dedicated session per lock.

Connections are never shared between a lock and anything else (DESIGN invariant 1): a
:class:`PostgresLockSession` owns one autocommit connection for the lock, its heartbeat and
every state change of the rows its scheduler owns.  The leader's LISTEN rides on that same
session (:meth:`PostgresLockSession.listen`); only the operator's LISTEN has its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import logging
import os
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.abc import Buffer, PQGen
from psycopg.adapt import AdaptersMap, Loader
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from schedlock.core.aio import TaskSlot
from schedlock.core.logs import Event
from schedlock.core.redact import inspect, scrub
from schedlock.core.settings import DEFAULT_SCHEMA
from schedlock.core.timings import LeaseTimings
from schedlock.store import queries
from schedlock.store.errors import (
    BadDatabaseUrl,
    ConnectionsExhausted,
    LeadershipLost,
    LockKeyCollision,
    MigrationRefused,
    ReadOnlyServer,
    SchemaChanged,
    StoreError,
    StoreUnavailable,
    UnlockFailed,
    UnsafeConnection,
    failure_words,
    is_exhausted,
)
from schedlock.store.keys import (
    MIGRATIONS_OBJID,
    SCHEDLOCK_CLASS_ID,
    STANDBY_CLASS_ID,
    LockKey,
    TargetLock,
)
from schedlock.store.models import (
    ForeignHolder,
    GrantReport,
    GrantRequest,
    OnHolder,
    OnPayload,
    ReserveRoster,
    ServedNamespaces,
)
from schedlock.store.notices import FOREIGN_HOLDER_NOTICE, parse_foreign_holder
from schedlock.store.rows import Codec, Params, Row, from_row, stored_payload
from schedlock.store.verbs import LockVerbs

if TYPE_CHECKING:  # the pool is imported where it is opened: a sidecar never opens one
    from psycopg_pool import AsyncConnectionPool

log = logging.getLogger("schedlock.store")
Q = queries.load("postgres")
T = TypeVar("T")
RV = TypeVar("RV")

# How often psycopg wakes a connection that waits on its socket when nothing arrives: it checks
# for a Ctrl-C every 0.1 s by default, a synchronous program's concern (an asyncio task is
# cancelled through its future, at once, whatever this is).  Every idle leader (its LISTEN) and
# every standby (its lock wait) waits so for as long as it leads or stands by: at psycopg's
# default that was 10 wake-ups a second each, most of an idle sidecar's CPU.
QUIET_WAIT_SECONDS = 10.0


class QuietConnection(psycopg.AsyncConnection[DictRow]):
    """Every session of both components: psycopg's connection, woken by its socket (data, a
    closed or reset connection, the TCP keepalives' verdict) or its deadline, not by a timer
    every 0.1 s (:data:`QUIET_WAIT_SECONDS`)."""

    async def wait(
        self,
        gen: PQGen[RV],
        interval: float = QUIET_WAIT_SECONDS,
        timeout: float | None = None,  # noqa: ASYNC109 (psycopg's own signature)
    ) -> RV:
        return await super().wait(gen, interval=interval, timeout=timeout)


Conn = QuietConnection


def _dump_json(value: Any) -> Any:
    """Dicts and lists of dicts as jsonb; a list of scalars stays an array parameter."""
    if isinstance(value, list) and not any(isinstance(v, dict) for v in value):
        return value
    return Jsonb(value)


class _JsonText(Loader):
    """json and jsonb columns arrive as the server's text, undecoded: psycopg's own loader
    runs json.loads inside the fetch, where one row's payload too deep or too big to decode
    (RecursionError, MemoryError) fails the whole batch.  Each row's payload is decoded on its
    own instead, with its bounds checked (schedlock.store.rows.stored_payload, as on SQLite)."""

    def load(self, data: Buffer) -> str:
        return bytes(data).decode("utf-8")


ADAPTERS = AdaptersMap(psycopg.adapters)
for _type in ("json", "jsonb"):
    ADAPTERS.register_loader(_type, _JsonText)

CODEC = Codec(
    timestamp=lambda v: v.astimezone(UTC),
    payload=stored_payload,
    dump_timestamp=lambda v: v,
    dump_json=_dump_json,
)
# A pooled verb waits this long for a session before asking the server directly why none
# came (the pool retries connections in the background and would keep the reason to itself).
POOL_WAIT_SECONDS = 5.0
UNSAFE_POOLER = (
    "the database connection does not keep one server session (a pooler in transaction mode, "
    "e.g. PgBouncer pool_mode=transaction?): advisory locks would guard nothing; connect "
    "directly or through a session-mode pooler"
)


# Least privileges per runtime role: (privileges, objects); a privilege may name its columns.
# No role but the owner gets DDL.  A sidecar changes only the columns its loops change (claim,
# complete, orphans; heartbeat, release, last fire; a schedule's progress; its roster row) and
# never a row's payload, due time, target, namespace, name, uid or attempt limit: the writes
# that cross those lines go through migration 0010's functions (a slot row copied from its
# schedule, the term bump).  It registers a key with the key's own columns only (0008's policy
# holds them to the key's lock ids).
SIDECAR_GRANTS = (
    (
        "SELECT",
        (
            "TABLE schedlock_publishes",
            "TABLE schedlock_terms",
            "TABLE schedlock_schedules",
            "TABLE schedlock_migrations",
        ),
    ),
    (
        "UPDATE (state, attempts, term, holder, next_attempt_at, last_status, last_error, "
        "fired_at, finished_at, updated_at)",
        ("TABLE schedlock_publishes",),
    ),
    ("INSERT (scheduler, namespace, target, lock_classid, lock_objid)", ("TABLE schedlock_terms",)),
    ("UPDATE (heartbeat_at, released_at, last_fire_at)", ("TABLE schedlock_terms",)),
    (
        "UPDATE (watermark_at, next_slot_at, last_slot_at, updated_at)",
        ("TABLE schedlock_schedules",),
    ),
    # Reserves enlist, refresh and prune their own key's roster rows (no session held).
    ("SELECT, INSERT, DELETE", ("TABLE schedlock_reserves",)),
    ("UPDATE (checked_at, next_check_at, expires_at)", ("TABLE schedlock_reserves",)),
    (
        "EXECUTE",
        (
            "FUNCTION schedlock_insert_slot(bigint, timestamptz, bigint, integer)",
            "FUNCTION schedlock_begin_term(text, text, text, text)",
        ),
    ),
)
# What releases before migration 0010 granted a sidecar and this one narrows to columns and
# functions: revoked by `migrate --grant-sidecar` (never by the migration, so that binaries of
# schemas 8 and 9 keep running until the owner re-grants), unless the role holds the operator's too.
SIDECAR_NARROWED = (
    ("INSERT, UPDATE", ("TABLE schedlock_publishes", "TABLE schedlock_terms")),
    ("UPDATE", ("TABLE schedlock_schedules", "TABLE schedlock_reserves")),
    ("USAGE", ("SEQUENCE schedlock_publishes_id_seq",)),
)
# A privilege and, in parentheses, its columns: "UPDATE (state, term)".
_PRIVILEGE = re.compile(r"(\w+)(?:\s*\(([^)]*)\))?")
OPERATOR_GRANTS = (
    ("SELECT, INSERT, UPDATE", ("TABLE schedlock_publishes", "TABLE schedlock_schedules")),
    ("SELECT", ("TABLE schedlock_terms", "TABLE schedlock_migrations", "TABLE schedlock_reserves")),
    ("USAGE", ("SEQUENCE schedlock_publishes_id_seq", "SEQUENCE schedlock_schedules_id_seq")),
    # The status sync's cursor (0006): read where it resumes, upsert it after each sweep.
    ("SELECT, INSERT, UPDATE", ("TABLE schedlock_sync_cursors",)),
)
GRANTS = {"sidecar": SIDECAR_GRANTS, "operator": OPERATOR_GRANTS}
Grants = tuple[tuple[str, tuple[str, ...]], ...]
# Pruning (schedlock.store.retention), granted with the rest but not required to start: a role
# without them runs as before and only cannot prune (its log says so, with the fix).
PRUNE_GRANTS = (
    (
        "DELETE",
        ("TABLE schedlock_publishes", "TABLE schedlock_schedules", "TABLE schedlock_terms"),
    ),
    ("SELECT, DELETE", ("TABLE schedlock_reserves",)),
    ("SELECT, UPDATE", ("TABLE schedlock_maintenance",)),
)
# Writing a role's row-level security policies (migration 0011, when a grant changes what it may
# serve) takes an ACCESS EXCLUSIVE lock on the four tables: every statement of the sidecars on
# them queues behind the grant while it waits.  So it waits at most this long per try, and tries
# again after a pause (the sidecars' statements last milliseconds; a long transaction on the
# tables, e.g. a pg_dump, makes the grant fail with the reason instead of stalling the leaders).
POLICY_LOCK_TIMEOUT_MS = 200
POLICY_LOCK_ATTEMPTS = 25
POLICY_LOCK_PAUSE_SECONDS = 0.3
AFFINITY_PROBES = 1  # each probe is one more server connection for a moment
# A lock wait holds a snapshot this long at most (the ``lock`` query says why); a slice costs
# the server one subtransaction and a commit, the client nothing.
LOCK_WAIT_SLICE_MS = 1000
_AFFINITY_LOCKS: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}


def _affinity_lock() -> asyncio.Lock:
    """One affinity check at a time per process: our own sessions must not mask a pooler."""
    loop = asyncio.get_running_loop()
    if loop not in _AFFINITY_LOCKS:
        _AFFINITY_LOCKS[loop] = asyncio.Lock()
    return _AFFINITY_LOCKS[loop]


async def _guard(call: Awaitable[T]) -> T:
    """Translate driver errors into the store's own, chained to the cause."""
    try:
        return await call
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        # The server became read-only under an open session (default_transaction_read_only
        # set and reloaded): retryable, and never a write that half happened.
        raise _failure(ReadOnlyServer, exc, suffix=": the server is read-only") from exc
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise _failure(StoreUnavailable, exc) from exc
    except (
        psycopg.errors.UndefinedTable,
        psycopg.errors.UndefinedColumn,
        psycopg.errors.UndefinedFunction,
    ) as exc:
        raise SchemaChanged(
            f"the database schema changed under this process ({_describe(exc)}): "
            "was it taken down with `schedlock migrate --to`?"
        ) from exc
    except psycopg.Error as exc:
        raise _failure(StoreError, exc) from exc


E = TypeVar("E", bound=StoreError)


def lock_statement(classid: int, objid: int, namespace: str | None = None) -> str:
    """The ``lock`` statement for these lock ids: waits until granted, never holding a
    snapshot longer than :data:`LOCK_WAIT_SLICE_MS` (the query says why).  With the key's
    ``namespace``, each slice also looks at who holds the lock and says a foreign holder in a
    notice (``lock_after_slice``, :data:`FOREIGN_HOLDER_NOTICE`)."""
    ids = {"classid": int(classid), "objid": int(objid)}
    after_slice = (
        ""
        if namespace is None
        else Q["lock_after_slice"].format(**ids, namespace_hex=namespace.encode("utf-8").hex())
        + ";"
    )
    return Q["lock"].format(**ids, slice_ms=LOCK_WAIT_SLICE_MS, after_slice=after_slice)


def _foreign_holder_notices(
    conn: Conn, on_holder: OnHolder
) -> Callable[[psycopg.errors.Diagnostic], None]:
    """Hand each foreign-holder notice of the ``lock`` statement to ``on_holder``, as it
    arrives (psycopg calls notice handlers while the statement still runs)."""

    def handler(diagnostic: psycopg.errors.Diagnostic) -> None:
        if diagnostic.message_primary == FOREIGN_HOLDER_NOTICE:
            on_holder(parse_foreign_holder(diagnostic.message_detail))

    conn.add_notice_handler(handler)
    return handler


def _failure(cls: type[E], exc: psycopg.Error, url: str = "", suffix: str = "") -> E:
    """The store's error for a driver error: its detail scrubbed of the URL's secrets (a
    driver message may quote the connection string), its summary from the SQLSTATE."""
    return cls(
        f"{_describe(exc, url)}{suffix}",
        summary=failure_words(getattr(exc, "sqlstate", None), str(exc)),
    )


def _describe(exc: BaseException, url: str = "") -> str:
    text = str(exc).strip()
    return scrub(text.splitlines()[0], url) if text else type(exc).__name__


def connect_kwargs(application_name: str, connect_timeout: float = 5) -> dict[str, Any]:
    """How every session connects: autocommit, rows as dicts, our name, TCP keepalives."""
    return {
        "autocommit": True,
        "row_factory": dict_row,
        "application_name": application_name[:63],
        "context": ADAPTERS,
        "connect_timeout": max(1, int(connect_timeout)),
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
    }


async def connect(
    url: str, *, application_name: str, schema: str = DEFAULT_SCHEMA, connect_timeout: float = 5
) -> Conn:
    """Open a session on a writable primary, its ``search_path`` on schedlock's schema, or
    raise (every session of both components comes through here, so neither leads nor writes on
    a standby or a read-only server, nor looks for a table anywhere else).

    A multi-host URL (``postgresql://a:5432,b:5432/db?target_session_attrs=read-write``) is
    libpq's own way to find the primary; the check below refuses whatever it lands on that
    is in recovery or read-only, with a reason naming the server.

    A URL libpq would refuse, or misread (part of the password taken for a host), never
    reaches it: libpq's parse errors quote the string they could not parse.
    """
    problem = inspect(url).problem
    if problem is not None:
        raise BadDatabaseUrl(problem)
    try:
        conn: Conn = await QuietConnection.connect(
            url, **connect_kwargs(application_name, connect_timeout)
        )
    except psycopg.ProgrammingError:
        # A string libpq parses otherwise than we do: say so, quoting none of its message.
        # Not chained: the cause's message is the one that quotes the string.
        raise BadDatabaseUrl("the URL could not be parsed (libpq refused it)") from None
    except psycopg.Error as exc:
        raise _failure(StoreUnavailable, exc, url) from exc
    await _writable_or_closed(conn, schema)
    return conn


def read_only_reason(
    server: str, *, in_recovery: bool, default_read_only: str, read_only: str
) -> str | None:
    """Why a server must not be led or written on (None: a writable primary)."""
    if in_recovery:
        return (
            f"server {server} is a standby (pg_is_in_recovery() is true): not leading or "
            "writing here; point the URL at the primary or list every server with "
            "target_session_attrs=read-write"
        )
    if default_read_only == "on" or read_only == "on":
        setting = (
            "default_transaction_read_only"
            if default_read_only == "on"
            else ("transaction_read_only")
        )
        return (
            f"server {server} is read-only ({setting} is on): not leading or writing here; "
            "point the URL at the primary or list every server with "
            "target_session_attrs=read-write"
        )
    return None


async def require_writable(conn: Conn, schema: str) -> None:
    """Raise ReadOnlyServer unless ``conn`` is on a writable primary; set its ``search_path``
    to ``schema`` (or to ``public`` where an earlier release installed schedlock and ``schema``
    holds no install), in the same round trip."""
    cur = await _guard(conn.execute(Q["session_setup"], {"schema": schema}))
    row = await _guard(cur.fetchone())
    if row is None:
        raise StoreError("query session_setup returned no row")
    reason = read_only_reason(
        f"{conn.info.host}:{conn.info.port}",
        in_recovery=bool(row["in_recovery"]),
        default_read_only=str(row["default_read_only"]),
        read_only=str(row["read_only"]),
    )
    if reason is not None:
        raise ReadOnlyServer(reason)


async def _writable_or_closed(conn: Conn, schema: str) -> None:
    """:func:`require_writable`, closing a session that fails it: a new one is never used,
    and a pooled one (the pool's check at every checkout) is never handed out again — the
    pool opens another wherever the URL leads now (after a fail-over, the primary)."""
    try:
        await require_writable(conn, schema)
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 2)
        raise


def _undecodable_notifications(conn: Conn, handle: Callable[[bytes], None]) -> None:
    """Hand a notification whose payload the connection's encoding cannot decode to ``handle``
    (its raw bytes) instead of raising.

    psycopg decodes each notification as it reads it, also while a statement's results are
    read; in a ``SQL_ASCII`` database any role may NOTIFY bytes that do not decode, and the
    ``UnicodeDecodeError`` would then break whatever statement was running on a listening
    connection (a leader's claim) and leave the connection out of step.  Channel names are
    ours (ASCII): it is only ever the payload that fails.
    """
    decode_or_raise = conn.pgconn.notify_handler

    def handler(note: Any) -> None:
        try:
            if decode_or_raise is not None:
                decode_or_raise(note)
        except UnicodeDecodeError:
            handle(bytes(note.extra))

    conn.pgconn.notify_handler = handler


async def _no_public_create(conn: Conn, report: GrantReport) -> GrantReport:
    """Revoke CREATE on the schema from PUBLIC (PostgreSQL 14 and older grant it, and upgraded
    databases keep it), then refuse if a granted role may still create there."""
    cur = await conn.execute(Q["schema_create"], {"roles": list(report.serves)})
    row = await cur.fetchone()
    assert row is not None
    schema = _name(row["schema"])
    revoked = None
    if row["public_may_create"]:
        await conn.execute(
            sql.SQL("REVOKE CREATE ON SCHEMA {} FROM PUBLIC").format(sql.Identifier(schema))
        )
        cur = await conn.execute(Q["schema_create"], {"roles": list(report.serves)})
        row = await cur.fetchone()
        assert row is not None
        if row["public_may_create"]:
            raise StoreError(
                f"PUBLIC may create objects in schema {schema!r} and this role cannot revoke it "
                f"(not the schema's owner): as its owner run "
                f"REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC, then grant again"
            )
        revoked = schema
    if row["creators"]:
        raise StoreError(
            f"role(s) {', '.join(row['creators'])} may create objects in schema {schema!r} "
            f"(granted to them or to a role they belong to): revoke it "
            f"(REVOKE CREATE ON SCHEMA {schema} FROM …) so that a runtime role has no DDL"
        )
    return dataclasses.replace(report, revoked_public_create=revoked)


def _policy_lock_refused(role: str) -> str:
    return (
        f"could not write the row-level security policies of role {role!r}: their tables stayed "
        f"locked by other transactions through {POLICY_LOCK_ATTEMPTS} tries of "
        f"{POLICY_LOCK_TIMEOUT_MS} ms (a long transaction on the schedlock tables, such as a "
        "pg_dump: see pg_stat_activity); nothing was granted, run the grant again when it ends"
    )


def privilege_checks(grants: Grants) -> list[tuple[str, tuple[str, ...], str]]:
    """Per privilege of ``grants``: the ``has_…_privilege`` function that tells whether the
    current role holds it, its arguments, and what the privilege is called when missing (a
    column privilege per column: a table-wide one, as earlier releases granted, includes it)."""
    checks: list[tuple[str, tuple[str, ...], str]] = []
    for privileges, objects in grants:
        for obj in objects:
            kind, name = obj.split(" ", 1)
            for match in _PRIVILEGE.finditer(privileges):
                privilege, columns = match.group(1), match.group(2)
                if columns is None:
                    probe = f"has_{kind.lower()}_privilege"
                    checks.append((probe, (name, privilege), f"{privilege} on {name}"))
                    continue
                for column in (c.strip() for c in columns.split(",")):
                    label = f"{privilege} ({column}) on {name}"
                    checks.append(("has_column_privilege", (name, column, privilege), label))
    return checks


async def _narrow_sidecar(
    conn: Conn, role: str, report: GrantReport, request: GrantRequest
) -> None:
    """With the request's ``narrow``, revoke what releases before migration 0010 granted a sidecar beyond its
    columns and functions (:data:`SIDECAR_NARROWED`), unless the role is the operator's too: it
    writes whole rows (its privileges would be revoked with them).  Without, only tell whether
    the role still holds them."""
    cur = await conn.execute(Q["sidecar_writes"], {"role": role})
    found = await cur.fetchone()
    assert found is not None
    if role == request.operator_role or found["operator"]:
        report.kept_broad.append(role)
    elif request.narrow:
        for privileges, objects in SIDECAR_NARROWED:
            for obj in objects:
                await conn.execute(
                    sql.SQL("REVOKE {} ON {} FROM {}").format(
                        sql.SQL(privileges), sql.SQL(obj), sql.Identifier(role)
                    )
                )
        report.narrowed.append(role)
        report.columns_only.append(role)
    elif found["table_wide"]:
        report.table_wide.append(role)
    else:
        report.columns_only.append(role)


def _name(value: object) -> str:
    """A name the catalogs returned: text, or bytes in a ``SQL_ASCII`` database (psycopg
    decodes nothing there); catalog names are ours or PostgreSQL's, UTF-8 or ASCII."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


async def _install_schema(conn: Conn) -> None:
    """Create the schema the session's search_path names when it does not exist yet (a first
    ``migrate``), after refusing a second install beside one in another schema: advisory lock
    ids and notification channels are the database's, so two installs would contend for each
    other's keys and wake each other's sidecars."""
    cur = await conn.execute(Q["schema_in_use"])
    row = await cur.fetchone()
    assert row is not None
    schema, elsewhere = _name(row["schema"]), [_name(n) for n in row["elsewhere"]]
    if elsewhere:
        raise MigrationRefused(
            f"schedlock is installed in schema {elsewhere[0]!r} of this database, and the "
            f"configured schema is {schema!r}: one install per database (advisory locks and "
            f"notification channels are database-wide); set SCHEDLOCK_DATABASE_SCHEMA="
            f"{elsewhere[0]} (--database-schema) for every component, or use another database"
        )
    if row["exists"]:
        return
    try:
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    except psycopg.errors.InsufficientPrivilege as exc:
        raise _failure(
            StoreError,
            exc,
            suffix=f": as a superuser run CREATE SCHEMA {schema} AUTHORIZATION <this role>, "
            "then migrate again",
        ) from exc


@dataclasses.dataclass(eq=False)
class _Wire:
    """The one connection of a lock session, shared by the sessions of its target's keys
    (:meth:`PostgresLockSession.lock_key`): the backend that holds the locks, and the
    notification pump that runs while no statement does and hands each notification to every
    listener of its channel."""

    name: str
    conn: Conn | None = None
    lock_pid: int | None = None  # the backend that saw its lock granted (affinity)
    busy: int = 0  # statements in progress: the notification pump is paused meanwhile
    listeners: list[tuple[str, Callable[[str], None]]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.pump = TaskSlot(f"notifies:{self.name}", logger=log)

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        self.lock_pid = None
        self.listeners = []
        await self.pump.stop()
        if conn is not None and not conn.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)

    @contextlib.asynccontextmanager
    async def statement(self) -> AsyncIterator[None]:
        """Pause the notification pump around a statement.

        psycopg reads notifications only inside ``notifies()``, which holds the connection's
        lock while it waits; statements would queue behind it.  So the pump runs only while
        the session is otherwise idle: notifications that arrive during a statement are kept
        in psycopg's backlog and handed out first when the pump restarts.
        """
        self.busy += 1
        await self.pump.stop()
        try:
            yield
        finally:
            self.busy -= 1
            if not self.busy and self.listeners and self.connected:
                self.pump.start(self._pump_notifies)

    async def _pump_notifies(self) -> None:
        conn = self.conn
        assert conn is not None
        try:
            while True:
                try:
                    async for note in conn.notifies():
                        for channel, deliver in self.listeners:
                            if channel == note.channel:
                                deliver(note.payload)
                    return
                except UnicodeDecodeError:
                    # psycopg decodes the batch again after its handler (which skipped it):
                    # a payload no key's text can be, go on pumping.
                    continue
        except psycopg.Error as exc:
            # The session died: the next statement on it says so to the caller.
            log.debug(
                "notification pump stopped",
                extra={"event": Event.NOTIFICATIONS_STOPPED, "key": self.name, "error": str(exc)},
            )

    async def listen(self, channel: str, on_payload: Callable[[str], None]) -> None:
        async with self.statement():
            conn = self.conn
            if conn is None or conn.closed:
                raise LeadershipLost(f"lock session for {self.name} is closed")
            if not self.listeners:
                _undecodable_notifications(conn, lambda _payload: None)  # no key's: ignored
            if all(channel != listening for listening, _ in self.listeners):
                listen = sql.SQL("LISTEN {}").format(sql.Identifier(channel))
                await _guard(conn.execute(listen))
            self.listeners.append((channel, on_payload))


class PostgresLockSession(LockVerbs):
    """One dedicated connection: the advisory lock, its lease, heartbeat and row transitions
    (the row verbs are :class:`LockVerbs`', run on this connection).

    A *target* session (``target``: the leadership lock of a target's keys) waits for that lock
    and holds the target's standby places; once it leads, :meth:`lock_key` takes each key's own
    lock on the same connection and gives a session of that key sharing it: one server session
    for every key of a sidecar.  Without ``target``, the session waits for its key's own lock.

    The session can only lose the lock by ending, after which its statements fail; no clock
    is trusted.
    """

    codec = CODEC

    def __init__(
        self,
        url: str,
        key: LockKey,
        holder: str,
        lease_seconds: float,
        schema: str = DEFAULT_SCHEMA,
        *,
        target: TargetLock | None = None,
    ) -> None:
        self.url = url
        self.schema = schema
        self.key = key
        self.holder = holder
        self.lease_seconds = lease_seconds
        # What acquire() waits for, and whose standby places this session takes.
        self.lock: LockKey | TargetLock = target or key
        self.keys: tuple[LockKey, ...] = target.keys if target else (key,)
        self._wire = _Wire(str(self.lock))
        self._shared = False  # a key's session on its target session's connection
        self._place: int | None = None  # the standby place this session holds, if any

    # -- connection ---------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the session, set the lease and register the lock ids of its keys."""
        await self.close()
        try:
            conn = await connect(self.url, application_name=self.holder, schema=self.schema)
        except StoreUnavailable as exc:
            cause = exc.__cause__
            sqlstate = getattr(cause, "sqlstate", None)
            if is_exhausted(sqlstate, str(cause or exc)):
                raise ConnectionsExhausted(
                    f"the database refused a connection for lack of slots: {exc}"
                ) from exc
            raise
        try:
            row = await self._one_on(
                conn,
                "configure_lock_session",
                {
                    "lease_ms": str(int(self.lease_seconds * 1000)),
                    **LeaseTimings(self.lease_seconds).keepalive_settings(),
                },
            )
            if row["server_version"] < 140000:
                raise StoreError(
                    "PostgreSQL 14 or newer is required (idle_session_timeout is the lease)"
                )
            if row["in_reserved_slot"]:
                raise ConnectionsExhausted(
                    "the database is full up to its reserved connection slots "
                    "(superuser_reserved_connections / reserved_connections) and this role may "
                    "use them: not taking a slot kept for operators"
                )
            for key in self.keys:
                await conn.execute(Q["register_key"], key.params())
                if (await self._one_on(conn, "lock_ids_taken", key.params()))["taken"]:
                    raise LockKeyCollision(
                        f"lock key {key} hashes to the same advisory lock ids as another key "
                        f"({key.classid}, {key.objid}); rename the target"
                    )
        except BaseException:
            await conn.close()
            raise
        self._wire.conn = conn

    @property
    def connected(self) -> bool:
        return self._wire.connected

    async def close(self) -> None:
        """Drop the session; the server releases its locks with it.  A key's session on its
        target's connection leaves that to the target session."""
        self._place = None
        if not self._shared:
            await self._wire.close()

    def _require(self) -> Conn:
        conn = self._wire.conn
        if conn is None or conn.closed:
            raise LeadershipLost(f"lock session for {self.key} is closed")
        return conn

    async def _query(
        self, name: str, params: Params, conn: Conn | None = None
    ) -> tuple[list[Row], int]:
        async def run() -> tuple[list[Row], int]:
            cur = await (conn or self._require()).execute(Q[name], CODEC.encode(params))
            found: list[Row] = [*await cur.fetchall()] if cur.description is not None else []
            return found, cur.rowcount

        async with self._wire.statement():
            return await _guard(run())

    async def _fetch(self, name: str, params: Params) -> list[Row]:
        return (await self._query(name, params))[0]

    async def _execute(self, name: str, params: Params) -> int:
        return (await self._query(name, params))[1]

    async def _one_on(self, conn: Conn, name: str, params: Params) -> Row:
        found, _ = await self._query(name, params, conn)
        if not found:
            raise StoreError(f"query {name} returned no row")
        return found[0]

    async def listen(self, channel: str, on_payload: Callable[[str], None]) -> None:
        """LISTEN on this lock session and call ``on_payload`` for each notification, until
        the session closes.  No extra server session: the leader's wake-ups ride on its lock
        (the keys of a target share it: each hears every notification of its channel)."""
        await self._wire.listen(channel, on_payload)

    # -- standby places and the reserve roster ----------------------------------------------------

    def _place_params(self, places: int) -> dict[str, object]:
        return {"place_classid": STANDBY_CLASS_ID, "place_objids": self.lock.standby_objids(places)}

    async def take_standby_place(self, places: int) -> int | None:
        """Take a free standby place of the lock on this session (never waiting): its index,
        or None when all ``places`` are taken.  Held until released or the session ends."""
        if places <= 0:
            return None
        found = await self._fetch("take_standby_place", self._place_params(places))
        self._place = int(found[0]["place"]) if found else None
        return self._place

    async def leave_standby_place(self) -> None:
        """Give the standby place back (checked): the leader holds the lock instead, so a
        reserve may become a standby in its stead."""
        place, self._place = self._place, None
        if place is None:
            return
        objid = self.lock.standby_objids(place + 1)[place]
        row = await self._one(
            "leave_standby_place", {"place_classid": STANDBY_CLASS_ID, "place_objid": objid}
        )
        if not row["released"]:
            raise UnlockFailed(
                f"pg_advisory_unlock({STANDBY_CLASS_ID}, {objid}) returned false for standby "
                f"place {place} of {self.lock}: this session did not hold it"
            )

    async def _holds_place(self) -> bool:
        assert self._place is not None
        objid = self.lock.standby_objids(self._place + 1)[self._place]
        params = {"place_classid": STANDBY_CLASS_ID, "place_objids": [objid]}
        return int((await self._one("standby_places_held", params))["held"]) == 1

    async def reserve_roster(self) -> ReserveRoster:
        return from_row(ReserveRoster, await self._one("reserve_roster", self._params()), CODEC)

    async def enlist_reserve(self, next_check_in: float, grace: float) -> None:
        params = self._params(next_check_in=next_check_in, grace=grace)
        await self._execute("enlist_reserve", params)

    async def leave_reserves(self) -> None:
        await self._execute("leave_reserves", self._params())

    # -- leadership -----------------------------------------------------------------------------

    async def try_acquire(self) -> bool:
        """Take this session's lock if it is free, never waiting: True when it is now held
        (and on this backend).  A replica that can lead at once so takes no standby place,
        which, held for that moment, would turn the replicas starting beside it into reserves
        until their turn."""
        row = await self._one("try_lock", {**self.lock.params(), "namespace": self.key.namespace})
        if not row["granted"]:
            return False
        await self._verify_session_affinity()
        return True

    async def acquire(self, on_holder: OnHolder | None = None) -> None:
        """Block until this session holds its lock (a standby waits here, in one statement:
        :func:`lock_statement`).  ``on_holder`` hears, while it waits, of each change of a
        session holding the lock whose role may not serve the key's namespace (None: gone)."""
        async with self._wire.statement():
            conn = self._require()
            statement = lock_statement(
                self.lock.classid,
                self.lock.objid,
                None if on_holder is None else self.key.namespace,
            )
            handler = None if on_holder is None else _foreign_holder_notices(conn, on_holder)
            try:
                await _guard(conn.execute(statement))
            finally:
                if handler is not None:
                    conn.remove_notice_handler(handler)
        await self._verify_session_affinity()

    async def lock_key(
        self, key: LockKey, on_holder: OnHolder | None = None
    ) -> PostgresLockSession | None:
        """Take ``key``'s own lock on this session without waiting, once it leads: a session of
        that key on this connection (its row verbs, its LISTEN), or None while another session
        holds the key's lock — a replica of a release that locks per key (a rolling update), or
        a squatter, of which ``on_holder`` hears (None: the holder may serve the namespace)."""
        if key not in self.keys:
            raise ValueError(f"{key} is not a key of {self.lock}")
        if key == self.lock:
            return self  # a session of one key: its lock is the one acquire() took
        row = await self._one("try_lock", {**key.params(), "namespace": key.namespace})
        if not row["granted"]:
            if on_holder is not None:
                pid, role = row["foreign_pid"], row["foreign_role"]
                on_holder(None if pid is None else ForeignHolder(pid=int(pid), role=str(role)))
            return None
        held = await self._one("lock_held", key.params())
        if not held["held"] or int(held["pid"]) != self._wire.lock_pid:
            # Granted to one server session, seen from another: statements do not stay on one.
            raise UnsafeConnection(UNSAFE_POOLER)
        if on_holder is not None:
            on_holder(None)
        session = copy.copy(self)
        session.key, session.lock, session.keys = key, key, (key,)
        session._shared, session._place = True, None
        return session

    def _local_port(self) -> int | None:
        conn = self._require()
        try:
            fd = os.dup(conn.pgconn.socket)
        except (OSError, psycopg.Error):
            return None
        with socket.socket(fileno=fd) as sock:
            try:
                return int(sock.getsockname()[1])
            except (OSError, IndexError, TypeError):
                return None

    async def _verify_session_affinity(self) -> None:
        """Confirm from a second transaction that pg_locks shows the lock for this backend.

        A direct connection (the backend sees our own client port) passes at once.  Behind a
        proxy, probe clients hold transactions open on the pool's server sessions (a pooler
        hands out its most recently used one first) and we check again after each: a pooler
        in transaction mode gives a probe our lock's server session, or moves our next
        statement to another one.  Checks run one at a time per process, and every heartbeat
        re-checks the backend pid.  Failing means refusing to run, never running unguarded.
        """
        async with _affinity_lock():
            row = await self._one("lock_held", self.lock.params())
            if not row["held"]:
                raise UnsafeConnection(UNSAFE_POOLER)
            # The backend that sees the lock granted to itself holds it: the one every later
            # statement (each heartbeat re-checks) must run on.
            self._wire.lock_pid = int(row["pid"])
            if self._place is not None and not await self._holds_place():
                # The place was taken in an earlier transaction: another server session
                # holds it, so statements do not stay on one session.
                raise UnsafeConnection(UNSAFE_POOLER)
            if row["client_port"] is not None and row["client_port"] == self._local_port():
                return
            async with contextlib.AsyncExitStack() as probes:
                for round_ in range(AFFINITY_PROBES):
                    try:
                        _probe, pinned = await asyncio.wait_for(
                            self._pin_probe(probes, round_), timeout=10
                        )
                    except TimeoutError as exc:
                        raise StoreUnavailable(
                            "could not open a probe connection to verify session affinity "
                            "(pool exhausted?)"
                        ) from exc
                    if pinned is None or int(pinned["pid"]) == self._wire.lock_pid:
                        raise UnsafeConnection(UNSAFE_POOLER)
                    try:
                        again = await asyncio.wait_for(
                            self._one("lock_held", self.lock.params()), timeout=5
                        )
                    except TimeoutError as exc:
                        raise UnsafeConnection(UNSAFE_POOLER) from exc
                    if not again["held"] or int(again["pid"]) != self._wire.lock_pid:
                        raise UnsafeConnection(UNSAFE_POOLER)

    async def _pin_probe(
        self, probes: contextlib.AsyncExitStack, round_: int
    ) -> tuple[Conn, DictRow | None]:
        probe = await connect(
            self.url, application_name=f"{self.holder}-probe{round_}", schema=self.schema
        )
        probes.push_async_callback(probe.close)
        await probes.enter_async_context(probe.transaction())
        cur = await probe.execute(Q["backend_pid"])
        return probe, await cur.fetchone()

    async def _before_term(self) -> None:
        # Re-checked on the lock session itself: the server may have turned read-only while
        # this session waited for the lock (a term must never begin there).  As a statement:
        # another key's LISTEN on this connection may be pumping notifications.
        async with self._wire.statement():
            await require_writable(self._require(), self.schema)

    def _check_backend(self, heartbeat: Row) -> None:
        pid = self._wire.lock_pid
        if pid is not None and int(heartbeat["pid"]) != pid:
            # Continuous affinity check at no cost: a pooler moved us to another server session.
            raise UnsafeConnection(UNSAFE_POOLER)

    async def _unlock(self) -> None:
        row = await self._one("unlock", self.lock.params())
        if not row["released"]:
            raise UnlockFailed(
                f"pg_advisory_unlock({self.lock.classid}, {self.lock.objid}) returned false "
                f"for {self.lock}: this session did not hold the lock"
            )


class PostgresHeldLock:
    """A session-level advisory lock held by one dedicated connection; closing releases it."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    async def ping(self) -> None:
        """Raise StoreUnavailable when the session (and so the lock) is gone."""
        await _guard(self._conn.execute("SELECT 1"))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._conn.close(), 2)


class PostgresSession:
    """Named queries on one connection (pooled or direct)."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    async def _query(self, name: str, params: Params) -> tuple[list[Row], int]:
        cur = await _guard(self.conn.execute(Q[name], CODEC.encode(params)))
        found: list[Row] = [*await _guard(cur.fetchall())] if cur.description else []
        return found, cur.rowcount

    async def fetch(self, name: str, params: Params) -> list[Row]:
        return (await self._query(name, params))[0]

    async def fetch_each(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Each named query once, in one transaction: the statements of one name go as one
        ``executemany`` (a pipeline: one round trip, the query prepared once), and a statement
        that fails rolls every one back.  Each statement's rows, in the order given."""
        return await _guard(self._pipelined(queries))

    async def _pipelined(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        positions: dict[str, list[int]] = {}
        for position, (name, _) in enumerate(queries):
            positions.setdefault(name, []).append(position)
        found: list[list[Row]] = [[] for _ in queries]
        async with self.conn.transaction():
            for name, where in positions.items():
                async with self.conn.cursor() as cursor:
                    params = [CODEC.encode(queries[i][1]) for i in where]
                    await cursor.executemany(Q[name], params, returning=True)
                    for i in where:
                        found[i] = [*await cursor.fetchall()] if cursor.description else []
                        cursor.nextset()
        return found

    async def execute(self, name: str, params: Params) -> int:
        return (await self._query(name, params))[1]

    async def run_sql(self, statement: str) -> None:
        await _guard(self.conn.execute(statement))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.conn.transaction():
            yield


class PostgresConnector:
    """Admin sessions (a :mod:`psycopg_pool` pool of ``pool_size``, or one connection per
    verb), the operator's LISTEN, held locks, and the factory of lock sessions.

    Every session is checked on a writable primary: a new one by :func:`connect`, a pooled
    one at each checkout by the pool's ``check`` (which also finds one that died idle).
    """

    dialect = "postgres"
    notifies = True
    codec = CODEC

    def __init__(
        self,
        url: str,
        *,
        application_name: str,
        pool_size: int = 0,
        schema: str = DEFAULT_SCHEMA,
    ) -> None:
        self.url = url
        self.schema = schema
        self.application_name = application_name
        self.pool_size = pool_size
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._opening = asyncio.Lock()  # one pool per connector, however many callers race
        self._probing = asyncio.Lock()  # one direct attempt at a time, for all waiters
        self._probed_at = -POOL_WAIT_SECONDS

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _open_pool(self) -> AsyncConnectionPool[Conn]:
        from psycopg_pool import AsyncConnectionPool  # 0.4 MB a sidecar (pool_size 0) never pays

        async with self._opening:
            if self._pool is None:
                pool = AsyncConnectionPool(
                    self.url,
                    connection_class=QuietConnection,
                    kwargs=connect_kwargs(self.application_name),
                    min_size=0,
                    max_size=self.pool_size,
                    check=functools.partial(_writable_or_closed, schema=self.schema),
                    open=False,
                    name=self.application_name,
                )
                await pool.open()
                self._pool = pool
            return self._pool

    async def _pooled(self) -> tuple[AsyncConnectionPool[Conn], Conn]:
        from psycopg_pool import PoolTimeout

        pool = await self._open_pool()
        while True:
            try:
                return pool, await pool.getconn(timeout=POOL_WAIT_SECONDS)
            except PoolTimeout:
                await self._probe()

    async def _probe(self) -> None:
        """No session came within the wait: every one is busy, or none can be opened.  A direct
        attempt says which (raising the server's own refusal); a busy pool is waited for.  One
        attempt per wait interval serves every waiter, so a burst of callers queued on a busy
        pool never opens a connection each (they would exhaust ``max_connections``)."""
        async with self._probing:
            loop = asyncio.get_running_loop()
            if loop.time() - self._probed_at < POOL_WAIT_SECONDS:
                return  # another waiter just found the server accepting
            probe = await connect(
                self.url, application_name=self.application_name, schema=self.schema
            )
            await probe.close()
            self._probed_at = loop.time()

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[PostgresSession]:
        if self.pool_size <= 0:
            async with self._connection() as conn:
                yield PostgresSession(conn)
            return
        pool, conn = await self._pooled()
        try:
            yield PostgresSession(conn)
        finally:
            await pool.putconn(conn)

    @contextlib.asynccontextmanager
    async def pass_sessions(self) -> AsyncIterator[Callable[[], Any]]:
        """One session for a whole pruning pass (``schedlock.store.retention``): the pool's
        when there is one, else a connection of its own named ``<application name>-prune``
        (as ``pg_stat_activity`` shows it), closed when the pass ends."""
        async with contextlib.AsyncExitStack() as stack:
            if self.pool_size > 0:
                pinned = await stack.enter_async_context(self.session())
            else:
                conn = await stack.enter_async_context(
                    self._connection(f"{self.application_name}-prune")
                )
                pinned = PostgresSession(conn)
            # Every batch planned with its own values: a prepared statement's generic plan,
            # the state a parameter, may walk the updated_at index across every other state.
            threshold, pinned.conn.prepare_threshold = pinned.conn.prepare_threshold, None
            stack.callback(setattr, pinned.conn, "prepare_threshold", threshold)

            @contextlib.asynccontextmanager
            async def use() -> AsyncIterator[PostgresSession]:
                yield pinned

            yield use

    @contextlib.asynccontextmanager
    async def _connection(self, application_name: str | None = None) -> AsyncIterator[Conn]:
        conn = await connect(
            self.url,
            application_name=application_name or self.application_name,
            schema=self.schema,
        )
        try:
            yield conn
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)

    async def _direct(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        async with self._connection() as conn:
            return await fn(conn)

    @contextlib.asynccontextmanager
    async def migration_session(self) -> AsyncIterator[PostgresSession]:
        """A session of its own holding the migration lock (session-level: never pooled),
        with the migrations table in its current form."""
        async with self._connection() as conn:
            session = PostgresSession(conn)
            lock = {"classid": SCHEDLOCK_CLASS_ID, "objid": MIGRATIONS_OBJID}
            await session.run_sql(lock_statement(SCHEDLOCK_CLASS_ID, MIGRATIONS_OBJID))
            try:
                await _install_schema(conn)
                await session.execute("create_migrations_table", {})
                yield session
            finally:
                released = await session.fetch("unlock", lock)
                if not released[0]["released"]:
                    raise UnlockFailed("the migration lock was not held when releasing it")

    async def grant(self, request: GrantRequest) -> GrantReport:
        """Grant the least privileges each runtime role needs (run as the schema owner) and
        record the namespaces it may serve (migration 0008's mapping, which row-level security
        enforces): the request's ``namespaces`` added to the role's, or with ``only`` in place of all of them;
        none: every namespace (``*``, single-tenant).  The mapping's trigger (migration 0011)
        writes the role's policies in the same transaction, which waits for their tables' lock
        a bounded time per try (:data:`POLICY_LOCK_TIMEOUT_MS`), so that sidecars running
        meanwhile are held up no longer than that.  A sidecar's role gets the columns its
        loops change and migration 0010's functions; with ``narrow`` the table-wide writes an
        earlier release granted it are revoked too (only once no sidecar of an earlier release
        runs under it: those write the columns and rows themselves).

        Neither role gets DDL: sidecars read and move rows, take locks and record terms; the
        operator writes rows, schedules and its sync cursor, and reads terms.  CREATE on the
        schema is revoked from PUBLIC (else every role could create tables and functions
        beside ours); a role that could still create there is refused, naming how.
        """

        async def run(conn: Conn) -> GrantReport:
            report = GrantReport()
            cur = await conn.execute(Q["schema_in_use"])
            found = await cur.fetchone()
            assert found is not None
            schema = _name(found["schema"])
            for role, grants in (
                (request.sidecar_role, SIDECAR_GRANTS + PRUNE_GRANTS),
                (request.operator_role, OPERATOR_GRANTS + PRUNE_GRANTS),
            ):
                if not role:
                    continue
                cur = await conn.execute(Q["role_exists"], {"role": role})
                found = await cur.fetchone()
                if not found or not found["exists"]:
                    raise StoreError(
                        f"role {role!r} does not exist: create it first (CREATE ROLE …)"
                    )
                for attempt in range(1, POLICY_LOCK_ATTEMPTS + 1):
                    before = copy.deepcopy(report)
                    try:
                        async with conn.transaction():
                            await conn.execute(
                                Q["policy_lock_timeout"], {"ms": str(POLICY_LOCK_TIMEOUT_MS)}
                            )
                            await conn.execute(
                                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                                    sql.Identifier(schema), sql.Identifier(role)
                                )
                            )
                            if role == request.sidecar_role:
                                await _narrow_sidecar(conn, role, report, request)
                            for privileges, objects in grants:
                                for obj in objects:
                                    await conn.execute(
                                        sql.SQL("GRANT {} ON {} TO {}").format(
                                            sql.SQL(privileges), sql.SQL(obj), sql.Identifier(role)
                                        )
                                    )
                            # Migration 0011's trigger rewrites the roles' policies from it.
                            params = {
                                "role": role,
                                "namespaces": list(request.scope),
                                "only": request.only,
                            }
                            cur = await conn.execute(Q["record_namespaces"], params)
                            served = await cur.fetchone()
                            assert served is not None
                            report.serves[role] = tuple(served["namespaces"])
                        break
                    except psycopg.errors.LockNotAvailable as exc:
                        report = before
                        if attempt == POLICY_LOCK_ATTEMPTS:
                            raise StoreError(_policy_lock_refused(role)) from exc
                        await asyncio.sleep(POLICY_LOCK_PAUSE_SECONDS)
            if report.serves:
                report = await _no_public_create(conn, report)
            return report

        return await _guard(self._direct(run))

    async def served_namespaces(self) -> ServedNamespaces:
        """The connected role and the namespaces it may serve (migration 0008)."""

        async def run(conn: Conn) -> ServedNamespaces:
            cur = await conn.execute(Q["served_namespaces"], {})
            row = await cur.fetchone()
            assert row is not None
            return ServedNamespaces(str(row["role"]), tuple(row["namespaces"] or ()))

        return await _guard(self._direct(run))

    async def missing_privileges(self, component: str) -> tuple[str, list[str]]:
        """The connected role and which of ``component``'s grants it lacks (e.g.
        ``INSERT on schedlock_publishes``); owners and superusers lack none."""
        checks = privilege_checks(GRANTS[component])
        probes = sql.SQL(", ").join(
            sql.SQL("{}({})").format(
                sql.Identifier(function), sql.SQL(", ").join(map(sql.Literal, arguments))
            )
            for function, arguments, _ in checks
        )

        async def run(conn: Conn) -> tuple[str, list[str]]:
            cur = await conn.execute(Q["schema_usage"])
            usage = await cur.fetchone()
            assert usage is not None
            if not usage["usable"]:  # the tables' names would not even resolve
                return str(usage["role"]), [f"USAGE on schema {usage['schema']}"]
            cur = await conn.execute(
                sql.SQL("SELECT current_user AS role, ARRAY[{}] AS granted").format(probes)
            )
            row = await cur.fetchone()
            assert row is not None
            missing = [
                label for (_, _, label), ok in zip(checks, row["granted"], strict=True) if not ok
            ]
            return str(row["role"]), missing

        return await _guard(self._direct(run))

    def lock_session(
        self, key: LockKey, holder: str, lease_seconds: float, target: TargetLock | None = None
    ) -> PostgresLockSession:
        return PostgresLockSession(self.url, key, holder, lease_seconds, self.schema, target=target)

    async def listen(
        self,
        channel: str,
        on_payload: OnPayload,
        ready: asyncio.Event | None = None,
    ) -> None:
        """LISTEN on a dedicated connection and call ``on_payload`` until cancelled: with the
        payload's text, or its raw bytes when the connection's encoding cannot decode them."""

        async def run() -> None:
            async with self._connection(f"{self.application_name}-listen") as conn:
                _undecodable_notifications(conn, on_payload)
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                if ready is not None:
                    ready.set()
                while True:
                    with contextlib.suppress(UnicodeDecodeError):
                        # psycopg decodes a batch again after its handler (which handed the
                        # undecodable payload on as bytes): the rest of the batch is lost
                        # here, which the caller makes up for (the sync sweeps on garbage).
                        async for note in conn.notifies():
                            on_payload(note.payload)

        await _guard(run())

    async def hold_lock(self, objid: int, holder: str) -> PostgresHeldLock:
        """Block until this process holds ``(SCHEDLOCK_CLASS_ID, objid)`` on its own session."""
        conn = await connect(self.url, application_name=holder, schema=self.schema)
        try:
            await _guard(conn.execute(lock_statement(SCHEDLOCK_CLASS_ID, objid)))
        except BaseException:
            await conn.close()
            raise
        return PostgresHeldLock(conn)
