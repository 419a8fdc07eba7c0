"""Level-triggered: a row lost or reverted behind a ScheduledPublish comes back, fires once.

Real kube-apiserver + etcd, the operator process under its ServiceAccount (re-asserting every
2 s here; the default is at most 60 s, see tests/unit/test_reassert.py), real PostgreSQL, two
sidecars and a recording app.  Rows are deleted or reverted directly in the database, the way
a restore from a backup or an asynchronous fail-over loses them.
"""

from __future__ import annotations

import time
from typing import Any

from testbed.operators import OperatorStack, at, operator_stack_fixture
from testbed.sidecars import wait_for

NAMESPACE = "e2e-reassert"
INTERVAL = 2.0


class Stack(OperatorStack):
    def handled(self, name: str) -> bool:
        obj = self.get(name) or {}
        generation = obj.get("metadata", {}).get("generation")
        return (obj.get("status") or {}).get("observedGeneration") == generation

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
    assert stack.row(uid)[0] == "published"  # type: ignore[index]


def test_a_terminal_object_whose_row_was_lost_is_restored_terminal_not_fired(
    stack: Stack,
) -> None:
    stack.apply("done", publishAt=at(2))
    uid = stack.uid("done")
    wait_for(lambda: stack.status("done").get("phase") == "Published", 30, what="Published")
    before = stack.status("done")
    stack.sql("DELETE FROM schedlock_publishes WHERE uid = %s", uid)
    wait_for(lambda: stack.row(uid), 3 * INTERVAL + 5, interval=0.05, what="the row back")
    assert stack.row(uid) == ("published", before["attempts"], 1)
    # A restore from a backup taken before it fired: the row is back in `scheduled`, due now.
    stack.sql(
        "UPDATE schedlock_publishes SET state = 'scheduled', attempts = 0, term = NULL, "
        "next_attempt_at = now() + interval '8 seconds' WHERE uid = %s",
        uid,
    )
    wait_for(
        lambda: (stack.row(uid) or ("",))[0] == "published",
        3 * INTERVAL + 5,
        interval=0.05,
        what="the reverted row back in its outcome",
    )
    time.sleep(10)  # past the reverted due time: nothing fires
    assert len(stack.deliveries(uid)) == 1
    after = stack.status("done")
    assert after["phase"] == "Published"
    assert after["lastFiredAt"] == before["lastFiredAt"]
    assert stack.events("done").count("Published") == 1
