"""The operator's least-privilege RBAC — the one place the chart and the tests use.

Every rule is here because a code path needs it:

* ``scheduledpublishes``: get/list/watch (kopf watches them), patch (kopf's finalizer and
  progress annotations under ``schedlock.dev/``).
* ``scheduledpublishes/status``: get/patch (handlers and the status sync write ``.status``).
* ``events`` (core): create/patch (kopf's and the sync's Events).

Every one of them is on a namespaced resource, so where they are granted follows what the
operator serves (``SCHEDLOCK_WATCH_NAMESPACES``, the chart's ``operator.watchNamespaces``):

* the whole cluster (empty): one ClusterRole with the rules, bound by a ClusterRoleBinding;
* a list of namespaces: a Role with the same rules in each, bound there by a RoleBinding, and
  nothing cluster-wide.  kopf run with ``namespaces=[…]`` watches each one on its own
  namespaced URL; with scanning disabled it neither lists nor watches namespaces or CRDs, and in
  standalone mode it has no peering objects, so no cluster-scoped rule is needed at all.  API
  discovery (``/api``, ``/apis``) is open to every authenticated user (``system:discovery``).

Not granted (and tested as refused): delete or create of ScheduledPublish, Secrets, Pods,
CRDs and namespaces (kopf's scanning is disabled), leases/peering objects (standalone mode),
and, with a list of namespaces, anything in a namespace not on it.

The chart renders the same objects from the generated rules file
(``charts/schedlock/files/operator-rbac-rules.yaml``, ``hack/gen-manifests.py``);
tests/integration/test_chart.py checks that ``helm template`` equals :func:`operator_rbac`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schedlock.operator.crd import GROUP, PLURAL

RBAC_API = "rbac.authorization.k8s.io"


def operator_rules() -> list[dict[str, Any]]:
    """What the operator needs in every namespace it serves (all namespaced resources)."""
    return [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]


def _metadata(name: str, namespace: str | None, labels: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = dict(labels or {})
    return meta


def _role(
    kind: str, name: str, namespace: str | None, labels: dict[str, str] | None
) -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": kind,
        "metadata": _metadata(name, namespace, labels),
        "rules": operator_rules(),
    }


def _binding(
    kind: str,
    name: str,
    namespace: str | None,
    service_account: tuple[str, str],
    labels: dict[str, str] | None,
) -> dict[str, Any]:
    account_namespace, account = service_account
    return {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": f"{kind}Binding",
        "metadata": _metadata(name, namespace, labels),
        "roleRef": {"apiGroup": RBAC_API, "kind": kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_namespace}],
    }


def cluster_role(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return _role("ClusterRole", name, None, labels)


def cluster_role_binding(
    name: str, namespace: str, service_account: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """Binds the ClusterRole NAME to the ServiceAccount NAMESPACE/SERVICE_ACCOUNT."""
    return _binding("ClusterRole", name, None, (namespace, service_account), labels)


def role(name: str, namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return _role("Role", name, namespace, labels)


def role_binding(
    name: str,
    namespace: str,
    service_account: tuple[str, str],
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Binds the Role NAME of NAMESPACE to the ServiceAccount (its namespace, its name)."""
    return _binding("Role", name, namespace, service_account, labels)


def operator_rbac(
    name: str,
    namespace: str,
    service_account: str,
    watch_namespaces: Sequence[str] = (),
    labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The operator's RBAC objects: cluster-wide, or a Role and RoleBinding per namespace.

    NAMESPACE/SERVICE_ACCOUNT is the operator's identity; WATCH_NAMESPACES what it serves
    (empty: the whole cluster).  The objects are named NAME (the chart's operator name).
    """
    if not watch_namespaces:
        return [
            cluster_role(name, labels),
            cluster_role_binding(name, namespace, service_account, labels),
        ]
    account = (namespace, service_account)
    objects: list[dict[str, Any]] = []
    for watched in watch_namespaces:
        objects += [role(name, watched, labels), role_binding(name, watched, account, labels)]
    return objects
