"""A real ``schedlock operator`` process under a ServiceAccount with exactly the chart's RBAC."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from schedlock.core.identities import rfc3339
from schedlock.operator.crd import crd_manifest
from schedlock.operator.injection import LABEL_INJECT, LABEL_INJECT_VALUE
from testbed.certs import ServingCert, serving_cert
from testbed.kube import KubeAPIServer
from testbed.pg import free_port
from testbed.pg_fixtures import OPERATOR_ROLE, RUNTIME_ENV, SIDECAR_ROLE, PostgresService, as_role
from testbed.procs import die_with_parent, terminate
from testbed.rbac import operator_rbac
from testbed.sidecars import SidecarGroup, http_get, wait_for

OPERATOR_NAMESPACE = "schedlock-system"
OPERATOR_SA = "schedlock-operator"


def install_crd(kube: KubeAPIServer) -> None:
    kube.apply(crd_manifest())
    kube.wait_established("scheduledpublishes.schedlock.dev")


def operator_kubeconfig(kube: KubeAPIServer) -> Path:
    """A kubeconfig for the operator's ServiceAccount bound to exactly operator_rules()."""
    kube.kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    rbac: list[Mapping[str, Any]] = [
        *operator_rbac("schedlock-operator", OPERATOR_NAMESPACE, OPERATOR_SA)
    ]
    kube.apply(rbac)
    return kube.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SA)


def webhook_configuration(port: int, ca_pem: bytes) -> dict[str, Any]:
    """What the chart renders for the operator's validating webhook, pointed at localhost."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "schedlock-test-validate"},
        "webhooks": [
            {
                "name": "scheduledpublishes.schedlock.dev",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/validate",
                    "caBundle": base64.b64encode(ca_pem).decode(),
                },
                "rules": [
                    {
                        "apiGroups": ["schedlock.dev"],
                        "apiVersions": ["v1"],
                        "resources": ["scheduledpublishes"],
                        "operations": ["CREATE", "UPDATE"],
                        "scope": "Namespaced",
                    }
                ],
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Ignore",
                "timeoutSeconds": 5,
            }
        ],
    }


def mutating_webhook_configuration(port: int, ca_pem: bytes, namespace: str) -> dict[str, Any]:
    """What the chart renders for sidecar injection, pointed at localhost, scoped to one
    namespace of the test (the chart excludes kube-system and its own namespace)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": f"schedlock-test-inject-{namespace}"},
        "webhooks": [
            {
                "name": "inject.schedlock.dev",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/inject",
                    "caBundle": base64.b64encode(ca_pem).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "operations": ["CREATE"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                # The chart's: only pods with the opt-in label are sent (test_chart.py).
                "objectSelector": {"matchLabels": {LABEL_INJECT: LABEL_INJECT_VALUE}},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": 5,
            }
        ],
    }


@dataclass
class OperatorProcess:
    workdir: Path
    database_url: str
    kubeconfig: Path
    webhook: ServingCert | None = None
    health_port: int = field(default_factory=free_port)
    webhook_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    holder: str = "operator-test"

    @property
    def log_path(self) -> Path:
        return self.workdir / "operator.log"

    def spawn(self) -> None:
        """Start the process and return at once (``start`` also waits until it is live)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SCHEDLOCK_")},
            "KUBECONFIG": str(self.kubeconfig),
            "SCHEDLOCK_DATABASE_URL": self.database_url,
            "SCHEDLOCK_HEALTH_PORT": str(self.health_port),
            "SCHEDLOCK_WEBHOOK_PORT": str(self.webhook_port),
            "SCHEDLOCK_WEBHOOK_HOST": "127.0.0.1",
            "SCHEDLOCK_HOLDER": self.holder,
            "SCHEDLOCK_SYNC_SWEEP_SECONDS": "5",
            **self.extra_env,
        }
        if self.webhook is not None:
            env["SCHEDLOCK_WEBHOOK_CERT_FILE"] = str(self.webhook.cert_file)
            env["SCHEDLOCK_WEBHOOK_KEY_FILE"] = str(self.webhook.key_file)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).parent / "schedlock"), "operator"],
                env=env,
                stdout=log,
                stderr=log,
                cwd=self.workdir,
                preexec_fn=die_with_parent(),
            )

    def start(self) -> OperatorProcess:
        self.spawn()
        wait_for(
            lambda: (
                http_get(f"http://127.0.0.1:{self.health_port}/healthz")[0] == 200
                or not self.alive()
            ),
            timeout=60,
            what="the operator's liveness endpoint",
        )
        assert self.alive(), self.log_text()
        if self.webhook is not None:
            wait_for(
                lambda: _listening(self.webhook_port) or not self.alive(),
                timeout=30,
                what="the operator's webhook server",
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.process is not None and self.alive():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        terminate(self.process, 15)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def with_webhook(workdir: Path) -> ServingCert:
    return serving_cert(workdir / "webhook-tls")


def at(seconds: float) -> str:
    """An RFC 3339 time `seconds` from now, as `spec.publishAt` takes it."""
    return rfc3339(datetime.now(UTC) + timedelta(seconds=seconds), "microseconds")


@dataclass
class OperatorStack:
    """The operator and two sidecars on one fresh database, objects in one namespace."""

    kube: KubeAPIServer
    database: str
    namespace: str
    operator: OperatorProcess
    sidecars: SidecarGroup

    def apply(self, name: str, **spec: Any) -> dict[str, Any]:
        obj = {
            "apiVersion": "schedlock.dev/v1",
            "kind": "ScheduledPublish",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"target": "demo", **spec},
        }
        self.kube.apply(obj)
        return obj

    def get(self, name: str) -> dict[str, Any] | None:
        out = self.kube.kubectl("get", "sp", name, "-n", self.namespace, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def uid(self, name: str, timeout: float = 10) -> str:
        return str(
            wait_for(
                lambda: (self.get(name) or {}).get("metadata", {}).get("uid"),
                timeout=timeout,
                what=f"the object {name}",
            )
        )

    def status(self, name: str) -> dict[str, Any]:
        return (self.get(name) or {}).get("status") or {}

    def events(self, name: str) -> list[str]:
        out = self.kube.kubectl(
            "get", "events", "-n", self.namespace, "-o", "json",
            "--field-selector", f"involvedObject.name={name}",
        )  # fmt: skip
        return [e["reason"] for e in json.loads(out.stdout)["items"]]

    def sql(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def deliveries(self, uid: str) -> list[dict[str, Any]]:
        assert self.sidecars.receiver is not None
        return [e for e in self.sidecars.receiver.entries() if e["uid"] == uid]


S = TypeVar("S", bound=OperatorStack)


@contextmanager
def operator_stack(
    cls: type[S],
    kube: KubeAPIServer,
    postgres: PostgresService,
    template: str,
    workdir: Path,
    namespace: str,
    *,
    webhooks: bool = False,
    operator_env: dict[str, str] | None = None,
) -> Iterator[S]:
    """A fresh database from the migrated template, the CRD, the operator under its
    ServiceAccount with the least-privilege role (its webhooks registered when asked),
    two sidecars and a recording app in `namespace`; all torn down after."""
    database = postgres.create_database(template=template)
    install_crd(kube)
    kube.kubectl("create", "namespace", namespace, check=False)
    cert = with_webhook(workdir) if webhooks else None
    operator = OperatorProcess(
        workdir / "operator",
        as_role(database, OPERATOR_ROLE),  # least privilege, no DDL
        operator_kubeconfig(kube),
        webhook=cert,
        extra_env={**RUNTIME_ENV, **(operator_env or {})},
    ).start()
    if cert is not None:
        kube.apply(webhook_configuration(operator.webhook_port, cert.ca_pem))
        kube.apply(mutating_webhook_configuration(operator.webhook_port, cert.ca_pem, namespace))
    sidecars = SidecarGroup(
        workdir / "sidecars",
        as_role(database, SIDECAR_ROLE),
        namespace=namespace,
        replicas=2,
        extra_env=RUNTIME_ENV,
    ).start()
    try:
        yield cls(kube, database, namespace, operator, sidecars)
    finally:
        if cert is not None:
            kube.kubectl(
                "delete", "validatingwebhookconfiguration", "schedlock-test-validate", check=False
            )
        sidecars.stop()
        operator.stop()
        postgres.drop_database(database)


def operator_stack_fixture(
    cls: type[S],
    namespace: str,
    *,
    webhooks: bool = False,
    operator_env: dict[str, str] | None = None,
) -> Any:
    """A module-scoped pytest fixture yielding ``operator_stack(cls, ...)`` in its own workdir."""

    @pytest.fixture(scope="module")
    def stack(
        kube: KubeAPIServer,
        postgres: PostgresService,
        migrated_template: str,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Iterator[S]:
        workdir = tmp_path_factory.mktemp(namespace)
        with operator_stack(
            cls, kube, postgres, migrated_template, workdir, namespace,
            webhooks=webhooks, operator_env=operator_env,
        ) as running:  # fmt: skip
            yield running

    return stack
