"""Commands for people without Kubernetes: migrate, publish, schedule, status.

Each reads ``SCHEDLOCK_DATABASE_URL`` (or ``--database-url``) like every other command. Every
value is checked before the database is opened, and a refusal is a :class:`CommandError` that
the CLI's ``main`` prints as one line (exit status 2 for a bad value, 1 for a failure).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO, TypeVar

from schedlock.core.identities import CLI_UID_PREFIX, cli_uid, parse_rfc3339, rfc3339
from schedlock.core.payloads import (
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    MAX_PAYLOAD_TEXT,
    parse_payload,
)
from schedlock.core.redact import printable, scrub
from schedlock.core.scheduling import parse_schedule
from schedlock.core.settings import (
    EXIT_BAD_SETTING,
    SHOWN_PATH_CHARS,
    CommandError,
    DatabaseSettings,
    add_command,
    dns_label,
    flag_value,
    integer,
    number,
    quoted,
    text,
)
from schedlock.operator.crd import MAX_SCHEDULE_LENGTH, MAX_TIME_ZONE_LENGTH
from schedlock.store import (
    EVERY_NAMESPACE,
    GrantReport,
    GrantRequest,
    KeyStatus,
    MigrationRefused,
    PublishSpec,
    ScheduleSpec,
    SchemaChanged,
    SchemaStatus,
    SchemaTooNew,
    ServedNamespaces,
    SessionBudget,
    Store,
    StoreError,
    ensure_schema,
    open_store,
)

T = TypeVar("T")

MAX_AT_YEARS = 100
"""``--at`` is at most this far from now, either way: further is a typo, not a plan (and
``+99999999999h`` would overflow a date)."""
_RELATIVE = re.compile(r"(?:in\s+|\+)([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)", re.ASCII)
_TIME_FORMS = "an RFC 3339 time like 2026-12-01T09:00:00Z, 'now', or '+30s'/'in 5m'"


def parse_time(raw: str, now: datetime | None = None) -> datetime:
    """RFC 3339 (``2026-12-01T09:00:00Z``), ``now``, or relative ``+30s`` / ``in 5m``: within
    :data:`MAX_AT_YEARS` of ``now``."""
    now = now or datetime.now(UTC)
    value = raw.strip()
    limit = timedelta(days=365.25 * MAX_AT_YEARS)
    if value == "now":
        return now
    match = _RELATIVE.fullmatch(value)
    if match:
        amount, unit = float(match.group(1)), match.group(2)
        seconds = amount * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
        if seconds > limit.total_seconds():  # compared first: timedelta() would overflow
            raise ValueError(f"must be at most {MAX_AT_YEARS} years from now, got {quoted(raw)}")
        return now + timedelta(seconds=seconds)
    try:
        parsed = parse_rfc3339(value)
    except ValueError:
        raise ValueError(f"must be {_TIME_FORMS}, got {quoted(raw)}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"needs a UTC offset or Z (e.g. {value[:40]}Z), got {quoted(raw)}")
    try:
        due = parsed.astimezone(UTC)  # year 1 or 9999 with an offset is beyond datetime
    except OverflowError:
        due = None
    if due is None or abs(due - now) > limit:
        raise ValueError(f"must be within {MAX_AT_YEARS} years of now, got {quoted(raw)}")
    return due


def read_payload(raw: str, stdin: BinaryIO | None = None) -> dict[str, Any]:
    """``--payload``: JSON text, ``@FILE`` (the JSON in a file) or ``-`` (from standard input).

    Neither form starts valid JSON, so a literal payload is never read as a file name. The
    text read is bounded as :func:`parse_payload` bounds it, so ``@/dev/zero`` ends too; the
    checks are the ones every writer shares (``schedlock.core.payloads``).
    """
    if raw == "-":
        where = "standard input"
        if stdin is None:
            if sys.stdin is None:  # started with standard input closed
                raise ValueError("'-' reads standard input, and there is none")
            stdin = sys.stdin.buffer
        data = stdin.read(MAX_PAYLOAD_TEXT + 1)
    elif raw.startswith("@"):
        where = quoted(raw[1:], SHOWN_PATH_CHARS)
        try:
            with open(raw[1:], "rb") as file:
                data = file.read(MAX_PAYLOAD_TEXT + 1)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "bad name"
            raise ValueError(f"cannot read the payload file {where}: {reason}") from None
    else:
        return parse_payload(raw)
    if len(data) > MAX_PAYLOAD_TEXT:
        raise ValueError(
            f"{where} holds more than {MAX_PAYLOAD_TEXT} bytes; a payload is at most "
            f"{MAX_PAYLOAD_BYTES} bytes as JSON"
        )
    try:
        text = data.decode("utf-8-sig")  # an editor's byte-order mark is not part of the JSON
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where} is not UTF-8 text (byte {exc.start})") from None
    return parse_payload(text)


def _shown(message: str, db: DatabaseSettings) -> str:
    """An error as the terminal may show it: without the URL's secrets (a database message may
    quote the connection string), and without control characters (it may quote the server)."""
    return printable(scrub(message, db.database_url))


async def _why_missing(store: Store, missing: SchemaChanged) -> str:
    """Why a command's table is missing, in words that say what to do: the store's own schema
    check (not migrated, installed elsewhere, no USAGE on the schema), else what it found."""
    try:
        await ensure_schema(store, migrate=False)
    except StoreError as exc:
        return str(exc)
    return str(missing)


def _with_store(
    command: str, db: DatabaseSettings, verb: Callable[[Store], Awaitable[T]], failure: str
) -> T:
    """Run one store verb; a StoreError is a CommandError (exit status 1)."""

    async def run() -> T:
        store = open_store(
            db.database_url, application_name=f"schedlock-{command}", schema=db.database_schema
        )
        try:
            return await verb(store)
        except SchemaTooNew as exc:
            raise CommandError(_shown(str(exc), db)) from exc
        except SchemaChanged as exc:
            # A one-shot command found a table missing: the schema is not there for it (not
            # migrated, installed in another schema, no USAGE on it) rather than changed.
            raise CommandError(_shown(f"{failure}: {await _why_missing(store, exc)}", db)) from exc
        except StoreError as exc:
            raise CommandError(_shown(f"{failure}: {exc}", db)) from exc
        finally:
            await store.close()

    return asyncio.run(run())


# -- migrate -------------------------------------------------------------------------------------


def cmd_migrate(db: DatabaseSettings, args: argparse.Namespace) -> int:
    to = None if args.to is None else flag_value("--to", args.to, integer(0, 9999))
    namespaces = tuple(flag_value("--namespace", raw, dns_label) for raw in args.namespace or ())
    granting = bool(args.grant_sidecar or args.grant_operator)
    if (namespaces or args.only) and not granting:
        raise CommandError(
            "--namespace and --only go with --grant-sidecar or --grant-operator", EXIT_BAD_SETTING
        )
    if args.narrow and not args.grant_sidecar:
        raise CommandError("--narrow goes with --grant-sidecar", EXIT_BAD_SETTING)

    async def migrate(store: Store) -> tuple[list[int], SchemaStatus] | MigrationRefused:
        try:
            changed = await store.migrate(to=to, force=args.force)
        except MigrationRefused as exc:
            return exc
        if granting:
            report = await store.grant(
                GrantRequest(
                    sidecar_role=args.grant_sidecar,
                    operator_role=args.grant_operator,
                    namespaces=namespaces,
                    only=args.only,
                    narrow=args.narrow,
                )
            )
            if report.serves:
                print("\n".join(grant_report(report)))
            else:  # SQLite: one process, no roles
                print("nothing granted: this database has no roles", file=sys.stderr)
        return changed, await store.schema_status()

    result = _with_store("migrate", db, migrate, "cannot migrate")
    if isinstance(result, MigrationRefused):
        raise CommandError(str(result), EXIT_BAD_SETTING)
    print(migrate_report(*result))
    location = result[1].location
    if location is not None and location != db.database_schema:
        print(
            f"schedlock's tables are in schema {location}, where an earlier release installed "
            f"them: used there while schema {db.database_schema} holds none (docs/operations.md, "
            "'The database schema')"
        )
    return 0


def grant_report(report: GrantReport) -> list[str]:
    """What ``schedlock migrate --grant-…`` says it did: per role, the namespaces it may serve
    now and, for a sidecar's, whether its writes were narrowed to columns; then what it revoked
    from PUBLIC."""
    lines = []
    for role, served in report.serves.items():
        lines.append(f"granted runtime privileges to {role}")
        if role in report.columns_only:
            revoked = (
                " (revoked the table-wide INSERT/UPDATE of earlier releases)"
                if role in report.narrowed
                else ""
            )
            lines.append(
                f"{role} may update only the columns a sidecar's loops change; slot rows and "
                f"term bumps go through the schema's functions{revoked}"
            )
        if role in report.table_wide:
            lines.append(
                f"{role} still holds the table-wide INSERT/UPDATE of an earlier release (its "
                "sidecars need them): once every sidecar under it runs this release, narrow it "
                f"with `schedlock migrate --grant-sidecar {role} --narrow`"
            )
        if role in report.kept_broad:
            lines.append(
                f"{role} is an operator's role too: it keeps the operator's table-wide writes "
                "(grant the sidecars a role of their own to narrow them to columns)"
            )
        if EVERY_NAMESPACE in served:
            also = [ns for ns in served if ns != EVERY_NAMESPACE]
            listed = f" (also listed: {', '.join(also)}; --only drops the rest)" if also else ""
            lines.append(
                f"{role} may serve every namespace{listed}: single-tenant; use --namespace "
                "to scope it (with --only to drop every other namespace)"
            )
        else:
            lines.append(
                f"{role} may serve namespace{'s' if len(served) > 1 else ''} "
                f"{', '.join(served)} only (row-level security)"
            )
    if report.revoked_public_create:
        lines.append(
            f"revoked CREATE on schema {report.revoked_public_create} from PUBLIC: no runtime "
            "role may create tables or functions there"
        )
    return lines


def migrate_report(changed: list[int], status: SchemaStatus) -> str:
    """What ``schedlock migrate`` says it did (``changed``: as :meth:`Store.migrate` returns)."""
    current = status.current
    ids = f"migration{'s' if len(changed) > 1 else ''} {', '.join(map(str, changed))}"
    if changed and changed[0] > current:
        steps = "their down steps" if len(changed) > 1 else "its down step"
        return f"reverted {ids} by {steps}; schema at {current}{_in(status)}"
    if changed:
        return f"applied {ids}; schema at {current}{_in(status)}"
    if current > status.latest:
        return (
            f"schema at migration {current} is newer than this schedlock ({status.latest}) and "
            "runs it (every newer migration is additive): nothing applied"
        )
    if current == status.latest:
        return f"schema is current (migration {current}){_in(status)}"
    return f"schema at migration {current}: nothing to apply{_in(status)}"


def _in(status: SchemaStatus) -> str:
    return "" if status.location is None else f" in PostgreSQL schema {status.location}"


# -- publish and schedule ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Common:
    """What ``publish`` and ``schedule`` share (fields of both specs): where, what, identity."""

    namespace: str
    name: str
    uid: str
    target: str
    payload: dict[str, Any]
    starting_deadline_seconds: int | None

    def shown(self, **extra: str) -> dict[str, Any]:
        """What the command prints about the row it inserted."""
        return {key: getattr(self, key) for key in ("uid", "name", "namespace", "target")} | extra


MAX_NAME_LENGTH = 253  # a Kubernetes object name's
parse_name = text(MAX_NAME_LENGTH)


def _common(args: argparse.Namespace, command: str) -> _Common:
    uid = cli_uid()
    deadline = None
    if args.deadline_seconds is not None:
        deadline = flag_value("--deadline-seconds", args.deadline_seconds, integer(0, 31_536_000))
    return _Common(
        namespace=flag_value("--namespace", args.namespace, dns_label),
        name=flag_value("--name", args.name, parse_name)
        if args.name
        else f"{command}-{uid.removeprefix(CLI_UID_PREFIX)[:8]}",
        uid=uid,
        target=flag_value("--target", args.target, dns_label),
        payload=flag_value("--payload", args.payload, read_payload),
        starting_deadline_seconds=deadline,
    )


def _created(
    command: str,
    db: DatabaseSettings,
    verb: Callable[[Store], Awaitable[object]],
    shown: dict[str, Any],
) -> int:
    _with_store(command, db, verb, f"cannot insert the {command}")
    print(json.dumps(shown))
    return 0


def cmd_publish(db: DatabaseSettings, args: argparse.Namespace) -> int:
    common = _common(args, "publish")
    due_at = flag_value("--at", args.at, parse_time)
    spec = PublishSpec(
        **dataclasses.asdict(common),
        due_at=due_at,
        max_attempts=flag_value("--max-attempts", args.max_attempts, integer(1, 100)),
        backoff_seconds=flag_value("--backoff-seconds", args.backoff_seconds, number(0.01, 3600)),
    )
    shown = common.shown(dueAt=rfc3339(due_at))
    return _created("publish", db, lambda store: store.upsert_publish(spec), shown)


def _schedule(cron: str, time_zone: str) -> None:
    # The object's bounds, so a row the CLI writes is one the cluster could write.
    for flag, value, longest in (
        ("--cron", cron, MAX_SCHEDULE_LENGTH),
        ("--time-zone", time_zone, MAX_TIME_ZONE_LENGTH),
    ):
        if len(value) > longest:
            raise ValueError(f"{flag} is {len(value)} characters; at most {longest}")
    parse_schedule(cron, time_zone)


def cmd_schedule(db: DatabaseSettings, args: argparse.Namespace) -> int:
    common = _common(args, "schedule")
    flag_value("--cron/--time-zone", args.cron, lambda cron: _schedule(cron, args.time_zone))
    spec = ScheduleSpec(
        **dataclasses.asdict(common), expression=args.cron, time_zone=args.time_zone
    )
    shown = common.shown(schedule=args.cron, timeZone=args.time_zone)
    return _created("schedule", db, lambda store: store.upsert_schedule(spec), shown)


# -- status --------------------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return None if value is None else rfc3339(value, "milliseconds")


def status_rows(keys: list[KeyStatus]) -> list[dict[str, Any]]:
    return [
        {
            "scheduler": k.scheduler,
            "namespace": k.namespace,
            "target": k.target,
            "leader": k.lock_holder,
            "foreignHolder": (
                None
                if k.foreign_holder_role is None
                else {"role": k.foreign_holder_role, "pid": k.foreign_holder_pid}
            ),
            "term": k.term,
            "termHolder": k.holder,
            "since": _iso(k.since),
            "lastHeartbeat": _iso(k.heartbeat_at),
            "waiting": k.waiters,
            # the database sessions serving the key: its leader's and its standbys' (the keys
            # of a target share them: one session per replica serves every key)
            "sessions": (k.lock_holder is not None) + len(k.standbys),
            "standbys": list(k.standbys),
            "reserves": list(k.reserves),
            "backlog": k.backlog,
            "nextDue": _iso(k.next_due),
            "lastFire": _iso(k.last_fire),
        }
        for k in keys
    ]


def _cell(value: Any) -> str:
    """One table cell.  Standbys are shown by name (at most ``SCHEDLOCK_STANDBYS`` per key, so
    few); reserves by number (as many as there are replicas; ``--json`` lists their names)."""
    if value is None:
        return "-"
    if isinstance(value, list):
        return str(len(value)) if len(value) > 3 else (",".join(value) or "-")
    return str(value)


def _table_value(row: dict[str, Any], column: str) -> Any:
    """A row's value as the table shows it: reserves by number, a foreign holder as the
    leader (whatever application_name it chose, it is not one of the key's sidecars)."""
    if column == "reserves":
        return len(row[column])
    if column == "leader" and (foreign := row["foreignHolder"]) is not None:
        return f"FOREIGN:{printable(str(foreign['role']), 63)}(pid {foreign['pid']})"
    return row[column]


def render_table(rows: list[dict[str, Any]]) -> str:
    columns = [
        "namespace",
        "target",
        "scheduler",
        "leader",
        "term",
        "since",
        "sessions",
        "standbys",
        "reserves",
        "backlog",
        "nextDue",
        "lastFire",
    ]
    cells = [[_cell(_table_value(r, c)) for c in columns] for r in rows]
    header = [re.sub(r"([A-Z])", r" \1", c).upper() for c in columns]  # nextDue: NEXT DUE
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def hidden_keys_note(served: ServedNamespaces) -> str:
    """What ``schedlock status`` says on stderr when row-level security hides keys from the
    connected role (a role scoped to some namespaces, or never granted any)."""
    fix = (
        f"as the schema owner run `schedlock migrate --grant-operator {served.role}` "
        "(every namespace) to see them all"
    )
    if not served.namespaces:
        return (
            f"role {served.role} may serve no namespace: row-level security hides every key; {fix}"
        )
    return (
        f"role {served.role} may serve namespace{'s' if len(served.namespaces) > 1 else ''} "
        f"{', '.join(served.namespaces)} only: keys of other namespaces are not shown; {fix}"
    )


def squatting_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A line for each key whose lock a session of a role that may not serve its namespace
    holds (lock squatting: advisory locks have no ACL), saying what to do.  The role name is
    anyone's choice of characters: printed as printable text."""
    lines = []
    for row in rows:
        if (foreign := row["foreignHolder"]) is not None:
            pid = foreign["pid"]
            lines.append(
                f"{row['scheduler']}/{row['namespace']}/{row['target']}: lock held by role "
                f"'{printable(str(foreign['role']), 63)}' (backend pid {pid}), which may not "
                f"serve namespace {row['namespace']}: its rows wait. An admin ends that session "
                f"with SELECT pg_terminate_backend({pid}); then revoke or rotate that role's "
                "credential (docs/operations.md, SchedlockLockHeldByForeignRole)"
            )
    return lines


def budget_line(budget: SessionBudget) -> str | None:
    """The database-wide line under ``schedlock status``'s table: the sessions schedlock's
    replicas hold by role, against the server's limit (None: SQLite, no server sessions)."""
    if budget.max_connections is None:
        return None
    return (
        f"database sessions: {budget.sessions} held by schedlock sidecars "
        f"({budget.leaders} leading, {budget.standbys} standing by; reserves hold none), "
        f"{budget.client_sessions} client sessions in all, max_connections "
        f'{budget.max_connections} (sizing: docs/operations.md, "Database sessions")'
    )


def cmd_status(db: DatabaseSettings, args: argparse.Namespace) -> int:
    async def read(store: Store) -> tuple[list[KeyStatus], ServedNamespaces, SessionBudget]:
        return (
            await store.key_status(),
            await store.served_namespaces(),
            await store.session_budget(),
        )

    keys, served, budget = _with_store("status", db, read, "cannot read the status")
    if not served.every:
        print(hidden_keys_note(served), file=sys.stderr)
    rows = status_rows(keys)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("no lock keys yet: start a sidecar (schedlock sidecar --help)")
    else:
        print(render_table(rows))
        for line in squatting_lines(rows):
            print(line)
        if (said := budget_line(budget)) is not None:
            print(said)
    return 0


# -- registration --------------------------------------------------------------------------------


def _row_arguments(parser: argparse.ArgumentParser, fires: str, deadline: str) -> None:
    """The flags ``publish`` and ``schedule`` share: the key, the payload, the name, a deadline."""
    parser.add_argument("--target", required=True, help=f"target (app) that receives the {fires}")
    parser.add_argument(
        "--payload",
        default="{}",
        metavar="JSON",
        help=f"JSON object passed to the app; @FILE reads it from a file, - from standard input "
        f"(at most {MAX_PAYLOAD_BYTES // 1024} KiB as JSON, {MAX_PAYLOAD_DEPTH} levels deep)",
    )
    parser.add_argument(
        "--name",
        default="",
        help=f"a name for people, 1 to {MAX_NAME_LENGTH} printable characters (default generated)",
    )
    parser.add_argument("--namespace", default="default", help="namespace (default: default)")
    parser.add_argument("--deadline-seconds", default=None, help=deadline)


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    migrate = add_command(
        subparsers,
        "migrate",
        DatabaseSettings,
        cmd_migrate,
        summary="create, upgrade or roll back the database schema (run with the owner role)",
        description="Apply missing migrations, serialised by an advisory lock. A schema newer "
        "than this binary is left alone when every newer migration is additive (this binary "
        "runs on it), refused otherwise. --to N takes the schema to migration N: up by the "
        "migrations this binary ships, or down by each migration's down step, newest first, "
        "each in its own transaction (run it with the newer release before rolling back to an "
        "older one: docs/operations.md, Upgrades and rollbacks).",
    )
    migrate.add_argument(
        "--to",
        metavar="N",
        default=None,
        help="take the schema to migration N (0 to this binary's newest) instead of the newest",
    )
    migrate.add_argument(
        "--force",
        action="store_true",
        help="with --to: also run down steps that lose data (migration 1 drops every row)",
    )
    for component in ("sidecar", "operator"):
        migrate.add_argument(
            f"--grant-{component}",
            metavar="ROLE",
            default=None,
            help=f"grant the {component}'s least privileges (no DDL) to this role; it may "
            "serve every namespace unless --namespace scopes it",
        )
    migrate.add_argument(
        "--namespace",
        metavar="NS",
        action="append",
        default=None,
        help="with --grant-*: the role may serve namespace NS (repeatable), enforced by "
        "row-level security; added to the namespaces it may serve already (without "
        "--namespace: every namespace, '*', for single-tenant installs)",
    )
    migrate.add_argument(
        "--only",
        action="store_true",
        help="with --grant-*: the namespaces given become all the role may serve, dropping "
        "the others (the '*' an upgrade or a plain grant recorded too): how an existing "
        "all-namespace install is scoped, docs/operations.md",
    )
    migrate.add_argument(
        "--narrow",
        action="store_true",
        help="with --grant-sidecar: also revoke the table-wide INSERT/UPDATE an earlier release "
        "granted the role, leaving only the columns a sidecar's loops change (run it once no "
        "sidecar of an earlier release runs under the role), docs/operations.md",
    )

    publish = add_command(
        subparsers,
        "publish",
        DatabaseSettings,
        cmd_publish,
        summary="insert a one-shot publish row (no Kubernetes needed)",
        description="Schedule one delivery to TARGET at TIME; the leading sidecar fires it.",
    )
    _row_arguments(
        publish, "fire", "starting deadline: later than this after TIME it is missed, not fired"
    )
    publish.add_argument(
        "--at",
        required=True,
        metavar="TIME",
        help="RFC 3339 time (2026-12-01T09:00:00Z), 'now', or relative '+30s'/'in 5m'; within "
        f"{MAX_AT_YEARS} years of now",
    )
    publish.add_argument(
        "--max-attempts", default="3", help="delivery attempts before failing (default 3)"
    )
    publish.add_argument(
        "--backoff-seconds", default="1", help="first retry delay, doubling (default 1)"
    )

    schedule = add_command(
        subparsers,
        "schedule",
        DatabaseSettings,
        cmd_schedule,
        summary="insert a recurring schedule (cron or @every)",
        description="Fire TARGET on a schedule: 5-field cron in a time zone, @hourly-style "
        "descriptors, or @every 2s.",
    )
    _row_arguments(
        schedule, "fires", "starting deadline for each slot (catch-up fires only inside it)"
    )
    schedule.add_argument(
        "--cron", required=True, metavar="EXPR", help="'*/5 * * * *', '@daily', '@every 2s'"
    )
    schedule.add_argument(
        "--time-zone", default="UTC", help="IANA time zone for cron fields (default UTC)"
    )

    status = add_command(
        subparsers,
        "status",
        DatabaseSettings,
        cmd_status,
        summary="show per lock key who leads, the term, backlog, next due and last fire",
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
