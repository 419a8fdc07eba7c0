"""What /readyz says about a database error: words from its class and SQLSTATE, never its text.

The messages are the ones PostgreSQL 18 and libpq 18 give through psycopg (measured against a
server that checks passwords: psycopg reports a failed connection without a SQLSTATE, so the
message has to tell them apart); the detail they carry goes to the log only.
"""

from __future__ import annotations

import re

import pytest

from schedlock.operator.process import Readiness
from schedlock.store import (
    BadDatabaseUrl,
    ConnectionsExhausted,
    MissingPrivileges,
    ReadOnlyServer,
    SchemaNotCurrent,
    StoreError,
    StoreUnavailable,
    UnsafeConnection,
    summary,
)
from schedlock.store.errors import FAILURE_WORDS, PRIVILEGES_MISSING, failure_words, schema_too_new

FAILED_AT = 'connection failed: connection to server at "10.0.0.7", port 5432 failed: '

WORDS = [
    # (SQLSTATE as psycopg reports it, the message, the words)
    (
        None,
        FAILED_AT + 'FATAL:  password authentication failed for user "app"',
        "authentication failed: the database refused the credentials",
    ),
    (
        None,
        FAILED_AT + "fe_sendauth: no password supplied",
        "authentication failed: the database refused the credentials",
    ),
    (
        None,
        FAILED_AT + 'FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "app", database "app"',
        "authentication failed: no pg_hba.conf entry allows this connection",
    ),
    (
        None,
        FAILED_AT + 'FATAL:  role "late_unknown" does not exist',
        "authentication failed: the role does not exist",
    ),
    (
        None,
        FAILED_AT + 'FATAL:  database "nope" does not exist',
        "the database does not exist",
    ),
    (
        "53300",
        FAILED_AT + "FATAL:  sorry, too many clients already",
        "the database is out of connection slots",
    ),
    (
        None,
        FAILED_AT + "FATAL:  the database system is starting up",
        "the server is starting up or shutting down",
    ),
    (
        "57P01",
        "terminating connection due to administrator command",
        "the server ended the session (a restart or an administrator)",
    ),
    (
        "25006",
        "cannot execute INSERT in a read-only transaction",
        "the server is read-only: not writing there",
    ),
    ("42501", "permission denied for table schedlock_migrations", PRIVILEGES_MISSING),
    (
        "42P01",
        'relation "schedlock_migrations" does not exist',
        "the schema is not there: run `schedlock migrate` with the owner role",
    ),
    ("53100", "could not extend file: No space left on device", "the server is out of resources"),
    (
        "57014",
        "canceling statement due to statement timeout",
        "a statement was cancelled (statement_timeout?)",
    ),
    (
        None,
        FAILED_AT + "Connection refused\n\tIs the server running on that host?",
        "unreachable: no connection to the server",
    ),
    (
        None,
        "failed to resolve host 'db.invalid': [Errno -2] Name or service not known",
        "unreachable: no connection to the server",
    ),
    (None, FAILED_AT + "timeout expired", "unreachable: no connection to the server"),
    (
        None,
        "consuming input failed: server closed the connection unexpectedly",
        "unreachable: no connection to the server",
    ),
    ("08006", "whatever the server said", "unreachable: no connection to the server"),
    (
        None,
        FAILED_AT + "SSL error: certificate verify failed",
        "the encrypted connection failed (sslmode, certificates)",
    ),
    (None, "something nobody has seen before", None),
]


@pytest.mark.parametrize(("sqlstate", "message", "words"), WORDS)
def test_each_failure_is_said_in_words(
    sqlstate: str | None, message: str, words: str | None
) -> None:
    assert failure_words(sqlstate, message) == words


def test_every_row_of_the_table_is_exercised() -> None:
    said = {words for _, _, words in WORDS}
    assert {words for _, _, words in FAILURE_WORDS} <= said


def test_words_never_quote_the_message() -> None:
    """What a message quotes (a user, a host, a database) never reaches the words."""
    for _, message, words in WORDS:
        for quoted in re.findall(r'"([^"]+)"', message):
            assert words is None or quoted not in words, (quoted, words)


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (StoreError("x"), "database error (the log has the detail)"),
        (StoreUnavailable("x"), "unreachable: no connection to the server"),
        (BadDatabaseUrl("x"), "the database URL could not be parsed"),
        (ReadOnlyServer("x"), "the server is read-only or a standby: not leading or writing there"),
        (ConnectionsExhausted("x"), "the database is out of connection slots"),
        (
            SchemaNotCurrent("x"),
            "the schema is not migrated yet: run `schedlock migrate` with the owner role",
        ),
        (
            schema_too_new(999, 7, 999),
            "the schema is newer than this schedlock: upgrade schedlock, or take the schema "
            "down with the newer release's `schedlock migrate --to 7`",
        ),
        (
            MissingPrivileges("x"),
            "privileges missing: grant them with `schedlock migrate --grant-…` as the owner",
        ),
        (
            UnsafeConnection("x"),
            "the connection does not keep one server session (a pooler in transaction mode?): "
            "advisory locks would guard nothing",
        ),
        (StoreUnavailable("x", summary="said otherwise"), "said otherwise"),
        (RuntimeError("boom"), "unexpected error (RuntimeError; the log has the detail)"),
    ],
)
def test_each_error_class_says_what_is_wrong(error: BaseException, words: str) -> None:
    assert summary(error) == words


def test_operator_readiness_says_the_words_not_the_detail() -> None:
    readiness = Readiness()
    detail = 'FATAL:  password authentication failed for user "app" (S3cr3t)'
    readiness.report_schema(StoreUnavailable(detail, summary=failure_words(None, detail)))
    assert readiness() == (
        False,
        "database not ready: authentication failed: the database refused the credentials",
    )
    readiness.report_schema(None)
    readiness.report_writes(ReadOnlyServer('server "10.0.0.7:5432" is a standby (S3cr3t)'))
    ready, text = readiness()
    assert not ready and "S3cr3t" not in text and "10.0.0.7" not in text
    assert (
        text
        == "database not writable: the server is read-only or a standby: not leading or writing there"
    )
