"""Garbage NOTIFYs against a running operator (real kube-apiserver + etcd, PostgreSQL, two
sidecars): any role that can connect may send them.  Before: ``'{"ids":[1e999]}'`` on
``schedlock_outcomes`` ended the status sync with OverflowError within 30 s, /readyz stayed ok
and statuses stopped following rows.  Now the operator stays ready and a new outcome after the
garbage still reaches its object's status."""

from __future__ import annotations

from schedlock.core.logs import Event, records
from schedlock.store import Channel
from testbed.operators import OperatorStack, at, operator_stack_fixture
from testbed.sidecars import http_get, wait_for

NAMESPACE = "e2e-garbage"
GARBAGE = [
    '{"ids":[1e999]}',
    '{"ids":[NaN, Infinity]}',
    '{"ids":[9223372036854775808, -1, "1", true, null]}',
    '{"ids":' + "9" * 7000 + "}",
    "x" * 7000,
    "[" * 3900 + "]" * 3900,
    '{"ids":{"1":1}}',
    "publish/" + NAMESPACE,
    "",
]

stack = operator_stack_fixture(OperatorStack, NAMESPACE)


def published(stack: OperatorStack, name: str) -> None:
    wait_for(
        lambda: stack.status(name).get("phase") == "Published",
        timeout=20,
        what=f"{name}'s status Published",
    )


def test_the_status_sync_keeps_syncing_through_garbage_notifications(
    stack: OperatorStack,
) -> None:
    stack.apply("before", publishAt=at(2))
    published(stack, "before")
    for _ in range(3):
        for channel in Channel:
            for payload in GARBAGE:
                stack.sql("SELECT pg_notify(%s, %s)", str(channel), payload)
    # the ids of a real outcome among garbage: the good one is read, the rest dropped
    stack.sql("SELECT pg_notify(%s, %s)", str(Channel.OUTCOMES), '{"ids":[1, 1e999, -5]}')
    readyz = f"http://127.0.0.1:{stack.operator.health_port}/readyz"
    wait_for(lambda: http_get(readyz)[0] == 200, timeout=10, what="the operator ready")
    stack.apply("after", publishAt=at(2))
    published(stack, "after")
    assert http_get(readyz) == (200, "ready\n")
    assert stack.operator.alive()
    log = stack.operator.log_text()
    assert list(records(log, Event.TASK_FAILED)) == [], "no task died"
    assert "OverflowError" not in log and "Traceback" not in log
