"""The test API server is real: TLS, RBAC and ServiceAccount tokens behave as in a cluster.

If these pass, a component test that runs with `service_account_kubeconfig()` proves the chart's
RBAC grants what the component needs, and nothing it does passes on admin rights by accident.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from testbed.kube import KubeAPIServer

pytestmark = pytest.mark.integration


def _configmap(namespace: str, name: str = "probe") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"hello": "world"},
    }


def _grant_configmaps(kube: KubeAPIServer, namespace: str, service_account: str) -> None:
    kube.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "configmap-writer", "namespace": namespace},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["configmaps"],
                        "verbs": ["create", "get", "patch"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "configmap-writer", "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "configmap-writer",
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
                ],
            },
        ]
    )


def _apply_until_allowed(
    kube: KubeAPIServer, manifest: dict[str, Any], kubeconfig: Path, timeout: float = 10
) -> subprocess.CompletedProcess[str]:
    """Apply, retrying while the RBAC authorizer's informer has not seen the new binding yet."""
    deadline = time.monotonic() + timeout
    while True:
        result = kube.apply(manifest, kubeconfig, check=False)
        if result.returncode == 0 or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def test_admin_can_apply_a_configmap(kube: KubeAPIServer, kube_namespace: str) -> None:
    result = kube.apply(_configmap(kube_namespace))

    assert "configmap/probe created" in result.stdout
    got = kube.kubectl("get", "configmap", "probe", "-n", kube_namespace, "-o", "yaml")
    assert "hello: world" in got.stdout


def test_service_account_without_rbac_is_forbidden(
    kube: KubeAPIServer, kube_namespace: str
) -> None:
    config = kube.service_account_kubeconfig(kube_namespace, "nobody")

    result = kube.apply(_configmap(kube_namespace), config, check=False)

    assert result.returncode != 0
    assert "forbidden" in result.stderr.lower()
    assert f"system:serviceaccount:{kube_namespace}:nobody" in result.stderr
    assert "client-certificate" not in config.read_text()


def test_service_account_with_role_can_apply(kube: KubeAPIServer, kube_namespace: str) -> None:
    config = kube.service_account_kubeconfig(kube_namespace, "writer")
    denied = kube.apply(_configmap(kube_namespace), config, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()

    _grant_configmaps(kube, kube_namespace, "writer")
    result = _apply_until_allowed(kube, _configmap(kube_namespace), config)

    assert result.returncode == 0, result.stderr
    assert "configmap/probe created" in result.stdout
    # Still only what the Role grants: the namespace's secrets stay out of reach.
    secrets = kube.kubectl("get", "secrets", "-n", kube_namespace, kubeconfig=config, check=False)
    assert secrets.returncode != 0
    assert "forbidden" in secrets.stderr.lower()


def test_readyz_is_ok(kube: KubeAPIServer) -> None:
    result = kube.kubectl("get", "--raw", "/readyz")

    assert result.stdout.strip() == "ok"


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_stop_leaves_no_process(tmp_path: Path) -> None:
    server = KubeAPIServer(tmp_path)
    with server:
        pids = server.pids
        assert set(pids) == {"etcd", "kube-apiserver"}
        assert all(not _process_gone(pid) for pid in pids.values())
        assert server.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"

    assert server.pids == {}
    for name, pid in pids.items():
        assert _process_gone(pid), f"{name} (pid {pid}) survived stop()"
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
