"""The sidecar's settings: one typed object built once from flags and SCHEDLOCK_* variables."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from schedlock.core.settings import (
    SettingError,
    check_url,
    choice,
    database_url,
    dns_label,
    host,
    http_url,
    integer,
    log_format_setting,
    log_level_setting,
    number,
    readable_file,
    setting,
    spec_of,
    text,
)


@dataclass(frozen=True)
class SidecarSettings:
    database_url: str = setting(
        env="SCHEDLOCK_DATABASE_URL",
        help="database shared by all replicas: postgresql://… (advisory locks) or sqlite:///path "
        "(one process, always leader)",
        default="",
        parse=database_url,
        unit="url",
        secret=True,
    )
    namespace: str = setting(
        env="SCHEDLOCK_NAMESPACE",
        help="namespace whose rows this sidecar fires (part of every lock key)",
        default="default",
        parse=dns_label,
    )
    target: str = setting(
        env="SCHEDLOCK_TARGET",
        help="target (app) whose rows this sidecar fires (part of every lock key)",
        default="",
        parse=dns_label,
    )
    target_url: str = setting(
        env="SCHEDLOCK_TARGET_URL",
        help="the app's hook: every fire is POSTed here",
        default="http://127.0.0.1:8080/schedlock",
        parse=http_url,
        unit="url",
    )
    target_ready_url: str = setting(
        env="SCHEDLOCK_TARGET_READY_URL",
        help="readiness check of the app: the sidecar competes for and holds leadership only "
        "while it passes. tcp://host:port connects; http(s)://… GETs (200-399 is ready); "
        "unset, a TCP connect to the host and port of the target URL",
        default="",
        parse=check_url,
        unit="url",
    )
    target_check_seconds: float = setting(
        env="SCHEDLOCK_TARGET_CHECK_SECONDS",
        help="interval of the readiness check; each check may take this long, at least 1 s and "
        "at most 5 s",
        default=1.0,
        parse=number(0.05, 60),
        unit="seconds",
    )
    target_failure_threshold: int = setting(
        env="SCHEDLOCK_TARGET_FAILURE_THRESHOLD",
        help="failed checks in a row after which a reachable app counts as unreachable (the "
        "leader hands over); a delivery that lost its connection, then one failed check, hands "
        "over at once",
        default=2,
        parse=integer(1, 100),
        unit="checks",
    )
    target_success_threshold: int = setting(
        env="SCHEDLOCK_TARGET_SUCCESS_THRESHOLD",
        help="passing checks in a row after which an unreachable app counts as reachable again "
        "(the sidecar competes again): the hysteresis against flapping",
        default=2,
        parse=integer(1, 100),
        unit="checks",
    )
    http_port: int = setting(
        env="SCHEDLOCK_HTTP_PORT",
        help="port for /metrics, /healthz and /readyz (0 picks a free port)",
        default=9090,
        parse=integer(0, 65535),
        unit="port",
    )
    http_host: str = setting(
        env="SCHEDLOCK_HTTP_HOST",
        help="address the metrics/health server binds to",
        default="0.0.0.0",
        parse=host,
        unit="address",
    )
    holder: str = setting(
        env="SCHEDLOCK_HOLDER",
        help="this replica's name in the database (application_name, term holder); "
        "defaults to the pod or host name",
        default="",
        parse=text(63),
    )
    lease_seconds: float = setting(
        env="SCHEDLOCK_LEASE_SECONDS",
        help="server-side lease (idle_session_timeout of the lock session): a frozen or "
        "partitioned leader loses the lock after this long",
        default=10.0,
        parse=number(2, 300),
        unit="seconds",
    )
    heartbeat_seconds: float = setting(
        env="SCHEDLOCK_HEARTBEAT_SECONDS",
        help="how often the leader proves its session alive; must be well inside the lease "
        "(at most a third of it)",
        default=3.0,
        parse=number(0.2, 100),
        unit="seconds",
    )
    standbys: int = setting(
        env="SCHEDLOCK_STANDBYS",
        help="standby places per lock key: at most this many replicas wait for the lock on "
        "their own session (millisecond hand-over); the others hold no session and check "
        "now and then for a free place. Sessions per key are at most 1 + this, whatever the "
        "replica count; a value at least the replica count gives every replica a session",
        default=2,
        parse=integer(0, 10000),
        unit="sessions",
    )
    reserve_check_seconds: float = setting(
        env="SCHEDLOCK_RESERVE_CHECK_SECONDS",
        help="replicas without a session check for a free standby place in turns: together "
        "about once per this interval per key, whatever their number. Bounds the takeover "
        "when the leader and every standby die at once: a tenth over it, plus a connection",
        default=5.0,
        parse=number(0.2, 600),
        unit="seconds",
    )
    batch_size: int = setting(
        env="SCHEDLOCK_BATCH_SIZE",
        help="rows claimed per round trip",
        default=100,
        parse=integer(1, 10000),
        unit="rows",
    )
    concurrency: int = setting(
        env="SCHEDLOCK_CONCURRENCY",
        help="deliveries in flight at once per scheduler",
        default=64,
        parse=integer(1, 1024),
        unit="requests",
    )
    request_timeout_seconds: float = setting(
        env="SCHEDLOCK_REQUEST_TIMEOUT_SECONDS",
        help="time the app has to answer one delivery before it counts as a retryable timeout",
        default=10.0,
        parse=number(0.1, 600),
        unit="seconds",
    )
    poll_seconds: float = setting(
        env="SCHEDLOCK_POLL_SECONDS",
        help="safety poll: the leader re-reads due rows at least this often even without NOTIFY",
        default=30.0,
        parse=number(0.1, 3600),
        unit="seconds",
    )
    shutdown_grace_seconds: float = setting(
        env="SCHEDLOCK_SHUTDOWN_GRACE_SECONDS",
        help="on SIGTERM, how long in-flight deliveries may finish before they are abandoned "
        "(the next leader re-fires them with the same idempotency key)",
        default=2.0,
        parse=number(0, 600),
        unit="seconds",
    )
    signing_secret_file: Path | None = setting(
        env="SCHEDLOCK_SIGNING_SECRET_FILE",
        help="file holding the HMAC-SHA256 key; when set every delivery carries "
        "X-Schedlock-Signature",
        default=None,
        parse=readable_file,
        unit="path",
    )
    schedulers: str = setting(
        env="SCHEDLOCK_SCHEDULERS",
        help="which scheduler loops to run: publish, recurring or both",
        default="both",
        parse=choice("both", "publish", "recurring"),
    )
    migrate: str = setting(
        env="SCHEDLOCK_MIGRATE",
        help="auto: apply missing migrations at start; off: wait until an owner ran "
        "`schedlock migrate`",
        default="auto",
        parse=choice("auto", "off"),
    )
    log_level: str = log_level_setting()
    log_format: str = log_format_setting()

    def validate(self) -> None:
        cls = type(self)
        if not self.database_url:
            raise SettingError(spec_of(cls, "database_url"), "is required")
        if not self.target:
            raise SettingError(spec_of(cls, "target"), "is required (the app these rows are for)")
        if self.heartbeat_seconds > self.lease_seconds / 3:
            raise SettingError(
                spec_of(cls, "heartbeat_seconds"),
                f"must be at most a third of the lease ({self.lease_seconds:g}s / 3), "
                f"got {self.heartbeat_seconds:g}",
            )

    @property
    def holder_name(self) -> str:
        return self.holder or socket.gethostname()

    @property
    def scheduler_names(self) -> tuple[str, ...]:
        return ("publish", "recurring") if self.schedulers == "both" else (self.schedulers,)

    @property
    def step_down_after(self) -> float:
        """Step down when no heartbeat succeeded for this long: the lease minus a margin."""
        return self.lease_seconds - max(1.0, self.lease_seconds * 0.2)

    @property
    def target_check_timeout(self) -> float:
        """How long one readiness check may take: the interval, within 1 to 5 seconds."""
        return min(max(self.target_check_seconds, 1.0), 5.0)

    def signing_secret(self) -> bytes | None:
        if self.signing_secret_file is None:
            return None
        return self.signing_secret_file.read_bytes().strip()
