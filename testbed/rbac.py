"""The operator's RBAC objects as the chart renders them, built from the product's rules
(:func:`schedlock.operator.rbac.operator_rules`): the test bed applies them to its API server,
and tests/integration/test_chart.py checks that ``helm template`` equals them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schedlock.operator.rbac import operator_rules

RBAC_API = "rbac.authorization.k8s.io"


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
