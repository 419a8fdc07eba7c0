"""Everything a chaos run is parameterised by (the seed and the duration come from the CLI)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from schedlock.core.timings import LeaseTimings
from schedlock.operator import crd


@dataclass(frozen=True)
class ChaosConfig:
    seed: int
    duration: float = 600.0  # seconds of load and faults (setup and drain come on top)
    targets: tuple[str, ...] = ("alpha", "beta")
    replicas: int = 5  # sidecars per target
    namespace: str = "chaos"
    with_operator: bool = True

    # Sidecars: a short lease so that every fault resolves within seconds (a heartbeat a bit
    # quicker than the derived 0.9 s); the product's LeaseTimings derives the rest.
    timings: LeaseTimings = LeaseTimings(3.0, heartbeat_override=0.8)
    request_timeout_seconds: float = 1.0
    shutdown_grace_seconds: float = 2.0

    # Load: ~16 one-shot rows a second in all (~10,000 in 600 s), a share of them created as
    # ScheduledPublish objects (the operator turns them into rows), the rest inserted directly.
    rows_per_second: float = 16.0
    operator_share: float = 0.06
    schedules_per_target: int = 2  # each "@every 1s"
    slot_deadline_seconds: int = 30
    row_max_attempts: int = 40  # direct rows: generous, so an injected 5xx period never exhausts
    row_backoff_seconds: float = 0.25
    object_max_attempts: int = crd.MAX_ATTEMPTS
    object_backoff_seconds: int = crd.MIN_BACKOFF_SECONDS

    # Faults stop this long before the end of the load, so that every row can settle.
    quiet_tail_seconds: float = 20.0
    first_fault_seconds: float = 5.0
    drain_timeout_seconds: float = 60.0

    # Checker: scheduling noise allowed on a loaded machine around every fault window.
    slack_seconds: float = 1.0

    def sidecar_env(self) -> dict[str, str]:
        return {
            "SCHEDLOCK_NAMESPACE": self.namespace,
            "SCHEDLOCK_LEASE_SECONDS": f"{self.timings.lease_seconds:g}",
            "SCHEDLOCK_HEARTBEAT_SECONDS": f"{self.timings.heartbeat_seconds:g}",
            "SCHEDLOCK_REQUEST_TIMEOUT_SECONDS": f"{self.request_timeout_seconds:g}",
            "SCHEDLOCK_SHUTDOWN_GRACE_SECONDS": f"{self.shutdown_grace_seconds:g}",
            "SCHEDLOCK_MIGRATE": "off",
            "SCHEDLOCK_LOG_FORMAT": "json",
            "SCHEDLOCK_LOG_LEVEL": "info",
        }

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["timings"]
        data["targets"] = list(self.targets)
        data["lease_seconds"] = self.timings.lease_seconds
        data["heartbeat_seconds"] = self.timings.heartbeat_seconds
        data["step_down_after"] = self.timings.step_down_after
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChaosConfig:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["targets"] = tuple(fields.get("targets", ("alpha", "beta")))
        if "lease_seconds" in data:
            fields["timings"] = LeaseTimings(data["lease_seconds"], data.get("heartbeat_seconds"))
        return cls(**fields)
