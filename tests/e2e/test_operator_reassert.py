"""Level-triggered: a row lost or reverted behind a ScheduledPublish comes back, fires once.

Real kube-apiserver + etcd, the operator process under its ServiceAccount (re-asserting every
2 s here; the default is at most 60 s, see tests/unit/test_reassert.py), real PostgreSQL, two
sidecars and a recording app.  Rows are deleted or reverted directly in the database, the way
a restore from a backup or an asynchronous fail-over loses them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from schedlock.store import open_store
from schedlock.store.retention import Pruner, RetentionPolicy
from testbed.operators import OperatorStack, at, operator_stack_fixture
from testbed.sidecars import http_get, wait_for

NAMESPACE = "e2e-reassert"
INTERVAL = 2.0


class Stack(OperatorStack):
    def handled(self, name: str) -> bool:
        obj = self.get(name) or {}
        generation = obj.get("metadata", {}).get("generation")
        return bool((obj.get("status") or {}).get("observedGeneration") == generation)

    def row(self, uid: str) -> tuple[Any, ...] | None:
        found = self.sql(
            "SELECT state, attempts, generation FROM schedlock_publishes WHERE uid = %s", uid
        )
        return found[0] if found else None


stack = operator_stack_fixture(
    Stack, NAMESPACE, operator_env={"SCHEDLOCK_REASSERT_SECONDS": f"{INTERVAL:g}"}
)


def test_a_deleted_row_of_a_future_object_comes_back_and_fires_once(stack: Stack) -> None:
    stack.apply("future", publishAt=at(15))
    uid = stack.uid("future")
    wait_for(lambda: stack.row(uid) and stack.handled("future"), 15, what="the row, handled")
    stack.sql("DELETE FROM schedlock_publishes WHERE uid = %s", uid)
    deleted = time.monotonic()
    wait_for(lambda: stack.row(uid), 3 * INTERVAL + 5, interval=0.05, what="the row back")
    assert time.monotonic() - deleted <= INTERVAL + 3
    assert stack.row(uid) == ("scheduled", 0, 1)
    wait_for(lambda: stack.deliveries(uid), 30, what="the fire")
    wait_for(lambda: stack.status("future").get("phase") == "Published", 15, what="Published")
    time.sleep(2 * INTERVAL)
    assert len(stack.deliveries(uid)) == 1
    assert (stack.row(uid) or ("gone",))[0] == "published"


def test_a_terminal_object_whose_row_went_back_is_restored_terminal_not_fired(
    stack: Stack,
) -> None:
    """Its row lost: nothing is written (the status records the outcome; a pruned row looks
    the same).  Its row back in `scheduled` (a restore from a backup taken before it fired):
    the row is stored in its outcome again before it can fire."""
    stack.apply("done", publishAt=at(2))
    uid = stack.uid("done")
    wait_for(lambda: stack.status("done").get("phase") == "Published", 30, what="Published")
    before = stack.status("done")
    (row,) = stack.sql(
        "SELECT name, target, due_at, term FROM schedlock_publishes WHERE uid = %s", uid
    )
    stack.sql("DELETE FROM schedlock_publishes WHERE uid = %s", uid)
    time.sleep(3 * INTERVAL + 1)  # passes of the re-assertion: the row stays gone
    assert stack.row(uid) is None
    # The backup's version of the row: scheduled, due in 8 s.
    stack.sql(
        "INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, target, due_at, "
        "next_attempt_at) VALUES ('publish', %s, %s, %s, %s, %s, now() + interval '8 seconds')",
        NAMESPACE, row[0], uid, row[1], row[2],
    )  # fmt: skip
    wait_for(
        lambda: (stack.row(uid) or ("",))[0] == "published",
        3 * INTERVAL + 5,
        interval=0.05,
        what="the reverted row back in its outcome",
    )
    assert stack.row(uid) == ("published", before["attempts"], 1)
    time.sleep(10)  # past the reverted due time: nothing fires
    assert len(stack.deliveries(uid)) == 1
    after = stack.status("done")
    assert after["phase"] == "Published"
    assert after["lastFiredAt"] == before["lastFiredAt"]
    assert stack.events("done").count("Published") == 1


def prune_now(database: str, retention: float) -> int:
    """One pass of the product's pruner, now (the lease freed for it: the operator and the
    sidecars hold it for minutes otherwise)."""
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE schedlock_maintenance SET holder = NULL, lease_until = NULL")

    async def run() -> int:
        store = open_store(database)
        try:
            policy = RetentionPolicy(
                retention_seconds=retention, failed_retention_seconds=retention
            )
            report = await Pruner(store, "e2e-pruner", policy).run_once()
        finally:
            await store.close()
        assert report.won
        return report.deleted["publishes"]

    return asyncio.run(run())


def test_a_pruned_object_is_neither_restored_nor_fired_again_across_an_operator_restart(
    stack: Stack,
) -> None:
    publish_at = at(2)
    stack.apply("pruned", publishAt=publish_at)
    uid = stack.uid("pruned")
    wait_for(lambda: stack.status("pruned").get("phase") == "Published", 30, what="Published")
    before = stack.status("pruned")
    time.sleep(1.5)
    assert prune_now(stack.database, retention=1) >= 1
    assert stack.row(uid) is None
    time.sleep(3 * INTERVAL + 1)  # the re-assertion's passes write nothing
    assert stack.row(uid) is None
    # A restart: kopf resumes every object, and the upsert handler sees the recorded outcome.
    stack.operator.stop()
    stack.operator.start()
    wait_for(
        lambda: http_get(f"http://127.0.0.1:{stack.operator.health_port}/readyz")[0] == 200,
        60,
        what="the restarted operator ready",
    )
    time.sleep(3 * INTERVAL + 2)
    assert stack.row(uid) is None
    assert len(stack.deliveries(uid)) == 1
    after = stack.status("pruned")
    assert after["phase"] == "Published"
    assert after["lastFiredAt"] == before["lastFiredAt"]
    assert stack.events("pruned").count("Published") == 1
    # A payload edit after firing keeps the outcome: the row comes back in it, never fires.
    stack.apply("pruned", publishAt=publish_at, payload={"edited": True})
    wait_for(
        lambda: stack.status("pruned").get("observedGeneration") == 2, 15, what="the edit handled"
    )
    assert (stack.row(uid) or ("",))[0] == "published"
    time.sleep(2 * INTERVAL)
    assert len(stack.deliveries(uid)) == 1
