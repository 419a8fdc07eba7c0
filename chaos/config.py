"""Everything a chaos run is parameterised by (the seed and the duration come from the CLI)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from schedlock.operator import crd


@dataclass(frozen=True)
class ChaosConfig:
    seed: int
    duration: float = 600.0  # seconds of load and faults (setup and drain come on top)
    targets: tuple[str, ...] = ("alpha", "beta")
    replicas: int = 5  # sidecars per target
    namespace: str = "chaos"
    with_operator: bool = True

    # Sidecars: a short lease so that every fault resolves within seconds.
    lease_seconds: float = 3.0
    heartbeat_seconds: float = 0.8
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

    @property
    def step_down_after(self) -> float:
        """The sidecar's own rule (SidecarSettings.step_down_after)."""
        return self.lease_seconds - max(1.0, self.lease_seconds * 0.2)

    def sidecar_env(self) -> dict[str, str]:
        return {
            "SCHEDLOCK_NAMESPACE": self.namespace,
            "SCHEDLOCK_LEASE_SECONDS": f"{self.lease_seconds:g}",
            "SCHEDLOCK_HEARTBEAT_SECONDS": f"{self.heartbeat_seconds:g}",
            "SCHEDLOCK_REQUEST_TIMEOUT_SECONDS": f"{self.request_timeout_seconds:g}",
            "SCHEDLOCK_SHUTDOWN_GRACE_SECONDS": f"{self.shutdown_grace_seconds:g}",
            "SCHEDLOCK_MIGRATE": "off",
            "SCHEDLOCK_LOG_FORMAT": "json",
            "SCHEDLOCK_LOG_LEVEL": "info",
        }

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["targets"] = list(self.targets)
        data["step_down_after"] = self.step_down_after
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChaosConfig:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["targets"] = tuple(fields.get("targets", ("alpha", "beta")))
        return cls(**fields)
