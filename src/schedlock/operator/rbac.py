"""The operator's least-privilege RBAC rules — the one place the chart and the tests use.

Every rule is here because a code path needs it:

* ``scheduledpublishes``: get/list/watch (kopf watches them), patch (kopf's finalizer and
  progress annotations under ``schedlock.dev/``).
* ``scheduledpublishes/status``: get/patch (handlers and the status sync write ``.status``).
* ``events`` (core): create/patch (kopf's and the sync's Events).

Not granted (and tested as refused): delete or create of ScheduledPublish, Secrets, Pods,
CRDs and namespaces (kopf's scanning is disabled), leases/peering objects (standalone mode).
"""

from __future__ import annotations

from typing import Any

from schedlock.operator.crd import GROUP, PLURAL


def operator_rules() -> list[dict[str, Any]]:
    return [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]


def cluster_role(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": labels or {}},
        "rules": operator_rules(),
    }


def cluster_role_binding(
    name: str, role: str, namespace: str, service_account: str
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
