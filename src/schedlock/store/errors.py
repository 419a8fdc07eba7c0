"""The store's own errors, chained to their cause; callers never see a driver exception."""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store raises."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or the session died; retrying later may work."""


class SchemaError(StoreError):
    """The schema is not what this binary expects (too new, or not migrated yet)."""


class SchemaTooNew(SchemaError):
    """The database was migrated beyond what this binary can run on: a migration it does not
    know is not additive (additive ones it runs on, as binaries of the previous release do)."""


def schema_too_new(current: int, latest: int, blocking: int | None = None) -> SchemaTooNew:
    beyond = f"migration {blocking} is not additive" if blocking else "it is newer"
    return SchemaTooNew(
        f"the database schema is at migration {current} but this schedlock runs on schemas up to "
        f"{latest} ({beyond}): upgrade schedlock, or take the schema down with the newer "
        f"release's `schedlock migrate --to {latest}`"
    )


class MigrationRefused(SchemaError):
    """``migrate --to`` will not take this step (it would lose data, or the binary cannot)."""


class SchemaNotCurrent(SchemaError):
    """Migrations this binary needs have not run yet."""


class SchemaChanged(SchemaError):
    """A statement named a table, column or function the database no longer has: the schema
    was taken down (``migrate --to``) under a running process.  Leading on would fail every
    outcome and re-deliver the rows in flight term after term, so the sidecar exits instead
    and, restarted, waits until the schema is one it runs on."""


class MissingPrivileges(StoreError):
    """The database role lacks a privilege its component needs (it was never granted)."""


class UnsafeConnection(StoreError):
    """Session affinity is not guaranteed (a transaction-mode pooler): we would run unguarded."""


class LockKeyCollision(StoreError):
    """Two different lock keys hash to the same advisory lock ids."""


class LeadershipLost(StoreError):
    """The lock session is gone or the term moved on: this process no longer leads the key."""


class UnlockFailed(StoreError):
    """pg_advisory_unlock returned false: the lock was not held by this session (a bug)."""


class ReadOnlyServer(StoreUnavailable):
    """The server is a hot standby or read-only: never lead or write there (advisory locks are
    granted on a standby too).  Retryable: a fail-over or a multi-host URL finds the primary."""


class ConnectionsExhausted(StoreUnavailable):
    """The server refused a connection for lack of slots (SQLSTATE 53300: "too many clients",
    "remaining connection slots are reserved"), or this session would use a reserved slot.

    The slots belong to the app that shares the database: back off with jitter, never storm.
    """


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
