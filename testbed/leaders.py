"""Who leads: the product's own answer (``Store.key_status()``), for tests, tools and benchmarks.

A key is *led* by the session that holds its lock once that session has begun its term there:
the lock's holder (``lock_holder``, the session's application_name, which is the replica's
holder name) is the term's holder and the term is not released.  Between a grant and the new
term, and while nobody holds the lock, the key has no leader.  A frozen or partitioned leader
still leads here until the server ends its session (the lease): the database's view, not the
replica's own (``SidecarProcess.leads`` reads that one from its metrics).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from schedlock.store import KeyStatus, LockKey, Store, open_store

APPLICATION_NAME = "testbed-leaders"


def leader_of(status: KeyStatus) -> str | None:
    """The holder name leading this key, or None (see the module docstring)."""
    if status.lock_holder is None or status.released_at is not None:
        return None
    return status.lock_holder if status.lock_holder == status.holder else None


def key_of(status: KeyStatus) -> LockKey:
    return LockKey(status.scheduler, status.namespace, status.target)


async def read_leaders(store: Store) -> dict[LockKey, str]:
    """Every led key -> the holder name leading it."""
    return led(await store.key_status())


def led(statuses: Iterable[KeyStatus]) -> dict[LockKey, str]:
    return {key_of(s): name for s in statuses if (name := leader_of(s)) is not None}


async def statuses_at(url: str) -> list[KeyStatus]:
    """``key_status()`` on a store of its own for ``url`` (one short session)."""
    store = open_store(url, application_name=APPLICATION_NAME)
    try:
        return await store.key_status()
    finally:
        await store.close()


async def leaders_at(url: str) -> dict[LockKey, str]:
    """:func:`read_leaders` on a store of its own for ``url``."""
    return led(await statuses_at(url))


def statuses(url: str) -> dict[LockKey, KeyStatus]:
    """Every key's status, for synchronous code: from a thread and an event loop of its own,
    so that a polling predicate may call it inside a running loop too."""
    with ThreadPoolExecutor(1, thread_name_prefix="leaders") as pool:
        return {key_of(s): s for s in pool.submit(asyncio.run, statuses_at(url)).result()}


def leaders(url: str) -> dict[LockKey, str]:
    """Every led key -> the holder name leading it, for synchronous code."""
    return led(statuses(url).values())


def leader(url: str, key: LockKey) -> str | None:
    """The holder name leading ``key`` right now, or None."""
    return leaders(url).get(key)


def keys_led(url: str) -> dict[str, int]:
    """holder name -> how many keys it leads right now."""
    counts: dict[str, int] = {}
    for name in leaders(url).values():
        counts[name] = counts.get(name, 0) + 1
    return counts


@dataclass(frozen=True)
class NewTerm:
    """A term begun since the last look (``TermWatch``)."""

    key: LockKey
    term: int
    holder: str
    since: float | None  # when it began, on the database clock (Unix time)
    previous: str | None  # the holder of the term seen before it (None: first look at the key)


class TermWatch:
    """Term polling over ``key_status()``: each look returns the terms begun since the one
    before, and keeps each key's latest status (``keys``)."""

    def __init__(self) -> None:
        self.keys: dict[LockKey, KeyStatus] = {}

    def look(self, statuses: Iterable[KeyStatus]) -> list[NewTerm]:
        begun = []
        for status in statuses:
            key = key_of(status)
            old = self.keys.get(key)
            self.keys[key] = status
            if status.term == 0 or status.holder is None:
                continue  # registered, never led
            if old is None or status.term > old.term:
                since = status.since.timestamp() if status.since is not None else None
                previous = None if old is None else old.holder
                begun.append(NewTerm(key, status.term, status.holder, since, previous))
        return begun
