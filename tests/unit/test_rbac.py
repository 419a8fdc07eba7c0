"""The operator's RBAC objects (pure): cluster-wide, or a Role and RoleBinding per namespace."""

from __future__ import annotations

from typing import Any

from schedlock.operator.rbac import operator_rules
from testbed.rbac import operator_rbac


def assert_binds_the_operator(binding: dict[str, Any], role_kind: str) -> None:
    """The binding grants role ``op`` of ``role_kind`` to the operator's ServiceAccount, which
    stays in the operator's namespace."""
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": role_kind,
        "name": "op",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "op-sa", "namespace": "schedlock-system"}
    ]


def test_cluster_wide_without_watched_namespaces() -> None:
    role, binding = operator_rbac("op", "schedlock-system", "op-sa")
    assert role["kind"] == "ClusterRole" and "namespace" not in role["metadata"]
    assert role["rules"] == operator_rules()
    assert binding["kind"] == "ClusterRoleBinding"
    assert_binds_the_operator(binding, "ClusterRole")


def test_a_role_and_binding_in_each_watched_namespace_and_nothing_cluster_wide() -> None:
    objects = operator_rbac("op", "schedlock-system", "op-sa", ["apps", "billing"], {"a": "b"})
    assert [(o["kind"], o["metadata"]["namespace"]) for o in objects] == [
        ("Role", "apps"),
        ("RoleBinding", "apps"),
        ("Role", "billing"),
        ("RoleBinding", "billing"),
    ]
    for obj in objects:
        assert obj["metadata"]["name"] == "op" and obj["metadata"]["labels"] == {"a": "b"}
    for role in objects[::2]:
        assert role["rules"] == operator_rules()
    for binding in objects[1::2]:
        assert_binds_the_operator(binding, "Role")


def test_every_rule_is_on_a_namespaced_resource() -> None:
    """What makes a Role enough: nothing in the rules needs a cluster-scoped grant."""
    resources = {r for rule in operator_rules() for r in rule["resources"]}
    assert resources == {"scheduledpublishes", "scheduledpublishes/status", "events"}
    verbs = {v for rule in operator_rules() for v in rule["verbs"]}
    assert "delete" not in verbs  # create is on events only
    assert all("create" not in r["verbs"] for r in operator_rules() if r["resources"] != ["events"])
