"""The operator's index of the objects (``handlers.ObjectIndex``): fed by kopf's watch events and
completed by one paged listing of its own (``handlers.list_into``), without ``kopf.index``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from schedlock.operator.handlers import ObjectIndex, build_registry, list_into
from testbed.memory_store import MemoryStore


def obj(
    uid: str, generation: int = 1, deleting: bool = False, namespace: str = "a"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": namespace, "name": f"n-{uid}", "uid": uid}
    meta["generation"] = generation
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    return {"metadata": meta, "spec": {"target": "web"}, "status": {}}


def generations(index: ObjectIndex) -> dict[str, int]:
    return {o["metadata"]["uid"]: o["metadata"]["generation"] for o in index.objects()}


def test_the_index_is_an_event_handler_on_the_loop_not_a_kopf_index() -> None:
    """No ``kopf.index``: with one, kopf holds every listed object's worker (and its event)
    until the whole listing is indexed.  The handler is async: kopf runs a plain function in
    its thread pool, a hop per watch event."""
    index = ObjectIndex()
    registry = build_registry(MemoryStore(), validate=False, objects=index)
    assert list(registry._indexing.get_all_handlers()) == []
    [handler] = [h for h in registry._watching.get_all_handlers() if h.id == "index"]
    assert asyncio.iscoroutinefunction(handler.fn)
    fn: Callable[..., Coroutine[Any, Any, object]] = handler.fn  # kopf passes every kwarg

    asyncio.run(fn(body=obj("u1"), type=None))  # from kopf's listing
    asyncio.run(fn(body=obj("u1", 2), type="MODIFIED"))
    assert generations(index) == {"u1": 2}
    asyncio.run(fn(body=obj("u1", 2), type="DELETED"))
    assert index.get("u1") is None


def test_a_watch_event_replaces_the_snapshot_and_a_deletion_drops_it() -> None:
    index = ObjectIndex()
    index.saw(obj("u1"), deleted=False)
    first = index.get("u1")
    index.saw(obj("u1", 2, deleting=True), deleted=False)
    assert index.get("u1") is not first  # a new snapshot per event (the sync relies on it)
    assert generations(index) == {"u1": 2} and not index.wanted("u1")
    index.saw(obj("u1", 2, deleting=True), deleted=True)
    assert index.get("u1") is None and index.objects() == [] and not index.wanted("u1")


def test_the_listing_adds_only_what_the_watch_has_not_shown_and_never_a_deleted_object() -> None:
    """The listing and the watch race: whatever the watch showed is newer or as new, so the
    listing fills gaps only, and an object the watch saw deleted stays gone."""
    index = ObjectIndex()
    index.saw(obj("seen", 3), deleted=False)
    index.saw(obj("gone"), deleted=False)
    index.saw(obj("gone"), deleted=True)
    assert not index.complete.is_set()
    index.listed([obj("seen", 2), obj("gone"), obj("new")])
    assert generations(index) == {"seen": 3, "new": 1}
    assert index.wanted("new") and not index.wanted("gone")
    index.listing_done()
    assert index.complete.is_set()
    index.saw(obj("new"), deleted=True)  # after the listing no deletion is remembered
    assert not index._deleted and generations(index) == {"seen": 3}


class Pages:
    """The API's paged LIST, per namespace (None: the cluster), as ``Kube.list_page`` answers."""

    def __init__(self, objects: dict[str | None, list[dict[str, Any]]], size: int) -> None:
        self.objects, self.size = objects, size
        self.calls: list[tuple[str | None, str | None]] = []
        self.fail_at: int | None = None

    async def __call__(
        self, namespace: str | None, token: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        self.calls.append((namespace, token))
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise RuntimeError("410 Gone: the continue token expired")
        items = self.objects[namespace]
        start = int(token or 0)
        end = start + self.size
        return items[start:end], (str(end) if end < len(items) else None)


def test_the_listing_reads_every_page_of_every_namespace_then_completes_the_index() -> None:
    pages = Pages({"a": [obj(f"a{i}") for i in range(5)], "b": [obj("b0")]}, size=2)
    index = ObjectIndex()
    assert asyncio.run(list_into(index, pages, ("a", "b"))) == 6
    assert pages.calls == [("a", None), ("a", "2"), ("a", "4"), ("b", None)]
    assert sorted(generations(index)) == ["a0", "a1", "a2", "a3", "a4", "b0"]
    assert index.complete.is_set()


def test_the_whole_cluster_is_one_listing_and_an_empty_one_completes_too() -> None:
    pages = Pages({None: []}, size=500)
    index = ObjectIndex()
    assert asyncio.run(list_into(index, pages, ())) == 0
    assert pages.calls == [(None, None)] and index.complete.is_set()


def test_a_failed_page_leaves_the_index_incomplete_and_a_new_listing_completes_it() -> None:
    pages = Pages({None: [obj(f"u{i}") for i in range(5)]}, size=2)
    pages.fail_at = 2
    index = ObjectIndex()
    with pytest.raises(RuntimeError, match="410"):
        asyncio.run(list_into(index, pages, ()))
    assert not index.complete.is_set() and len(index.objects()) == 2  # the first page stays: true
    pages.fail_at = None
    assert asyncio.run(list_into(index, pages, ())) == 5
    assert index.complete.is_set() and len(index.objects()) == 5
