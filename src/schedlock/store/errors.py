"""The store's own errors, chained to their cause; callers never see a driver exception.

Each error has two texts.  ``str(error)`` is the detail, for the log: it may quote the server,
a role or a host (never a password: the store scrubs every driver message with
``schedlock.core.redact`` before it becomes an error).  ``error.summary`` is what is wrong in
words, for readers who may not see the detail — ``/readyz`` answers anyone who can reach the
pod, and kubelet copies its text into the pod's Events — so it never quotes the database.
"""

from __future__ import annotations

import re


class StoreError(Exception):
    """Base of every error the store raises."""

    summary = "database error (the log has the detail)"

    def __init__(self, *args: object, summary: str | None = None) -> None:
        super().__init__(*args)
        if summary is not None:
            self.summary = summary


# --- the connection: unreachable, refused, unsafe, misconfigured ---------------------------------


class StoreUnavailable(StoreError):
    """The database cannot be reached or the session died; retrying later may work."""

    summary = "unreachable: no connection to the server"


class ReadOnlyServer(StoreUnavailable):
    """The server is a hot standby or read-only: never lead or write there (advisory locks are
    granted on a standby too).  Retryable: a fail-over or a multi-host URL finds the primary."""

    summary = "the server is read-only or a standby: not leading or writing there"


class ConnectionsExhausted(StoreUnavailable):
    """The server refused a connection for lack of slots (SQLSTATE 53300: "too many clients",
    "remaining connection slots are reserved"), or this session would use a reserved slot.

    The slots belong to the app that shares the database: back off with jitter, never storm.
    """

    summary = "the database is out of connection slots"


class UnsafeConnection(StoreError):
    """Session affinity is not guaranteed (a transaction-mode pooler): we would run unguarded."""

    summary = (
        "the connection does not keep one server session (a pooler in transaction mode?): "
        "advisory locks would guard nothing"
    )


class BadDatabaseUrl(StoreError):
    """The database URL does not parse (libpq would refuse it, or misread the password)."""

    summary = "the database URL could not be parsed"


# --- the schema: not what this binary runs on, or a step refused ---------------------------------


class SchemaError(StoreError):
    """The schema is not what this binary expects (too new, or not migrated yet)."""

    summary = "the schema is not what this schedlock runs on"


class SchemaTooNew(SchemaError):
    """The database was migrated beyond what this binary can run on: a migration it does not
    know is not additive (additive ones it runs on, as binaries of the previous release do)."""

    summary = "the schema is newer than this schedlock: upgrade schedlock"


def schema_too_new(current: int, latest: int, blocking: int | None = None) -> SchemaTooNew:
    beyond = f"migration {blocking} is not additive" if blocking else "it is newer"
    fix = (
        f"upgrade schedlock, or take the schema down with the newer release's "
        f"`schedlock migrate --to {latest}`"
    )
    return SchemaTooNew(
        f"the database schema is at migration {current} but this schedlock runs on schemas up to "
        f"{latest} ({beyond}): {fix}",
        summary=f"the schema is newer than this schedlock: {fix}",
    )


class SchemaNotCurrent(SchemaError):
    """Migrations this binary needs have not run yet."""

    summary = "the schema is not migrated yet: run `schedlock migrate` with the owner role"


class SchemaChanged(SchemaError):
    """A statement named a table, column or function the database no longer has: the schema
    was taken down (``migrate --to``) under a running process.  Leading on would fail every
    outcome and re-deliver the rows in flight term after term, so the sidecar exits instead
    and, restarted, waits until the schema is one it runs on."""


class MigrationRefused(SchemaError):
    """``migrate --to`` will not take this step (it would lose data, or the binary cannot)."""

    summary = "migration refused"


# --- the role: what it may do and which namespaces it may serve ----------------------------------


class MissingPrivileges(StoreError):
    """The database role lacks a privilege its component needs (it was never granted)."""

    summary = "privileges missing: grant them with `schedlock migrate --grant-…` as the owner"


class NamespaceNotServed(StoreError):
    """The database role may not serve the namespace this sidecar is configured for (migration
    0008's mapping): it would hold the key's lock without seeing its rows.  A configuration
    error, fixed by the schema owner: the sidecar exits before it takes any lock."""

    summary = (
        "this database role may not serve the namespace: as the schema owner run "
        "`schedlock migrate --grant-sidecar ROLE --namespace NS`"
    )


# --- the advisory locks --------------------------------------------------------------------------


class LockKeyCollision(StoreError):
    """Two different lock keys hash to the same advisory lock ids.  No retry can fix it: the
    sidecar stops, naming its key and the ids (renaming the target ends it)."""

    summary = "two lock keys hash to the same advisory lock ids: rename the target"


class UnlockFailed(StoreError):
    """pg_advisory_unlock returned false: the lock was not held by this session (a bug)."""

    summary = "an advisory lock was not held when released"


class LeadershipLost(StoreError):
    """The lock session is gone or the term moved on: this process no longer leads the key.
    It ends the session, not the process: the elector reconnects and competes again."""

    summary = "the lock session ended"


# Server messages of SQLSTATE 53300; libpq reports a refused connection without a result, so
# the code is not always available and the message is what identifies it.
EXHAUSTED_MESSAGES = (
    "too many clients",
    "connection slots are reserved",
    "too many connections",
)


def is_exhausted(sqlstate: str | None, message: str) -> bool:
    """Whether a connection error is the server being out of connection slots."""
    lowered = message.lower()
    return sqlstate == "53300" or any(text in lowered for text in EXHAUSTED_MESSAGES)


PRIVILEGES_MISSING = (
    "privileges missing: as the schema owner run `schedlock migrate --grant-sidecar ROLE` "
    "or `--grant-operator ROLE`"
)
# What a driver error means, in words: (SQLSTATEs, a pattern of its message, the words); the
# first row that matches either wins.  A connection that failed before the server answered has
# no SQLSTATE (libpq reports it as text, and a server's FATAL at start-up reaches us through
# psycopg without one too), so the message tells refused from timed out from a wrong password.
# "08*" stands for the class.  None of the words quote the message.
FAILURE_WORDS: tuple[tuple[frozenset[str], re.Pattern[str], str], ...] = tuple(
    (frozenset(states.split()), re.compile(pattern, re.IGNORECASE), words)
    for states, pattern, words in (
        (
            "28P01",
            r"password authentication failed|authentication failed|no password (was )?supplied"
            r"|password is required|fe_sendauth",
            "authentication failed: the database refused the credentials",
        ),
        (
            "",
            r"no pg_hba\.conf entry",
            "authentication failed: no pg_hba.conf entry allows this connection",
        ),
        ("28000", r'role ".*" does not exist', "authentication failed: the role does not exist"),
        ("3D000", r'database ".*" does not exist', "the database does not exist"),
        (
            "53300",
            r"too many clients|connection slots are reserved|too many connections",
            "the database is out of connection slots",
        ),
        (
            "57P03",
            r"the database system is (starting up|shutting down|in recovery mode|not yet)",
            "the server is starting up or shutting down",
        ),
        (
            "57P01 57P02 57P05",
            r"terminating connection due to administrator command",
            "the server ended the session (a restart or an administrator)",
        ),
        ("25006", r"read-only transaction", "the server is read-only: not writing there"),
        ("42501", r"permission denied", PRIVILEGES_MISSING),
        (
            "42P01 3F000",
            r'relation "schedlock_[a-z_]+" does not exist',
            "the schema is not there: run `schedlock migrate` with the owner role",
        ),
        (
            "53000 53100 53200 53400",
            r"no space left|out of memory",
            "the server is out of resources",
        ),
        ("57014", r"canceling statement", "a statement was cancelled (statement_timeout?)"),
        (
            "08*",
            r"connection refused|could not connect|timeout expired|timed out|no route to host"
            r"|could not translate host name|failed to resolve host|name or service not known"
            r"|network is unreachable|server closed the connection|connection is lost"
            r"|consuming input failed|connection reset|broken pipe|connection is closed"
            r"|SSL SYSCALL|EOF detected",
            "unreachable: no connection to the server",
        ),
        (
            "",
            r"SSL|certificate|TLS|GSSAPI",
            "the encrypted connection failed (sslmode, certificates)",
        ),
    )
)


def failure_words(sqlstate: str | None, message: str) -> str | None:
    """What a driver error with ``sqlstate`` and ``message`` means, in words (None when no row
    matches: the class of the error raised then says it)."""
    for states, pattern, words in FAILURE_WORDS:
        if sqlstate and (sqlstate in states or f"{sqlstate[:2]}*" in states):
            return words
        if pattern.search(message):
            return words
    return None


def summary(error: BaseException) -> str:
    """What is wrong in words, for any error a store call raised."""
    if isinstance(error, StoreError):
        return error.summary
    return f"unexpected error ({type(error).__name__}; the log has the detail)"
