"""Is the app there?  The readiness check of the target, which leadership follows.

In a pod the native sidecar starts before the app listens and stops after the app exited (an
app draining on SIGTERM may refuse connections first).  A leader whose app is gone would claim
rows and burn their attempts against a closed port while another replica's app is healthy, so
a sidecar competes for and holds leadership only while its own app can take fires
(docs/architecture.md, "Leadership follows the app"; the states are in ``schedlock.sidecar.lock``).

The check (``SCHEDLOCK_TARGET_READY_URL``):

* ``tcp://host:port`` — connect, then a graceful goodbye.  The default, derived from the hook
  URL's host and port: it is exactly what fails when the app exits or closes its listener, it
  needs no endpoint in the app, and it never sends the app a request (the hook takes POSTs
  only).  Reachable means the connection was accepted; after that the check half-closes (FIN,
  no request) and reads whatever the app says until the app closes too (at most
  ``DRAIN_BYTES`` and ``DRAIN_SECONDS``) before closing its own end.  An app thus sees what a
  browser's unused pre-connection looks like: a connection that ends before a request, which
  HTTP servers drop silently.  A check that closed at once (the earlier default) made an app
  that answers the empty request (a 400, say) write to a socket already gone: the kernel
  answered with a reset, and the app logged a ``ConnectionResetError`` for about every third
  check (``tests/integration/test_target_check_app_logs.py``).
* ``http(s)://…`` — GET; 200-399 is reachable (the kubelet's rule), anything else, a timeout or
  a connection error is not.  For apps with a readiness endpoint that goes 503 while draining.

Reachable means the app answers; only *no answer* counts against it.  An HTTP answer to a
delivery (5xx, 408, 429, other 4xx) is a live app and keeps the row's retry/fail semantics —
with one exception for apps that say when they cannot take work: with an ``http(s)`` check, a
delivery answered 503 is confirmed by the check like a lost connection, so an app draining on
SIGTERM (503 to new work, readiness 503) hands leadership over at once instead of delaying its
rows by their retries for the whole drain.

Invariants:

* Hysteresis (pure, :class:`Health`): the state changes only after ``failure_threshold``
  consecutive failed checks (reachable -> unreachable) or ``success_threshold`` consecutive
  passing checks (unreachable -> reachable).  It starts unreachable, so a sidecar started before
  its app holds no lock until the app answered ``success_threshold`` checks in a row.
* A delivery that lost its connection (refused, reset, closed without an answer), or — with an
  ``http(s)`` check — was answered 503 (:func:`worth_confirming`), is confirmed
  by one immediate check (:meth:`TargetWatch.confirm`, shared by concurrent failures): when
  that check fails too, the app is unreachable at once — no threshold — and the row's attempt
  is not counted.  When the check passes, the app is there and the failure is an ordinary
  retryable attempt, so a live app that resets one request cannot make a row retry forever.
* :attr:`TargetWatch.reachable` is a toggle: its ``on`` event is set while the app is
  reachable, its ``off`` event while it is not, never both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from schedlock import __version__
from schedlock.core.aio import SingleFlight, Toggle, sleep_unless
from schedlock.core.httpio import HttpClient, HttpFailure, os_reason
from schedlock.core.logs import Event
from schedlock.sidecar.metrics import SidecarMetrics

log = logging.getLogger("schedlock.target")

DEFAULT_PORTS = {"http": 80, "https": 443}
# After the connection was accepted, how much of the app's reply to the empty request the
# check reads, and for how long, before it closes its end (see the module docstring).
DRAIN_BYTES = 64 * 1024
DRAIN_SECONDS = 1.0
# Until the app was first reachable, how soon a passing check is followed by the next one.
CONFIRM_AT_START_SECONDS = 0.05


@dataclass(frozen=True)
class Check:
    """What the readiness check does: connect to ``host:port``, or GET ``url``."""

    kind: Literal["tcp", "http"]
    url: str  # tcp://host:port for a connect check

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        return host, parts.port or DEFAULT_PORTS.get(parts.scheme, 0)


def derive_check(target_url: str, ready_url: str) -> Check:
    """The configured check, or by default a TCP connect to the hook URL's host and port."""
    if ready_url:
        kind: Literal["tcp", "http"] = "tcp" if ready_url.startswith("tcp://") else "http"
        return Check(kind, ready_url)
    parts = urlsplit(target_url)
    host = parts.hostname or ""
    port = parts.port or DEFAULT_PORTS.get(parts.scheme, 80)
    shown = f"[{host}]" if ":" in host else host
    return Check("tcp", f"tcp://{shown}:{port}")


def worth_confirming(check: Check, *, connection_lost: bool, status: int | None) -> bool:
    """Whether a failed delivery may mean the app cannot take fires at all (confirm it).

    A lost connection always may.  A 503 may only when the app has a readiness endpoint to
    ask: a draining app answers both with 503, an overloaded one only the delivery — and with
    a TCP check there is nothing that tells the two apart, so 503 stays an ordinary retry.
    """
    return connection_lost or (check.kind == "http" and status == 503)


def answer_is_ready(status: int) -> bool:
    """An HTTP readiness answer: 200-399 is ready, as for a kubelet httpGet probe."""
    return 200 <= status < 400


@dataclass(frozen=True)
class Thresholds:
    failures: int  # consecutive failed checks before a reachable app counts as unreachable
    successes: int  # consecutive passing checks before an unreachable app counts as reachable


@dataclass(frozen=True)
class Health:
    """The app's reachability with hysteresis: pure, one check result at a time."""

    reachable: bool = False
    streak: int = 0  # consecutive results that contradict ``reachable``

    def observe(self, ok: bool, thresholds: Thresholds) -> Health:
        if ok == self.reachable:
            return Health(self.reachable, 0)
        needed = thresholds.successes if ok else thresholds.failures
        if self.streak + 1 >= needed:
            return Health(ok, 0)
        return Health(self.reachable, self.streak + 1)

    def lost_connection(self) -> Health:
        """A delivery lost its connection and the check right after it failed: unreachable now."""
        return Health(False, 0)


def next_check_in(health: Health, *, passed: bool, interval: float, ever_reachable: bool) -> float:
    """Seconds from a check to the next one: the interval, except at start.

    Until the app was first reachable, a passing check that leaves it unreachable (the
    hysteresis wants more in a row) is followed at once (``CONFIRM_AT_START_SECONDS``) instead of
    an interval later: a sidecar that starts next to a listening app is ready in tens of
    milliseconds, not ``success_threshold - 1`` intervals (1 s by default) later.  There is
    no leadership to flap before then; afterwards every check waits the interval, so an idle
    sidecar checks no more often than it did, and one whose app never answers neither.
    """
    if passed and not ever_reachable and not health.reachable:
        return min(interval, CONFIRM_AT_START_SECONDS)
    return interval


async def probe(check: Check, seconds: float, client: HttpClient | None) -> str | None:
    """Run the check once: None when the app is reachable, else why not (one short line)."""
    try:
        if check.kind == "tcp":
            host, port = check.address
            async with asyncio.timeout(seconds):
                reader, writer = await asyncio.open_connection(host, port)
            await goodbye(reader, writer, min(seconds, DRAIN_SECONDS))
            return None
        if client is None:
            raise RuntimeError("an HTTP check needs a client")
        async with asyncio.timeout(seconds):
            answer = await client.request("GET", check.url)
        if answer_is_ready(answer.status):
            return None
        return f"GET {check.url} answered HTTP {answer.status}"
    except TimeoutError:
        return f"{check.url} did not answer within {seconds:g}s"
    except OSError as exc:  # refused, reset, no route (a TCP check)
        return f"{check.url}: {os_reason(exc)}"
    except HttpFailure as exc:
        return f"{check.url}: {exc}"[:300]


async def goodbye(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seconds: float
) -> None:
    """End an accepted check connection so that the app never meets a reset: half-close (the
    app reads end-of-stream where a request would be), read what it answers until it closes,
    then close.  The app was there either way: nothing here fails the check."""
    try:
        async with asyncio.timeout(seconds):
            writer.write_eof()
            left = DRAIN_BYTES
            while left > 0 and (chunk := await reader.read(min(left, 16 * 1024))):
                left -= len(chunk)
    except (TimeoutError, OSError):
        pass  # an app that keeps the connection open, or resets it: it accepted, it is there
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@dataclass(eq=False)
class TargetWatch:
    """Checks the app every ``interval`` seconds and tells the electors whether it is there."""

    check: Check
    _: KW_ONLY
    interval: float
    timeout: float
    thresholds: Thresholds
    metrics: SidecarMetrics
    health: Health = field(default_factory=Health, init=False)
    reason: str = field(default="not checked yet", init=False)  # why unreachable (for /readyz)
    reachable: Toggle = field(default_factory=Toggle, init=False)  # starts off
    _announced: bool = field(default=False, init=False)  # the current outage was logged
    _ever_reachable: bool = field(default=False, init=False)  # since the watch started
    _confirming: SingleFlight[bool] = field(
        default_factory=lambda: SingleFlight("confirm-app"), init=False
    )
    _client: HttpClient | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.metrics.target_up.set(0)

    @property
    def up(self) -> bool:
        return self.health.reachable

    async def __aenter__(self) -> TargetWatch:
        if self.check.kind == "http":
            self._client = HttpClient(
                self.check.url,
                f"schedlock/{__version__} readiness-check",
                limit=2,
                keep_alive=False,
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def run(self, stopping: asyncio.Event) -> None:
        """Check, update, sleep — until ``stopping``.  The first check runs at once, and
        until the app was first reachable a passing check is confirmed at once
        (:func:`next_check_in`)."""
        while not stopping.is_set():
            error = await self._probe()
            self._apply(self.health.observe(error is None, self.thresholds), error)
            pause = next_check_in(
                self.health,
                passed=error is None,
                interval=self.interval,
                ever_reachable=self._ever_reachable,
            )
            await sleep_unless(pause, stopping)

    def worth_confirming(self, *, connection_lost: bool, status: int | None) -> bool:
        return worth_confirming(self.check, connection_lost=connection_lost, status=status)

    async def confirm(self, failure: str = "delivery lost its connection") -> bool:
        """After a delivery FAILURE that may mean the app is gone: is it there?  Check at once.

        A failed check makes the app unreachable now (the failed delivery was the first
        strike); concurrent callers share one check.
        """
        if not self.up:
            return False
        return await self._confirming(lambda: self._confirm_once(failure))

    async def _confirm_once(self, failure: str) -> bool:
        error = await self._probe()
        if error is not None:
            self._apply(self.health.lost_connection(), f"{failure}; {error}")
        return error is None

    async def _probe(self) -> str | None:
        try:
            return await probe(self.check, self.timeout, self._client)
        except Exception as exc:  # a bug in a check must not freeze the state: count it failed
            log.exception(
                "readiness check crashed",
                extra={"event": Event.TARGET_CHECK_CRASHED, "check": self.check.url},
            )
            return f"check crashed: {type(exc).__name__}"

    def _apply(self, health: Health, error: str | None) -> None:
        before = self.health.reachable
        self.health = health
        if error is not None:
            self.reason = error
        if health.reachable and not before:
            self._ever_reachable = True
            self.reachable.turn(True)
            self.metrics.target_up.set(1)
            self._announced = False
            log.info(
                "app reachable: competing for leadership",
                extra={"event": Event.TARGET_REACHABLE, "check": self.check.url},
            )
        elif not health.reachable and (before or (error is not None and not self._announced)):
            # Said once per outage: on the way down, or at the first failed check at start.
            self.reachable.turn(False)
            self.metrics.target_up.set(0)
            self._announced = True
            log.log(
                logging.WARNING if before else logging.INFO,
                "app unreachable: not competing for leadership, its rows wait",
                extra={
                    "event": Event.TARGET_UNREACHABLE,
                    "check": self.check.url,
                    "error": self.reason,
                },
            )
