"""The async kit: the clocks, waiting unless stopping, one back-off policy, every task's lifecycle.

Every loop of the sidecar and the operator is written with these, so a wait, a retry or a
shutdown behaves the same everywhere (kopf's ``aiokits`` are the model).  No task of the
product is started anywhere else: start, failure and a bounded stop are written here once.

- :func:`now` and :func:`utcnow` — the one monotonic clock (the running loop's) and the one
  wall clock; a test's virtual-time loop moves both;
- :func:`sleep_unless` — wait so long, or until an event is set (the loops' "sleep or stop");
- :func:`unless_set` — await a call unless an event is set first (then cancel it);
- :class:`Backoff` — the one retry policy: doubling from ``first`` to ``cap``, with jitter;
- :class:`RateLimit` — at most once per so many seconds (a log line about a flood);
- :class:`Supervisor` — named tasks run as a group: the first failure cancels the others,
  *every* failure of the group is logged with its task's name, and a stop is staged: the
  tasks get ``stop_timeout`` seconds to end on their own, then whatever is left is cancelled.
  A task started with :meth:`Supervisor.supervise` is restarted instead (the one back-off
  between runs), and the group says which tasks are down meanwhile (``/readyz``); a
  *companion* task of the group is cancelled once the group's body ends;
- :class:`Companion` — one task beside a block (a listener, an outcome writer): cancelled and
  awaited at the block's exit, its failure raised in the block (:meth:`Companion.check`) or at
  its exit;
- :class:`TaskSet` — tasks of like work in flight (deliveries), drained within a grace;
- :class:`TaskSlot` — at most one task of a kind, stopped and started again at will (a pump
  paused around each statement);
- :class:`SingleFlight` — concurrent callers share one run of a call;
- :class:`Toggle` — two events of which exactly one is set (a state both sides wait for).

A task's outcome is always retrieved, so an error is never "exception was never retrieved".
All waits go through the running loop's clock, so a test on a virtual-time loop runs them in
no time at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Generic, TypeVar, cast

from schedlock.core.logs import Event

T = TypeVar("T")

log = logging.getLogger("schedlock.aio")


def now() -> float:
    """The running loop's clock (monotonic seconds; virtual on a test's virtual-time loop)."""
    return asyncio.get_running_loop().time()


def utcnow() -> datetime:
    """The wall clock, in UTC: the system's (``datetime.now(UTC)``, read afresh each time, so it
    never drifts from it) — unless the running loop keeps a wall clock of its own, a
    ``wall_time()`` method in Unix seconds (a test's virtual-time loop, which moves it with its
    virtual time: ``testbed.virtual_time``)."""
    try:
        wall = getattr(asyncio.get_running_loop(), "wall_time", None)
    except RuntimeError:  # no loop running (a command's plain code): the system's clock
        wall = None
    if wall is None:
        return datetime.now(UTC)
    return datetime.fromtimestamp(cast(Callable[[], float], wall)(), UTC)


async def sleep_unless(seconds: float | None, *events: asyncio.Event) -> bool:
    """Wait ``seconds`` (forever when None) unless one of ``events`` is set first.

    True when an event is set (at once if one already is), False when the time ran out.
    """
    if any(event.is_set() for event in events):
        return True
    if seconds is not None and seconds <= 0:
        return False
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        if waiters:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        elif seconds is not None:
            await asyncio.sleep(seconds)
        else:
            raise ValueError("sleep_unless(None) with no event would wait forever")
    finally:
        for waiter in waiters:
            waiter.cancel()
    return any(event.is_set() for event in events)


@dataclass(frozen=True)
class Finished(Generic[T]):
    """What :func:`unless_set` returns when the call finished first."""

    value: T


async def unless_set(
    call: Awaitable[T],
    *events: asyncio.Event,
    abandon: Callable[[T], Awaitable[object]] | None = None,
    suppress: tuple[type[BaseException], ...] = (),
) -> Finished[T] | None:
    """Await ``call`` unless one of ``events`` is set first; then cancel it and return None.

    A call that finished anyway while being cancelled has its result handed to ``abandon``
    (e.g. to close a lock that was granted just too late); errors in ``suppress`` raised by
    the cancelled call are ignored.  Cancelled from outside, the call is cancelled too: it is
    never left running.
    """
    task = asyncio.ensure_future(call)
    stops = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait({task, *stops}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        for stop in stops:
            stop.cancel()
    if task.done():
        return Finished(task.result())
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, *suppress):
        late = await task
        if abandon is not None:
            await abandon(late)
    return None


@dataclass
class Backoff:
    """The one retry policy: ``first`` doubling to ``cap``, each delay spread over [0.5, 1.5)
    of itself so replicas that failed together do not retry together.  :meth:`reset` after a
    success starts again from ``first``."""

    first: float
    cap: float
    rng: random.Random = field(default_factory=random.Random)
    _base: float | None = None

    @property
    def base(self) -> float:
        """The delay before jitter that :meth:`next` would spread next."""
        return self.first if self._base is None else min(self._base * 2, self.cap)

    def next(self) -> float:
        """The next delay (with jitter), growing the base."""
        self._base = self.base
        return self._base * (0.5 + self.rng.random())

    def reset(self) -> None:
        self._base = None

    async def sleep(self, *unless: asyncio.Event) -> bool:
        """Sleep the next delay unless one of ``unless`` is set first (True then)."""
        return await sleep_unless(self.next(), *unless)


# A supervised task that failed runs again after RESTART_FIRST seconds, doubling to RESTART_CAP:
# soon enough that a passing fault costs a second, slow enough that a bug does not spin.
RESTART_FIRST = 1.0
RESTART_CAP = 30.0


def restart_backoff() -> Backoff:
    """The back-off between the runs of a supervised task (:meth:`Supervisor.supervise`)."""
    return Backoff(RESTART_FIRST, RESTART_CAP)


@dataclass
class RateLimit:
    """At most once per ``seconds``: :meth:`ready` says yes the first time, then again only
    once ``seconds`` went by on the clock it is given (the loop's: :func:`now`)."""

    seconds: float
    _next: float = float("-inf")

    def ready(self, at: float) -> bool:
        if at < self._next:
            return False
        self._next = at + self.seconds
        return True


@dataclass(frozen=True)
class Down:
    """A restarted task between a failure and its next run."""

    error: str  # the failure's type name: words for /readyz (the detail went to the log)
    restart_at: float  # on the loop's clock
    restarts: int  # how many times it failed in a row (reset by a run that lasted)


@dataclass(eq=False)
class Supervisor:
    """A group of named tasks: ``async with Supervisor("electors") as group: group.start(...)``.

    - The block ends when every task has ended (the body's own code runs as part of it).
    - The first failure cancels the others; every failure of the group is logged, each with
      its task's name (``expected`` ones without a traceback), and the first is raised as
      itself — not wrapped in an exception group.
    - A staged stop: once ``stopping`` is set, the tasks have ``stop_timeout`` seconds to end
      on their own (each ends its work gracefully); then those left are cancelled, and said.
    - A task given to :meth:`supervise` is not a failure of the group when it raises: it is
      logged (``task_failed``, with the delay) and run again after its back-off; meanwhile it
      is in :attr:`down`, and :meth:`health` says so in words.
    - A ``companion`` task serves the body (a check, a heartbeat): it is cancelled once the
      body ends, instead of the block waiting for it.
    """

    name: str
    _: KW_ONLY
    stopping: asyncio.Event | None = None
    stop_timeout: float | None = None
    expected: tuple[type[BaseException], ...] = ()
    logger: logging.Logger = log
    tasks: list[asyncio.Task[Any]] = field(default_factory=list, init=False)
    down: dict[str, Down] = field(default_factory=dict, init=False)
    _group: asyncio.TaskGroup = field(default_factory=asyncio.TaskGroup, init=False)
    _watchdog: asyncio.Task[None] | None = field(default=None, init=False)
    _companions: list[asyncio.Task[Any]] = field(default_factory=list, init=False)

    def start(
        self, name: str, coro: Coroutine[Any, Any, T], *, companion: bool = False
    ) -> asyncio.Task[T]:
        task = self._group.create_task(coro, name=name)
        self.tasks.append(task)
        if companion:
            self._companions.append(task)
        return task

    def supervise(
        self,
        name: str,
        run: Callable[[], Coroutine[Any, Any, object]],
        backoff: Backoff,
        *,
        fatal: tuple[type[BaseException], ...] = (),
        companion: bool = False,
    ) -> asyncio.Task[None]:
        """Run ``run()`` as the task ``name``, again after each failure, waiting ``backoff``.

        A run that lasted longer than the back-off's cap resets it: a task that worked for a
        while restarts at once, one that fails at every start backs off to the cap.  A run that
        returns ends the task; so does a stop (``stopping``), also during a back-off.  A
        ``fatal`` error is not retried: it is a failure of the group, as with :meth:`start`.
        """
        return self.start(name, self._restarting(name, run, backoff, fatal), companion=companion)

    async def _restarting(
        self,
        name: str,
        run: Callable[[], Coroutine[Any, Any, object]],
        backoff: Backoff,
        fatal: tuple[type[BaseException], ...],
    ) -> None:
        restarts = 0
        while True:
            started = now()
            try:
                await run()
                return
            except fatal:
                raise
            except Exception as failure:  # cancellation and interpreter exits pass through
                if now() - started > backoff.cap:
                    backoff.reset()
                    restarts = 0
                restarts += 1
                delay = backoff.next()
                self._log_failure(name, failure, restart_in_s=round(delay, 3), restarts=restarts)
                self.down[name] = Down(type(failure).__name__, now() + delay, restarts)
            stopped = (
                await sleep_unless(delay, self.stopping)
                if self.stopping is not None
                else await sleep_unless(delay)
            )
            del self.down[name]
            if stopped:
                return
            self.logger.info(
                "task restarted",
                extra={
                    "event": Event.TASK_RESTARTED,
                    "group": self.name,
                    "task": name,
                    "restarts": restarts,
                },
            )

    def health(self) -> str | None:
        """None while every supervised task runs; else which are down, in words."""
        if not self.down:
            return None
        clock = now()
        return "; ".join(
            f"task {name} failed ({down.error}), restart {down.restarts} "
            f"in {max(down.restart_at - clock, 0):.1f} s"
            for name, down in sorted(self.down.items())
        )

    async def __aenter__(self) -> Supervisor:
        await self._group.__aenter__()
        if self.stopping is not None and self.stop_timeout is not None:
            self._watchdog = _start(
                f"{self.name}:stop", self._stop_in_time(self.stopping, self.stop_timeout)
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for task in self._companions:
            task.cancel()  # the body they served has ended
        try:
            await self._group.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            failures = self._failures(group)
            for name, failure in failures:
                self._log_failure(name, failure)
            raise failures[0][1] from None
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
                await asyncio.gather(self._watchdog, return_exceptions=True)

    def _failures(
        self, group: BaseExceptionGroup[BaseException]
    ) -> list[tuple[str, BaseException]]:
        names = {
            id(task.exception()): task.get_name()
            for task in self.tasks
            if task.done() and not task.cancelled() and task.exception() is not None
        }
        return [(names.get(id(leaf), f"{self.name}:body"), leaf) for leaf in leaves(group)]

    def _log_failure(self, name: str, failure: BaseException, **fields: object) -> None:
        log_failure(self.logger, self.name, name, failure, self.expected, **fields)

    async def _stop_in_time(self, stopping: asyncio.Event, seconds: float) -> None:
        await stopping.wait()
        running = [t for t in self.tasks if not t.done()]
        if running:
            await asyncio.wait(running, timeout=seconds)
        late = [t for t in self.tasks if not t.done()]
        for task in late:
            self.logger.warning(
                "task did not stop in time, cancelled",
                extra={
                    "event": Event.TASK_CANCELLED,
                    "group": self.name,
                    "task": task.get_name(),
                    "timeout_s": seconds,
                },
            )
            task.cancel()


def leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """Every exception inside a (nested) exception group, in order."""
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


def log_failure(
    logger: logging.Logger,
    group: str,
    name: str,
    failure: BaseException,
    expected: tuple[type[BaseException], ...] = (),
    **fields: object,
) -> None:
    """Say that the task ``name`` of ``group`` failed: ``expected`` failures in one line, any
    other with its traceback."""
    quiet = isinstance(failure, expected)
    logger.log(
        logging.INFO if quiet else logging.ERROR,
        "task failed",
        exc_info=None if quiet else failure,
        extra={
            "event": Event.TASK_FAILED,
            "group": group,
            "task": name,
            "error": f"{type(failure).__name__}: {failure}",
            **fields,
        },
    )


def _failure(task: asyncio.Task[Any]) -> BaseException | None:
    """What a finished task failed with (None: it returned or was cancelled); retrieved, so
    never "exception was never retrieved"."""
    return None if task.cancelled() else task.exception()


def _start(
    name: str, coro: Coroutine[Any, Any, T], on_done: Callable[[], object] | None = None
) -> asyncio.Task[T]:
    """The one place a task outside a :class:`Supervisor` starts: named, its outcome always
    retrieved (whoever awaits it may be cancelled first), ``on_done`` called as it ends."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_failure)
    if on_done is not None:
        task.add_done_callback(lambda _task: on_done())
    return task


async def _cancel_and_wait(tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until each has ended (their errors are the caller's to read)."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)


@dataclass(eq=False)
class Companion(Generic[T]):
    """One task beside a block: ``async with Companion("listen", listen()) as listener: ...``.

    - It starts as the block is entered and never outlives it: at the block's exit it is
      cancelled unless it has ended, and awaited.
    - Its failure surfaces: :meth:`check` raises it inside the block (``on_done`` is called the
      moment it ends, to wake the block up for that); at the exit it is raised, unless the
      block raises already — then it is logged (``expected`` failures in one line).
    - :meth:`stop` ends it earlier, at a moment of the block's choosing.
    """

    name: str
    coro: Coroutine[Any, Any, T]
    _: KW_ONLY
    on_done: Callable[[], object] | None = None
    expected: tuple[type[BaseException], ...] = ()
    logger: logging.Logger = log
    _task: asyncio.Task[T] | None = field(default=None, init=False)

    @property
    def task(self) -> asyncio.Task[T]:
        if self._task is None:
            raise RuntimeError(f"companion {self.name} used outside its block")
        return self._task

    def done(self) -> bool:
        return self.task.done()

    def check(self) -> None:
        """Raise the error the companion ended with, if it has; else nothing."""
        if self.task.done():
            failure = _failure(self.task)
            if failure is not None:
                raise failure

    async def stop(self) -> None:
        """Cancel the companion unless it has ended, and wait until it has."""
        await _cancel_and_wait({self.task})

    async def __aenter__(self) -> Companion[T]:
        self._task = _start(self.name, self.coro, self.on_done)
        return self

    async def __aexit__(self, _type: object, exc: BaseException | None, _tb: object) -> None:
        await self.stop()
        failure = _failure(self.task)
        if failure is None or failure is exc:
            return
        if exc is None:
            raise failure
        log_failure(self.logger, self.name, self.name, failure, self.expected)


@dataclass(eq=False)
class TaskSet:
    """Tasks of like work in flight (each a delivery): started one by one, counted, drained.

    - :meth:`start` runs a coroutine as a named task of the set; ``on_done`` is called as each
      ends (a slot is free).
    - A task that fails is logged with its name: the work's own errors belong in the work, this
      is the net under it.
    - :meth:`drain` is the bounded stop: the tasks have ``grace`` seconds to end on their own,
      then those left are cancelled, and awaited.
    """

    name: str
    _: KW_ONLY
    on_done: Callable[[], object] | None = None
    logger: logging.Logger = log
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set, init=False)

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, name: str, coro: Coroutine[Any, Any, object]) -> asyncio.Task[Any]:
        task = _start(name, coro)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        failure = _failure(task)
        if failure is not None:
            log_failure(self.logger, self.name, task.get_name(), failure)
        if self.on_done is not None:
            self.on_done()

    async def drain(self, grace: float = 0.0) -> None:
        """Give the tasks ``grace`` seconds to end, then cancel those left and wait for them."""
        if grace > 0 and self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)
        await _cancel_and_wait(set(self._tasks))


@dataclass(eq=False)
class TaskSlot:
    """At most one task of a kind at a time, stopped and started again at will (the
    notification pump of a session, paused around each statement).

    - :meth:`start` runs ``run()`` unless the slot's task still runs.
    - :meth:`stop` empties the slot at once (a :meth:`start` meanwhile starts a new task), then
      cancels the task it held and waits until it has ended.
    - A failure of the task is logged with its name: it has no caller to raise to.
    """

    name: str
    _: KW_ONLY
    logger: logging.Logger = log
    _task: asyncio.Task[Any] | None = field(default=None, init=False)

    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, run: Callable[[], Coroutine[Any, Any, object]]) -> None:
        if self.running():
            return
        self._task = _start(self.name, run())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        failure = _failure(task)
        if failure is not None:
            log_failure(self.logger, self.name, self.name, failure)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await _cancel_and_wait({task})


@dataclass(eq=False)
class SingleFlight(Generic[T]):
    """Concurrent callers share one run of a call: ``await flight(lambda: check())`` runs the
    call unless a run is under way, and then returns that run's result (or raises its error)
    instead.  A caller cancelled while it waits leaves the run to the others; the first call
    after a run has ended starts a new one."""

    name: str
    _running: asyncio.Task[T] | None = field(default=None, init=False)

    async def __call__(self, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        if self._running is None:
            self._running = _start(self.name, self._run(call))
        return await asyncio.shield(self._running)

    async def _run(self, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        try:
            return await call()
        finally:
            self._running = None  # as the run ends: a caller from now on starts the next one


class Toggle:
    """A state of two values as two events, exactly one of them set: waiters of either side
    wait on an event (``on`` or ``off``, e.g. with :func:`sleep_unless`), and only
    :meth:`turn` changes them, both at once."""

    def __init__(self, on: bool = False) -> None:
        self._on = asyncio.Event()
        self._off = asyncio.Event()
        (self._on if on else self._off).set()

    @property
    def on(self) -> asyncio.Event:
        """Set while the toggle is on (wait on it; never set it by hand)."""
        return self._on

    @property
    def off(self) -> asyncio.Event:
        """Set while the toggle is off (wait on it; never set it by hand)."""
        return self._off

    def is_on(self) -> bool:
        return self._on.is_set()

    def turn(self, on: bool) -> bool:
        """Turn the toggle on or off; True when that changed it."""
        if on == self.is_on():
            return False
        (self._off if on else self._on).clear()
        (self._on if on else self._off).set()
        return True
