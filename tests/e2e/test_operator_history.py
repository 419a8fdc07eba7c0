"""An operator restarted over years of history: no Kubernetes request for the rows of objects
that are gone, and a new outcome still synced.

Thousands of finished rows of deleted objects are written with SQL as the store leaves them,
changed within the sync's catch-up, and the sync's cursor is dropped (an upgrade from a release
without it): the restarted operator's first sweep reads them all, and kopf's index (listed
before the sweep) says their objects are gone.  Counted by the API server itself
(``apiserver_request_total``): no GET of a ScheduledPublish, and the sweep's cursor passed them.
Real kube-apiserver + etcd, the operator under its ServiceAccount, PostgreSQL, two sidecars.
"""

from __future__ import annotations

import json
from typing import Any

from bench.scenarios.operator import apiserver_requests
from schedlock.core.logs import Event, records
from testbed.operators import at, operator_stack_fixture
from testbed.sidecars import wait_for
from tests.e2e.test_operator_requests import Stack

NAMESPACE = "e2e-history"
HISTORY = 5_000  # finished rows of objects deleted long ago
# The sweep interval is the harness's 5 s: several sweeps run while the test waits.
stack = operator_stack_fixture(Stack, NAMESPACE)


def insert_history(stack: Stack, count: int) -> None:
    """``count`` published one-shot rows of deleted objects, as the store leaves them, each
    changed at its own moment of the last half hour (inside the default 1 h catch-up)."""
    stack.sql(
        """
        INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, generation, target,
            due_at, next_attempt_at, payload, state, attempts, max_attempts, term, holder,
            last_status, fired_at, finished_at, created_at, updated_at)
        SELECT 'publish', %s, 'gone-' || i, gen_random_uuid()::text, 1, 'demo', t, t,
               jsonb_build_object('n', i), 'published', 1, 3, 1, 'demo-0', 200, t,
               t + interval '30 ms', t - interval '1 minute', t + interval '30 ms'
        FROM (SELECT i, now() - interval '30 minutes' + i * interval '300 ms' AS t
              FROM generate_series(1, %s) AS i) AS s
        """,
        NAMESPACE,
        count,
    )


def phase(stack: Stack, name: str) -> str | None:
    """The object's phase from a LIST (``stack.status`` is a GET: it would count)."""
    out = stack.kube.kubectl("get", "sp", "-n", NAMESPACE, "-o", "json")
    found = [o for o in json.loads(out.stdout)["items"] if o["metadata"]["name"] == name]
    return found[0].get("status", {}).get("phase") if found else None


def resumed(stack: Stack) -> list[dict[str, Any]]:
    return list(records(stack.operator.log_text(), Event.STATUS_SYNC_RESUMED))


def test_a_restart_over_history_of_deleted_objects_costs_no_get(stack: Stack) -> None:
    # A live object: the index is listed at the restart (kopf's listing sets the signal).
    stack.apply("keeper", publishAt=at(1))
    wait_for(lambda: stack.status("keeper").get("phase") == "Published", timeout=30, what="keeper")
    stack.operator.stop()
    insert_history(stack, HISTORY)
    stack.sql("DELETE FROM schedlock_sync_cursors")  # as upgraded from a release without it
    [(newest,)] = stack.sql(
        "SELECT max(updated_at) FROM schedlock_publishes WHERE name LIKE 'gone-%%'"
    )
    before = apiserver_requests(stack.kube)
    stack.operator.start()
    wait_for(lambda: len(resumed(stack)) == 2, timeout=60, what="the restarted sync resumed")
    assert resumed(stack)[-1]["cursor"] is False  # the catch-up, not the epoch
    # The first sweep passed every history row: the cursor it stored is beyond the newest.
    wait_for(
        lambda: stack.sql("SELECT 1 FROM schedlock_sync_cursors WHERE watermark_at > %s", newest),
        timeout=60,
        what="the cursor past the history",
    )
    # A new outcome is still synced (on its NOTIFY): status and Event.
    stack.apply("after", publishAt=at(2))
    wait_for(lambda: phase(stack, "after") == "Published", timeout=30, what="after")
    wait_for(lambda: "Published" in stack.events("after"), timeout=15, what="the Event")
    spent = stack.spent(before)
    # kubectl apply reads the object before creating it: that one GET is the test's own; the
    # operator makes none (5,000 before the cursor and the listed index)
    assert spent.pop("GET scheduledpublishes", 0) == 1, spent
    # what is left: the test's create, the new object's own few requests, kopf's resumes
    assert spent.pop("POST scheduledpublishes") == 1
    assert sum(spent.values()) <= 8, spent
