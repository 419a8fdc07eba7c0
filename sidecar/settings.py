"""The sidecar's settings: one typed object built once from flags and SCHEDLOCK_* variables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from schedlock.core.identities import Scheduler
from schedlock.core.settings import (
    RetentionSettings,
    ServiceSettings,
    SettingError,
    check_url,
    choice,
    database_setting,
    dns_label,
    host,
    http_url,
    integer,
    number,
    readable_file,
    setting,
    spec_of,
)
from schedlock.core.timings import (
    DEFAULT_LEASE_SECONDS,
    HEARTBEAT_SHARE,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
    LeaseTimingError,
    LeaseTimings,
)


@dataclass(frozen=True)
class SidecarSettings(RetentionSettings, ServiceSettings):
    database_url: str = database_setting(
        "database shared by all replicas: postgresql://… (advisory locks) or sqlite:///path "
        "(one process, always leader)"
    )
    namespace: str = setting(
        "SCHEDLOCK_NAMESPACE",
        "default",
        dns_label,
        help="namespace whose rows this sidecar fires (part of every lock key)",
    )
    target: str = setting(
        "SCHEDLOCK_TARGET",
        "",
        dns_label,
        help="target (app) whose rows this sidecar fires (part of every lock key)",
    )
    target_url: str = setting(
        "SCHEDLOCK_TARGET_URL",
        "http://127.0.0.1:8080/schedlock",
        http_url,
        "url",
        help="the app's hook: every fire is POSTed here",
    )
    target_ready_url: str = setting(
        "SCHEDLOCK_TARGET_READY_URL",
        "",
        check_url,
        "url",
        help="readiness check of the app: the sidecar competes for and holds leadership only "
        "while it passes. tcp://host:port connects; http(s)://… GETs (200-399 is ready); "
        "unset, a TCP connect to the host and port of the target URL",
    )
    target_check_seconds: float = setting(
        "SCHEDLOCK_TARGET_CHECK_SECONDS",
        1.0,
        number(0.05, 60),
        "seconds",
        help="interval of the readiness check; each check may take this long, at least 1 s and "
        "at most 5 s",
    )
    target_failure_threshold: int = setting(
        "SCHEDLOCK_TARGET_FAILURE_THRESHOLD",
        2,
        integer(1, 100),
        "checks",
        help="failed checks in a row after which a reachable app counts as unreachable (the "
        "leader hands over); a delivery that lost its connection, then one failed check, hands "
        "over at once",
    )
    target_success_threshold: int = setting(
        "SCHEDLOCK_TARGET_SUCCESS_THRESHOLD",
        2,
        integer(1, 100),
        "checks",
        help="passing checks in a row after which an unreachable app counts as reachable again "
        "(the sidecar competes again): the hysteresis against flapping",
    )
    http_port: int = setting(
        "SCHEDLOCK_HTTP_PORT",
        9090,
        integer(0, 65535),
        "port",
        help="port for /metrics, /healthz and /readyz (0 picks a free port)",
    )
    http_host: str = setting(
        "SCHEDLOCK_HTTP_HOST",
        "0.0.0.0",
        host,
        "address",
        help="address the metrics/health server binds to",
    )
    lease_seconds: float = setting(
        "SCHEDLOCK_LEASE_SECONDS",
        DEFAULT_LEASE_SECONDS,
        number(MIN_LEASE_SECONDS, MAX_LEASE_SECONDS),
        "seconds",
        help="server-side lease (idle_session_timeout of the lock session): a frozen or "
        "partitioned leader loses the lock after this long; the heartbeat, the step-down and "
        "the session's TCP keepalives derive from it",
    )
    heartbeat_override: float | None = setting(
        "SCHEDLOCK_HEARTBEAT_SECONDS",
        None,
        number(0.2, 100),
        "seconds",
        help="how often the leader proves its session alive; at most a third of the lease",
        shown=f"{HEARTBEAT_SHARE:g} x the lease",
    )
    standbys: int = setting(
        "SCHEDLOCK_STANDBYS",
        1,
        integer(0, 10000),
        "sessions",
        help="standby places per target: at most this many replicas wait for leadership on "
        "a session of their own (millisecond hand-over); the others hold no session and "
        "check now and then for a free place. A replica uses one session for all its keys, so "
        "a target costs at most 1 + this many sessions, whatever the replica count; if the "
        "leader and every standby die at once, a reserve leads within about "
        "SCHEDLOCK_RESERVE_CHECK_SECONDS",
    )
    reserve_check_seconds: float = setting(
        "SCHEDLOCK_RESERVE_CHECK_SECONDS",
        5.0,
        number(0.2, 600),
        "seconds",
        help="replicas without a session check for a free standby place in turns: together "
        "about once per this interval per key, whatever their number. Bounds the takeover "
        "when the leader and every standby die at once: a tenth over it, plus a connection",
    )
    batch_size: int = setting(
        "SCHEDLOCK_BATCH_SIZE", 100, integer(1, 10000), "rows", help="rows claimed per round trip"
    )
    concurrency: int = setting(
        "SCHEDLOCK_CONCURRENCY",
        64,
        integer(1, 1024),
        "requests",
        help="deliveries in flight at once per scheduler",
    )
    request_timeout_seconds: float = setting(
        "SCHEDLOCK_REQUEST_TIMEOUT_SECONDS",
        10.0,
        number(0.1, 600),
        "seconds",
        help="time the app has to answer one delivery before it counts as a retryable timeout",
    )
    poll_seconds: float = setting(
        "SCHEDLOCK_POLL_SECONDS",
        30.0,
        number(0.1, 3600),
        "seconds",
        help="safety poll: the leader re-reads due rows at least this often even without NOTIFY",
    )
    shutdown_grace_seconds: float = setting(
        "SCHEDLOCK_SHUTDOWN_GRACE_SECONDS",
        2.0,
        number(0, 600),
        "seconds",
        help="on SIGTERM, how long in-flight deliveries may finish before they are abandoned "
        "(the next leader re-fires them with the same idempotency key)",
    )
    signing_secret_file: Path | None = setting(
        "SCHEDLOCK_SIGNING_SECRET_FILE",
        None,
        readable_file,
        "path",
        help="file holding the HMAC-SHA256 key; when set every delivery carries "
        "X-Schedlock-Signature",
    )
    schedulers: str = setting(
        "SCHEDLOCK_SCHEDULERS",
        "both",
        choice("both", *Scheduler),
        help="which scheduler loops to run: publish, recurring or both",
    )

    def validate(self) -> None:
        super().validate()
        if not self.target:
            raise SettingError(
                spec_of(type(self), "target"), "is required (the app these rows are for)"
            )
        try:
            self.timings  # noqa: B018 (built to check the rules)
        except LeaseTimingError as exc:
            name = "lease_seconds" if exc.setting == "lease" else "heartbeat_override"
            raise SettingError(spec_of(type(self), name), str(exc)) from None

    @property
    def timings(self) -> LeaseTimings:
        """The lease and what derives from it (heartbeat, step-down, keepalives)."""
        return LeaseTimings(self.lease_seconds, self.heartbeat_override)

    @property
    def scheduler_names(self) -> tuple[str, ...]:
        return tuple(Scheduler) if self.schedulers == "both" else (Scheduler(self.schedulers),)

    @property
    def target_check_timeout(self) -> float:
        """How long one readiness check may take: the interval, within 1 to 5 seconds."""
        return min(max(self.target_check_seconds, 1.0), 5.0)

    def signing_secret(self) -> bytes | None:
        if self.signing_secret_file is None:
            return None
        return self.signing_secret_file.read_bytes().strip()
