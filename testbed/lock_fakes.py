"""In-process fakes for the elector (``schedlock.sidecar.lock``): a lock server and an app.

:class:`FakeServer` is what PostgreSQL is to the elector for one key: the key's advisory lock,
its queue of waiters (granted in order, at once, when the holder's session ends or unlocks),
the term counter and the release record.  Its sessions take a standby place at once (the
places, the roster and the reserves have their own fake in
``tests/unit/test_connection_budget_roles.py``).  Each session's ``beats`` says what its
heartbeats do — ``ok``, ``hang`` (a frozen network) or ``fail`` — and :meth:`FakeServer.end`
is the server ending a session (its lease ran out, it was killed).  ``steps`` lists what the
sessions did, as ``holder:step``.  :meth:`FakeServer.squat` is a session of a foreign role
holding the lock: the waiting sessions hear of it as PostgreSQL's notices would tell them.

Time is the running loop's: on ``testbed.virtual_time`` the tests are exact and instant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from schedlock.core.aio import now
from schedlock.store import (
    ForeignHolder,
    Heartbeat,
    LockKey,
    StoreUnavailable,
    TermStart,
    UnlockFailed,
)

KEY = LockKey("publish", "default", "demo")


@dataclass
class FakeServer:
    holder: FakeSession | None = None
    queue: list[tuple[FakeSession, asyncio.Future[None]]] = field(default_factory=list)
    term: int = 0
    last_holder: str | None = None
    released_at: float | None = None
    released: bool = False
    steps: list[str] = field(default_factory=list)
    foreign: ForeignHolder | None = None  # what the waiters hear of a foreign holder

    def lock_session(
        self, key: LockKey, holder: str, lease_seconds: float, target: object = None
    ) -> FakeSession:
        self.steps.append(f"{holder}:session")
        return FakeSession(self, holder, key)

    def occupied_by(self, holder: str) -> FakeSession:
        """Another replica (not under test) holds the lock until :meth:`unlock`."""
        session = FakeSession(self, holder)
        self.holder = session
        return session

    def squat(self, foreign: ForeignHolder | None) -> None:
        """The lock's holder is (or is no longer, None) a session of a foreign role: every
        waiter hears it, once per change, as the ``lock`` statement's notices would say."""
        if foreign == self.foreign:
            return
        self.foreign = foreign
        for waiter, _granted in self.queue:
            if waiter.on_holder is not None:
                waiter.on_holder(foreign)

    def unlock(self, session: FakeSession, *, released: bool) -> None:
        if self.holder is not session:
            return
        self.holder, self.released_at, self.released = None, now(), released
        self.foreign = None
        while self.queue and self.holder is None:
            waiter, granted = self.queue.pop(0)
            if not granted.done():
                self.holder = waiter
                granted.set_result(None)

    def end(self, session: FakeSession) -> None:
        """The server ends a session (its lease ran out, it was killed): its lock goes."""
        session.dead = True
        self.queue = [(s, f) for s, f in self.queue if s is not session]
        self.unlock(session, released=False)


@dataclass(eq=False)
class FakeSession:
    server: FakeServer
    holder: str
    key: LockKey = KEY
    dead: bool = False
    # What the next heartbeats do: "ok", "hang" (a frozen network) or "fail" (an error).
    beats: str = "ok"
    connected: bool = True
    on_holder: Callable[[ForeignHolder | None], None] | None = None

    def _say(self, step: str) -> None:
        self.server.steps.append(f"{self.holder}:{step}")

    def _alive(self) -> None:
        if self.dead:
            raise StoreUnavailable("server closed the connection unexpectedly")

    async def connect(self) -> None:
        self._say("connect")

    async def close(self) -> None:
        self._say("close")
        self.server.end(self)

    async def take_standby_place(self, places: int) -> int | None:
        return 0

    async def leave_standby_place(self) -> None:
        return None

    async def leave_reserves(self) -> None:
        return None

    async def acquire(
        self, on_holder: Callable[[ForeignHolder | None], None] | None = None
    ) -> None:
        self._say("acquire")
        if self.server.holder is None:
            self.server.holder = self
            return
        self.on_holder = on_holder
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.server.queue.append((self, granted))
        if on_holder is not None and self.server.foreign is not None:
            on_holder(self.server.foreign)
        await granted

    async def lock_key(
        self, key: LockKey, on_holder: Callable[[ForeignHolder | None], None] | None = None
    ) -> FakeKeySession:
        """The key's own lock, on this session (leading its target): always free here."""
        self._alive()
        return FakeKeySession(self, key)

    async def begin_term(self) -> TermStart:
        self._alive()
        server = self.server
        server.term += 1
        gap = None if server.released_at is None else now() - server.released_at
        start = TermStart(server.term, server.last_holder, gap, server.released)
        server.last_holder = self.holder
        self._say(f"term:{server.term}")
        return start

    async def heartbeat(self, term: int) -> Heartbeat:
        self._alive()
        if self.beats == "hang":
            await asyncio.get_running_loop().create_future()
        if self.beats == "fail":
            raise StoreUnavailable("heartbeat failed: connection reset")
        return Heartbeat(alive=True, backlog=0, oldest_due_age=None)

    async def release(self, term: int | None) -> None:
        self._alive()
        if self.server.holder is not self:
            raise UnlockFailed("unlock returned false")
        if term is not None:
            self._say(f"release:{term}")
        self.server.unlock(self, released=True)


@dataclass(eq=False)
class FakeKeySession:
    """A key's session on its target's session (``lock_key``): the term verbs go to the one
    fake lock; releasing a term records it, the target session's release unlocks."""

    owner: FakeSession
    key: LockKey

    @property
    def holder(self) -> str:
        return self.owner.holder

    async def begin_term(self) -> TermStart:
        return await self.owner.begin_term()

    async def heartbeat(self, term: int) -> Heartbeat:
        return await self.owner.heartbeat(term)

    async def release(self, term: int | None) -> None:
        self.owner._alive()
        self.owner._say(f"release:{term}")


class FakeApp:
    """The app as the elector sees it (``AppPresence``): reachable or not, never both."""

    def __init__(self, *, up: bool = True) -> None:
        self.reachable = asyncio.Event()
        self.unreachable = asyncio.Event()
        self.reason = "connection refused"
        self.set(up)

    def set(self, up: bool) -> None:
        (self.reachable if up else self.unreachable).set()
        (self.unreachable if up else self.reachable).clear()
