"""kopf's per-object readiness toggles at start-up cost each waiting worker one wake-up, not one
per other object (``schedlock.operator.toggles``): n workers wait for the set to be on, one
toggle per worker, each worker drops its own.  Counted, not timed: how often the waiters
re-check the set's state."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from kopf._cogs.aiokits import aiotoggles

from schedlock.operator import toggles

WORKERS = 200


async def checks_until_all_pass(make: type[aiotoggles.ToggleSet]) -> int:
    """What kopf's watcher and workers do with ``operator_indexed`` at start-up: a toggle per
    listed object, each object's worker drops its own and waits for the whole set."""
    checked = 0

    def all_on(states: Iterable[bool]) -> bool:
        nonlocal checked
        checked += 1
        return all(states)

    indexed = make(all_on)
    listing = await indexed.make_toggle(name="the listing")
    passed = 0

    async def worker(toggle: aiotoggles.Toggle) -> None:
        nonlocal passed
        await indexed.drop_toggle(toggle)
        await indexed.wait_for(True)
        passed += 1

    workers = []
    for n in range(WORKERS):  # the watcher: the listing's objects arrive one by one
        toggle = await indexed.make_toggle(name=f"object {n}")
        workers.append(asyncio.create_task(worker(toggle)))
        await asyncio.sleep(0)  # the next event of the stream
    await indexed.drop_toggle(listing)  # the listing is over
    await asyncio.wait_for(asyncio.gather(*workers), timeout=60)
    assert passed == WORKERS and indexed.is_on()
    return checked


async def test_waiting_workers_are_woken_when_the_set_turns_on_not_at_every_drop() -> None:
    ours = await checks_until_all_pass(toggles.StateToggleSet)
    kopfs = await checks_until_all_pass(aiotoggles.ToggleSet)
    assert ours <= 10 * WORKERS, ours  # a few checks per worker
    assert kopfs >= WORKERS * WORKERS / 4, kopfs  # what the set replaced: every drop woke all


def test_install_makes_kopfs_sets_state_toggle_sets() -> None:
    original = aiotoggles.ToggleSet
    try:
        toggles.install()
        toggles.install()  # idempotent
        assert isinstance(aiotoggles.ToggleSet(all), toggles.StateToggleSet)
    finally:
        aiotoggles.ToggleSet = original  # type: ignore[misc]
