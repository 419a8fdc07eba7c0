"""A real ``schedlock operator`` process under a ServiceAccount with exactly the chart's RBAC."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlock.operator.crd import crd_manifest
from schedlock.operator.rbac import cluster_role, cluster_role_binding

from tests.support.certs import ServingCert, serving_cert
from tests.support.kube import KubeAPIServer
from tests.support.pg import free_port
from tests.support.procs import die_with_parent, terminate
from tests.support.sidecars import http_get, wait_for

OPERATOR_NAMESPACE = "schedlock-system"
OPERATOR_SA = "schedlock-operator"


def install_crd(kube: KubeAPIServer) -> None:
    kube.apply(crd_manifest())
    kube.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/scheduledpublishes.schedlock.dev",
    )


def operator_kubeconfig(kube: KubeAPIServer) -> Path:
    """A kubeconfig for the operator's ServiceAccount bound to exactly operator_rules()."""
    kube.kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    kube.apply(cluster_role("schedlock-operator"))
    kube.apply(
        cluster_role_binding(
            "schedlock-operator", "schedlock-operator", OPERATOR_NAMESPACE, OPERATOR_SA
        )
    )
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

    @property
    def log_path(self) -> Path:
        return self.workdir / "operator.log"

    def start(self) -> OperatorProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SCHEDLOCK_")},
            "KUBECONFIG": str(self.kubeconfig),
            "SCHEDLOCK_DATABASE_URL": self.database_url,
            "SCHEDLOCK_HEALTH_PORT": str(self.health_port),
            "SCHEDLOCK_WEBHOOK_PORT": str(self.webhook_port),
            "SCHEDLOCK_WEBHOOK_HOST": "127.0.0.1",
            "SCHEDLOCK_HOLDER": "operator-test",
            "SCHEDLOCK_SYNC_SWEEP_SECONDS": "5",
            **self.extra_env,
        }
        if self.webhook is not None:
            env["SCHEDLOCK_WEBHOOK_CERT_FILE"] = str(self.webhook.cert_file)
            env["SCHEDLOCK_WEBHOOK_KEY_FILE"] = str(self.webhook.key_file)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "schedlock"), "operator"],
            env=env,
            stdout=log,
            stderr=log,
            cwd=self.workdir,
            preexec_fn=die_with_parent(),
        )
        log.close()
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
