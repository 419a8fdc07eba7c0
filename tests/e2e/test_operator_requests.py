"""What one ScheduledPublish costs the Kubernetes API: at most 4 requests of the operator.

Counted, not timed: the API server's own ``apiserver_request_total`` (by verb and resource)
before and after an object's life — create → row → fired → status Published and its Event.
The test itself only creates and deletes objects and watches or lists them (WATCH and LIST are
not counted: the operator's one watch serves every object), so what is left is the operator's:
its status PATCHes, the PATCH of the object (finalizer and kopf's annotation), Events, GETs.
The status sync's periodic sweep is set to an hour: it patches nothing for these objects (their
statuses already match their rows, tests/unit/test_operator_mapping.py), but one falling between
a handler's status PATCH and the watch delivering it would count a PATCH more.
Real kube-apiserver + etcd, the operator under its ServiceAccount, PostgreSQL, two sidecars.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from bench import kube_client
from bench.scenarios.operator import PublishedWatch, apiserver_requests
from schedlock.operator.handlers import FINALIZER, ObjectIndex, configure, list_into
from schedlock.operator.kube import Kube
from testbed.operators import OperatorStack, at, operator_stack_fixture
from testbed.sidecars import wait_for

NAMESPACE = "e2e-requests"
GROUP, VERSION, PLURAL = "schedlock.dev", "v1", "scheduledpublishes"
PER_OBJECT = 4
COUNTED = ("scheduledpublishes", "scheduledpublishes/status", "events")


class Stack(OperatorStack):
    def spent(self, before: collections.Counter[str]) -> dict[str, int]:
        """The requests on objects and Events since ``before``, but watches and lists."""
        now = apiserver_requests(self.kube)
        now.subtract(before)
        spent = {}
        for key, count in now.items():
            verb, resource = key.split(" ", 1)
            if count and resource in COUNTED and verb not in ("WATCH", "LIST"):
                spent[key] = count
        return spent


stack = operator_stack_fixture(
    Stack, NAMESPACE, operator_env={"SCHEDLOCK_SYNC_SWEEP_SECONDS": "3600"}
)


@pytest.fixture
def api(stack: Stack) -> Any:
    return kube_client.module("client").CustomObjectsApi(
        kube_client.api_client(str(stack.kube.admin_kubeconfig))
    )


@pytest.fixture
def watch(api: Any) -> Iterator[PublishedWatch]:
    watching = PublishedWatch(api, NAMESPACE).start()
    try:
        yield watching
    finally:
        watching.stop()


def create(api: Any, name: str, seconds: float) -> str:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ScheduledPublish",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"target": "demo", "publishAt": at(seconds)},
    }
    obj = api.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    return str(obj["metadata"]["uid"])


def listed(api: Any, name: str) -> list[dict[str, Any]]:
    """The object named ``name`` if it exists, from a LIST (a name selector would be a GET)."""
    found = api.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
    return [obj for obj in found["items"] if obj["metadata"]["name"] == name]


def test_an_object_costs_the_operator_at_most_four_requests(
    stack: Stack, api: Any, watch: PublishedWatch
) -> None:
    # Warm-up: once an object is Published and its Event posted, the status sync is active,
    # past its first sweep and its client loaded (at its first call), and nothing of the
    # warm-up's is left to count against the objects below.
    warm = create(api, "warm-up", 0)
    wait_for(lambda: warm in watch.published, timeout=60, what="warm-up Published")
    wait_for(lambda: "Published" in stack.events("warm-up"), timeout=15, what="warm-up Event")
    # The second object's life also shows any request the first one still caused late.
    for name in ("first", "second"):
        before = apiserver_requests(stack.kube)
        uid = create(api, name, 1)

        def published(u: str = uid) -> bool:
            return u in watch.published

        def evented(n: str = name) -> bool:
            return "Published" in stack.events(n)

        wait_for(published, timeout=30, what=f"{name} Published")
        wait_for(evented, timeout=15, what="the Event")
        spent = stack.spent(before)
        assert spent.pop("POST scheduledpublishes") == 1  # the test's create
        assert sum(spent.values()) <= PER_OBJECT, spent
        assert spent.get("POST events") == 1, "one Event per outcome, none for 'Scheduled'"
        [obj] = listed(api, name)
        assert FINALIZER in obj["metadata"]["finalizers"]
        assert obj["status"]["observedGeneration"] == 1
        assert stack.events(name) == ["Published"]

    # Deleting a fired object: our finalizer is released in one PATCH, no Event.
    before = apiserver_requests(stack.kube)
    api.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "first")
    wait_for(lambda: not listed(api, "first"), timeout=20, what="first gone")
    spent = stack.spent(before)
    assert spent.pop("DELETE scheduledpublishes") == 1  # the test's delete
    assert spent == {"PATCH scheduledpublishes": 1}


def test_an_object_deleted_before_it_fires_costs_at_most_four_too(stack: Stack, api: Any) -> None:
    before = apiserver_requests(stack.kube)
    uid = create(api, "doomed", 600)
    wait_for(
        lambda: stack.sql("SELECT 1 FROM schedlock_publishes WHERE uid = %s", uid),
        timeout=15,
        what="the row",
    )
    wait_for(
        lambda: FINALIZER in listed(api, "doomed")[0]["metadata"].get("finalizers", []),
        timeout=15,
        what="the finalizer",
    )
    api.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "doomed")
    wait_for(lambda: not listed(api, "doomed"), timeout=20, what="doomed gone")
    wait_for(lambda: "Cancelled" in stack.events("doomed"), timeout=15, what="the Event")
    assert stack.sql("SELECT state FROM schedlock_publishes WHERE uid = %s", uid) == [
        ("cancelled",)
    ]
    spent = stack.spent(before)
    assert spent.pop("POST scheduledpublishes") == 1 and spent.pop("DELETE scheduledpublishes")
    assert sum(spent.values()) <= PER_OBJECT, spent


def test_an_object_gone_without_the_finalizer_still_has_its_row_cancelled(
    stack: Stack, api: Any
) -> None:
    """The window the finalizer leaves open (deleted after its row's upsert, before the patch
    adding the finalizer), made wide: the finalizer is taken away, then the object deleted."""
    uid = create(api, "unguarded", 600)
    wait_for(
        lambda: (
            FINALIZER
            in (listed(api, "unguarded") or [{"metadata": {}}])[0]["metadata"].get("finalizers", [])
        ),
        timeout=15,
        what="the finalizer",
    )
    api.patch_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, "unguarded", {"metadata": {"finalizers": None}}
    )
    api.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "unguarded")
    wait_for(
        lambda: (
            stack.sql("SELECT state FROM schedlock_publishes WHERE uid = %s", uid)
            == [("cancelled",)]
        ),
        timeout=15,
        what="the row cancelled",
    )


def test_a_restart_writes_nothing_for_objects_already_reconciled(stack: Stack, api: Any) -> None:
    """An operator restart resumes no object whose status observes its generation: no API
    write and no database statement per object (a row the restart's upsert replayed would be
    locked by its ON CONFLICT, which shows in its ``xmax``); a row lost while the operator was
    down still comes back at once, from the re-assertion right after kopf's listing (its
    interval here is the default 30 s: the wait below is shorter)."""
    uids = [create(api, f"kept-{n}", 600) for n in range(3)]

    def reconciled() -> bool:
        objs = {o["metadata"]["uid"]: o for o in api.list_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL)["items"]}  # fmt: skip
        return all(
            (objs[uid].get("status") or {}).get("observedGeneration") == 1
            and FINALIZER in objs[uid]["metadata"].get("finalizers", [])
            for uid in uids
        )

    wait_for(reconciled, timeout=30, what="the objects reconciled")
    kept = "SELECT uid, xmin::text, xmax::text FROM schedlock_publishes WHERE uid = ANY(%s)"
    stack.operator.stop()
    stack.sql("DELETE FROM schedlock_publishes WHERE uid = %s", uids[0])
    rows_before = stack.sql(kept, uids[1:])
    before = apiserver_requests(stack.kube)
    stack.operator.start()
    wait_for(
        lambda: (
            stack.sql("SELECT state FROM schedlock_publishes WHERE uid = %s", uids[0])
            == [("scheduled",)]
        ),
        timeout=20,
        what="the lost row back",
    )
    time.sleep(2)  # what a resume of the others would have written by now
    assert sorted(stack.sql(kept, uids[1:])) == sorted(rows_before)
    assert stack.spent(before) == {}


def test_the_operators_own_listing_pages_through_a_namespace_and_the_whole_cluster(
    stack: Stack, api: Any
) -> None:
    """The listing that completes the operator's index (``handlers.list_into`` over
    ``Kube.list_page``) against the real API server, two objects a page: every object of the
    namespace, and the same objects among the whole cluster's, each once.  Run as the
    operator runs it, after its configure(): one object's payload nests 3,000 deep (stored as
    with the webhook down), which Python's default recursion limit cannot parse."""
    uids = {create(api, f"paged-{n}", 600) for n in range(5)}
    limit = sys.getrecursionlimit()
    try:
        configure(kopf.OperatorSettings())
        deep: dict[str, Any] = {"a": 1}
        for _ in range(3_000):
            deep = {"a": deep}
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ScheduledPublish",
            "metadata": {"name": "paged-deep", "namespace": NAMESPACE},
            "spec": {"target": "demo", "publishAt": at(600), "payload": deep},
        }
        made = api.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
        uids.add(str(made["metadata"]["uid"]))
        kube = Kube()
        kube._api = kube_client.api_client(str(stack.kube.admin_kubeconfig))  # not the process's
        calls: list[str | None] = []

        async def page(namespace: str | None, token: str | None) -> Any:
            calls.append(token)
            return await kube.list_page(namespace, token, 2)

        for namespaces in ((NAMESPACE,), ()):
            index = ObjectIndex()
            calls.clear()
            count = asyncio.run(list_into(index, page, namespaces))
            listed_uids = [o["metadata"]["uid"] for o in index.objects()]
            assert count == len(listed_uids) == len(set(listed_uids)) >= 6
            assert uids <= set(listed_uids) and index.complete.is_set()
            assert len(calls) == -(-count // 2) and calls[0] is None, namespaces  # pages of two
    finally:
        sys.setrecursionlimit(limit)
