"""The operator's index of the objects costs kopf no thread hop per watch event."""

from __future__ import annotations

import asyncio

from schedlock.operator.handlers import ObjectIndex, build_registry
from testbed.memory_store import MemoryStore


def test_the_index_callback_runs_on_the_loop_not_in_kopfs_thread_pool() -> None:
    """kopf runs a plain-function callback in its thread pool: the index's, at every watch
    event of every object (10,000 at a restart), would hop to a thread and back each time."""
    registry = build_registry(MemoryStore(), validate=False, objects=ObjectIndex())
    [index] = registry._indexing.get_all_handlers()
    assert asyncio.iscoroutinefunction(index.fn)
