"""The operator's settings: one typed object from flags and SCHEDLOCK_* variables."""

from __future__ import annotations

import copy
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedlock import __version__
from schedlock.core.settings import (
    SettingError,
    choice,
    database_url,
    host,
    integer,
    log_format_setting,
    log_level_setting,
    number,
    readable_file,
    setting,
    spec_of,
    text,
)
from schedlock.operator.injection import (
    DEFAULT_RESOURCES,
    DNS_SUBDOMAIN,
    InjectionConfig,
    SecretRef,
    parse_resources,
    parse_signing_secret,
)

DEFAULT_IMAGE = f"ghcr.io/schedlock/schedlock:{__version__}"


def dns_subdomain(raw: str) -> str:
    value = raw.strip()
    if not DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError(f"must be a Kubernetes object name (DNS subdomain), got {raw!r}")
    return value


def namespace_list(raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    for name in names:
        if not name.replace("-", "").isalnum() or name != name.lower() or len(name) > 63:
            raise ValueError(f"must be a comma-separated list of namespace names, got {name!r}")
    return names


@dataclass(frozen=True)
class OperatorSettings:
    database_url: str = setting(
        env="SCHEDLOCK_DATABASE_URL",
        help="PostgreSQL shared with the sidecars (postgresql://…; the operator needs LISTEN/NOTIFY)",
        default="",
        parse=database_url,
        unit="url",
        secret=True,
    )
    watch_namespaces: tuple[str, ...] = setting(
        env="SCHEDLOCK_WATCH_NAMESPACES",
        help="comma-separated namespaces to serve; empty serves the whole cluster",
        default=(),
        parse=namespace_list,
        unit="list",
    )
    health_port: int = setting(
        env="SCHEDLOCK_HEALTH_PORT",
        help="port of /healthz (alive) and /readyz (ready: database usable, watches running)",
        default=8080,
        parse=integer(1, 65535),
        unit="port",
    )
    webhook_port: int = setting(
        env="SCHEDLOCK_WEBHOOK_PORT",
        help="port of the HTTPS admission webhook (validation of ScheduledPublish objects)",
        default=9443,
        parse=integer(1, 65535),
        unit="port",
    )
    webhook_host: str = setting(
        env="SCHEDLOCK_WEBHOOK_HOST",
        help="address the webhook server binds to",
        default="0.0.0.0",
        parse=host,
        unit="address",
    )
    webhook_cert_file: Path | None = setting(
        env="SCHEDLOCK_WEBHOOK_CERT_FILE",
        help="TLS certificate (PEM) of the webhook; the webhook is off when unset",
        default=None,
        parse=readable_file,
        unit="path",
    )
    webhook_key_file: Path | None = setting(
        env="SCHEDLOCK_WEBHOOK_KEY_FILE",
        help="TLS private key (PEM) of the webhook",
        default=None,
        parse=readable_file,
        unit="path",
    )
    sidecar_image: str = setting(
        env="SCHEDLOCK_SIDECAR_IMAGE",
        help="image of the sidecar the injection webhook adds to opted-in pods",
        default=DEFAULT_IMAGE,
        parse=text(253),
        unit="image",
    )
    sidecar_database_secret: str = setting(
        env="SCHEDLOCK_SIDECAR_DATABASE_SECRET",
        help="Secret in each app namespace holding the sidecars' database URL "
        "(a pod can name another with the schedlock.dev/database-secret annotation)",
        default="schedlock-database",
        parse=dns_subdomain,
    )
    sidecar_database_secret_key: str = setting(
        env="SCHEDLOCK_SIDECAR_DATABASE_SECRET_KEY",
        help="key of the database URL in that Secret",
        default="url",
        parse=text(253),
    )
    sidecar_lease_seconds: float = setting(
        env="SCHEDLOCK_SIDECAR_LEASE_SECONDS",
        help="lease of the injected sidecars (how long a frozen leader keeps its keys)",
        default=10.0,
        parse=number(2, 300),
        unit="seconds",
    )
    sidecar_resources: dict[str, Any] | None = setting(
        env="SCHEDLOCK_SIDECAR_RESOURCES",
        help="resources of the injected sidecar container, as JSON",
        default=None,
        parse=parse_resources,
        unit="json",
    )
    sidecar_signing_secret: SecretRef | None = setting(
        env="SCHEDLOCK_SIDECAR_SIGNING_SECRET",
        help="Secret in each app namespace whose key signs the injected sidecars' deliveries, "
        "as NAME or NAME/KEY (KEY defaults to signing-secret); empty: no signing. A pod's "
        "schedlock.dev/signing-secret annotation overrides it (empty: off for that pod)",
        default=None,
        parse=parse_signing_secret,
        unit="secret",
    )
    sweep_seconds: float = setting(
        env="SCHEDLOCK_SYNC_SWEEP_SECONDS",
        help="how often the status sync re-reads changed rows (repairs lost notifications)",
        default=30.0,
        parse=number(1, 3600),
        unit="seconds",
    )
    reassert_seconds: float = setting(
        env="SCHEDLOCK_REASSERT_SECONDS",
        help="how often every object's row is compared with the object and restored when "
        "missing or stale (a restore from a backup, an asynchronous fail-over); at most 60 by "
        "default so a lost row comes back within a minute",
        default=30.0,
        parse=number(1, 3600),
        unit="seconds",
    )
    holder: str = setting(
        env="SCHEDLOCK_HOLDER",
        help="this replica's name in the database (application_name); defaults to the host name",
        default="",
        parse=text(63),
    )
    migrate: str = setting(
        env="SCHEDLOCK_MIGRATE",
        help="auto: apply missing migrations at start; off: wait for `schedlock migrate`",
        default="auto",
        parse=choice("auto", "off"),
    )
    log_level: str = log_level_setting()
    log_format: str = log_format_setting()

    def validate(self) -> None:
        cls = type(self)
        if not self.database_url:
            raise SettingError(spec_of(cls, "database_url"), "is required")
        if self.database_url.startswith("sqlite"):
            raise SettingError(
                spec_of(cls, "database_url"),
                "must be a postgresql:// URL (the operator listens for outcomes with NOTIFY)",
            )
        if (self.webhook_cert_file is None) != (self.webhook_key_file is None):
            raise SettingError(
                spec_of(cls, "webhook_key_file"),
                "set both SCHEDLOCK_WEBHOOK_CERT_FILE and SCHEDLOCK_WEBHOOK_KEY_FILE, or neither",
            )

    @property
    def holder_name(self) -> str:
        return self.holder or socket.gethostname()

    @property
    def webhook_enabled(self) -> bool:
        return self.webhook_cert_file is not None

    @property
    def injection(self) -> InjectionConfig:
        return InjectionConfig(
            image=self.sidecar_image,
            database_secret=self.sidecar_database_secret,
            database_secret_key=self.sidecar_database_secret_key,
            lease_seconds=self.sidecar_lease_seconds,
            resources=self.sidecar_resources or copy.deepcopy(DEFAULT_RESOURCES),
            signing_secret=self.sidecar_signing_secret,
        )
