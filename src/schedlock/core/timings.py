"""The lease and every interval derived from it, in one place.

Like River's elector, whose lock TTL is derived from its elect interval, schedlock states one
number — the lease — and derives the rest, so setting only the lease is always consistent:

- **lease**: the lock session's ``idle_session_timeout``. The server ends a frozen or
  partitioned leader's session this long after its last statement (its last heartbeat), and the
  next waiter is granted the lock.
- **heartbeat**: how often the leader proves its session alive, ``HEARTBEAT_SHARE`` of the
  lease (3 s for the default 10 s; from a 3 s lease on, two heartbeats fit before the
  step-down). An explicit heartbeat may be at most a third of the lease, so one always falls
  due before the leader would step down.
- **step-down**: the leader stops leading when no heartbeat succeeded for the lease minus a
  margin of ``max(1 s, 20 %)``, so it lets go before the server ends its session.
- **TCP keepalives** of the lock session (server side): idle a third of the lease (at least
  1 s), a probe every second, three probes, so a vanished peer is dropped while it waits.
- **hand-over budget**: the slowest hand-over the design allows after a frozen leader, the
  lease after its last heartbeat plus one heartbeat for the next leader to take over. The
  hand-over alert's threshold derives from it.

Invariant: a :class:`LeaseTimings` that exists satisfies every rule above;
construction raises :class:`LeaseTimingError` (a ``ValueError``) with one line that says which
rule a value breaks.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_LEASE_SECONDS = 10.0
MIN_LEASE_SECONDS = 2.0
MAX_LEASE_SECONDS = 300.0
HEARTBEAT_SHARE = 0.3
"""The derived heartbeat as a share of the lease."""
MAX_HEARTBEAT_SHARE = 1 / 3
"""An explicit heartbeat may be at most this share of the lease."""


class LeaseTimingError(ValueError):
    """A lease or heartbeat that breaks a rule of the derivation."""

    def __init__(self, setting: str, message: str) -> None:
        self.setting = setting  # "lease" or "heartbeat": which value is wrong
        super().__init__(message)


@dataclass(frozen=True)
class LeaseTimings:
    """The lease, an optional explicit heartbeat, and the intervals derived from them."""

    lease_seconds: float = DEFAULT_LEASE_SECONDS
    heartbeat_override: float | None = None
    """An explicit heartbeat (seconds); None derives it from the lease."""

    def __post_init__(self) -> None:
        if not MIN_LEASE_SECONDS <= self.lease_seconds <= MAX_LEASE_SECONDS:
            raise LeaseTimingError(
                "lease",
                f"must be a number from {MIN_LEASE_SECONDS:g} to {MAX_LEASE_SECONDS:g}, "
                f"got {self.lease_seconds:g}",
            )
        beat = self.heartbeat_override
        if beat is not None and not 0 < beat <= self.lease_seconds * MAX_HEARTBEAT_SHARE:
            raise LeaseTimingError(
                "heartbeat",
                f"must be at most a third of the lease ({self.lease_seconds:g}s / 3), got {beat:g}",
            )

    @property
    def heartbeat_seconds(self) -> float:
        if self.heartbeat_override is not None:
            return self.heartbeat_override
        return round(self.lease_seconds * HEARTBEAT_SHARE, 3)

    @property
    def step_down_after(self) -> float:
        """Step down when no heartbeat succeeded for this long: the lease minus a margin."""
        return self.lease_seconds - max(1.0, self.lease_seconds * 0.2)

    @property
    def keepalive_idle_seconds(self) -> int:
        return max(1, int(self.lease_seconds / 3))

    keepalive_interval_seconds = 1
    keepalive_count = 3

    def keepalive_settings(self) -> dict[str, str]:
        """The lock session's server-side TCP keepalives, as ``set_config`` takes them."""
        return {
            "keepalive_idle": str(self.keepalive_idle_seconds),
            "keepalive_interval": str(self.keepalive_interval_seconds),
            "keepalive_count": str(self.keepalive_count),
        }

    @property
    def handover_budget_seconds(self) -> float:
        """The slowest designed hand-over after a frozen leader: the lease plus a heartbeat."""
        return self.lease_seconds + self.heartbeat_seconds


DEFAULT_TIMINGS = LeaseTimings()
