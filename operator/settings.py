"""The operator's settings: one typed object from flags and SCHEDLOCK_* variables.

:class:`InjectionSettings` are what every injected sidecar gets; ``schedlock inject`` takes the
same fields as plain flags, so the webhook and the command parse and default them alike.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from schedlock.core.settings import (
    RetentionSettings,
    ServiceSettings,
    SettingError,
    database_setting,
    host,
    integer,
    number,
    quoted,
    readable_file,
    setting,
    spec_of,
    text,
)
from schedlock.core.timings import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS, MIN_LEASE_SECONDS
from schedlock.operator.injection import (
    DEFAULT_DATABASE_SECRET,
    DEFAULT_DATABASE_SECRET_KEY,
    DEFAULT_IMAGE,
    DEFAULT_RESOURCES,
    DNS_SUBDOMAIN,
    InjectionConfig,
    SecretRef,
    parse_resources,
    parse_signing_secret,
)


def dns_subdomain(raw: str) -> str:
    value = raw.strip()
    if not DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError(f"must be a Kubernetes object name (DNS subdomain), got {quoted(raw)}")
    return value


def namespace_list(raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    for name in names:
        if not name.replace("-", "").isalnum() or name != name.lower() or len(name) > 63:
            raise ValueError(
                f"must be a comma-separated list of namespace names, got {quoted(name)}"
            )
    return names


@dataclass(frozen=True)
class InjectionSettings:
    sidecar_image: str = setting(
        "SCHEDLOCK_SIDECAR_IMAGE",
        DEFAULT_IMAGE,
        text(253),
        "image",
        help="image of the sidecar added to opted-in pods",
    )
    sidecar_database_secret: str = setting(
        "SCHEDLOCK_SIDECAR_DATABASE_SECRET",
        DEFAULT_DATABASE_SECRET,
        dns_subdomain,
        help="Secret in each app namespace holding the sidecars' database URL "
        "(a pod can name another with the schedlock.dev/database-secret annotation)",
    )
    sidecar_database_secret_key: str = setting(
        "SCHEDLOCK_SIDECAR_DATABASE_SECRET_KEY",
        DEFAULT_DATABASE_SECRET_KEY,
        text(253),
        help="key of the database URL in that Secret",
    )
    sidecar_lease_seconds: float = setting(
        "SCHEDLOCK_SIDECAR_LEASE_SECONDS",
        DEFAULT_LEASE_SECONDS,
        number(MIN_LEASE_SECONDS, MAX_LEASE_SECONDS),
        "seconds",
        help="lease of the injected sidecars (how long a frozen leader keeps its keys); "
        "they derive their heartbeat from it",
    )
    sidecar_resources: dict[str, Any] | None = setting(
        "SCHEDLOCK_SIDECAR_RESOURCES",
        None,
        parse_resources,
        "json",
        help="resources of the injected sidecar container, as JSON",
    )
    sidecar_signing_secret: SecretRef | None = setting(
        "SCHEDLOCK_SIDECAR_SIGNING_SECRET",
        None,
        parse_signing_secret,
        "secret",
        help="Secret in each app namespace whose key signs the injected sidecars' deliveries, "
        "as NAME or NAME/KEY (KEY defaults to signing-secret); empty: no signing. A pod's "
        "schedlock.dev/signing-secret annotation overrides it (empty: off for that pod)",
    )

    @property
    def injection(self) -> InjectionConfig:
        return self.injection_of()

    def injection_of(self) -> InjectionConfig:
        """These settings as the injection's configuration."""
        return InjectionConfig(
            image=self.sidecar_image,
            database_secret=self.sidecar_database_secret,
            database_secret_key=self.sidecar_database_secret_key,
            lease_seconds=self.sidecar_lease_seconds,
            resources=self.sidecar_resources or copy.deepcopy(DEFAULT_RESOURCES),
            signing_secret=self.sidecar_signing_secret,
        )


@dataclass(frozen=True)
class OperatorSettings(InjectionSettings, RetentionSettings, ServiceSettings):
    database_url: str = database_setting(
        "PostgreSQL shared with the sidecars (postgresql://…; the operator needs LISTEN/NOTIFY)"
    )
    watch_namespaces: tuple[str, ...] = setting(
        "SCHEDLOCK_WATCH_NAMESPACES",
        (),
        namespace_list,
        "list",
        help="comma-separated namespaces to serve; empty serves the whole cluster",
    )
    health_port: int = setting(
        "SCHEDLOCK_HEALTH_PORT",
        8080,
        integer(1, 65535),
        "port",
        help="port of /healthz (alive) and /readyz (ready: database usable, watches running)",
    )
    webhook_port: int = setting(
        "SCHEDLOCK_WEBHOOK_PORT",
        9443,
        integer(1, 65535),
        "port",
        help="port of the HTTPS admission webhook (validation of ScheduledPublish objects)",
    )
    webhook_host: str = setting(
        "SCHEDLOCK_WEBHOOK_HOST",
        "0.0.0.0",
        host,
        "address",
        help="address the webhook server binds to",
    )
    webhook_cert_file: Path | None = setting(
        "SCHEDLOCK_WEBHOOK_CERT_FILE",
        None,
        readable_file,
        "path",
        help="TLS certificate (PEM) of the webhook; the webhook is off when unset",
    )
    webhook_key_file: Path | None = setting(
        "SCHEDLOCK_WEBHOOK_KEY_FILE",
        None,
        readable_file,
        "path",
        help="TLS private key (PEM) of the webhook",
    )
    sweep_seconds: float = setting(
        "SCHEDLOCK_SYNC_SWEEP_SECONDS",
        30.0,
        number(1, 3600),
        "seconds",
        help="how often the status sync re-reads changed rows (repairs lost notifications)",
    )
    sync_catch_up_seconds: float = setting(
        "SCHEDLOCK_SYNC_CATCH_UP_SECONDS",
        3600.0,
        number(0, 7 * 86400),
        "seconds",
        help="how far back the status sync starts when the database has no sync cursor yet "
        "(a new database, or an upgrade from a release without one); once it has one, the "
        "sync resumes from it whatever its age",
    )
    reassert_seconds: float = setting(
        "SCHEDLOCK_REASSERT_SECONDS",
        30.0,
        number(1, 3600),
        "seconds",
        help="how often every object's row is compared with the object and restored when "
        "missing or stale (a restore from a backup, an asynchronous fail-over); at most 60 by "
        "default so a lost row comes back within a minute",
    )

    def validate(self) -> None:
        super().validate()
        if self.database_url.startswith("sqlite"):
            raise SettingError(
                spec_of(type(self), "database_url"),
                "must be a postgresql:// URL (the operator listens for outcomes with NOTIFY)",
            )
        if (self.webhook_cert_file is None) != (self.webhook_key_file is None):
            raise SettingError(
                spec_of(type(self), "webhook_key_file"),
                "set both SCHEDLOCK_WEBHOOK_CERT_FILE and SCHEDLOCK_WEBHOOK_KEY_FILE, or neither",
            )

    @property
    def injection(self) -> InjectionConfig:
        """The injected sidecars use the operator's database schema and prune by its own
        retention settings."""
        return replace(
            self.injection_of(),
            retention=self.retention_env(),
            database_schema=self.database_schema,
        )

    @property
    def webhook_enabled(self) -> bool:
        return self.webhook_cert_file is not None
