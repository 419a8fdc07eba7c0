"""The store's own errors, chained to their cause; callers never see a driver exception."""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store raises."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or the session died; retrying later may work."""


class SchemaError(StoreError):
    """The schema is not what this binary expects (too new, or not migrated yet)."""


class SchemaTooNew(SchemaError):
    """The database was migrated by a newer schedlock: refuse, never downgrade."""


def schema_too_new(current: int, latest: int) -> SchemaTooNew:
    return SchemaTooNew(
        f"the database schema is at migration {current} but this schedlock knows only up to "
        f"{latest}: upgrade schedlock (it never downgrades a schema)"
    )


class SchemaNotCurrent(SchemaError):
    """Migrations this binary needs have not run yet."""


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
