"""Shared pytest set-up: the real-component test bed and a guard against leaked tasks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

pytest_plugins = [
    "testbed.pg_fixtures",
    "testbed.kube_fixtures",
    "testbed.tool_fixtures",
    "testbed.cluster_fixtures",
    "testbed.release_fixtures",
]


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Fail any async test that leaves asyncio tasks running behind it (kopf's habit)."""
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()
    leaked = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    for task in leaked:
        task.cancel()
    if leaked:
        names = ", ".join(sorted(t.get_name() for t in leaked))
        pytest.fail(f"test left asyncio tasks running: {names}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tier marker follows the folder: tests/unit -> unit, tests/integration -> integration…"""
    for item in items:
        tier = item.path.parent.name
        if tier in ("unit", "integration", "e2e", "cluster") and not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))
