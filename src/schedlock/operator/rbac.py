"""The operator's least-privilege RBAC rules — the one place the chart and the tests use.

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

The chart renders its Roles and bindings from the generated rules file
(``charts/schedlock/files/operator-rbac-rules.yaml``, ``hack/gen-manifests.py``); the test bed
builds the same objects from :func:`operator_rules` (``testbed/rbac.py``), and
tests/integration/test_chart.py checks that ``helm template`` equals them.
"""

from __future__ import annotations

from typing import Any

from schedlock.operator.crd import GROUP, PLURAL


def operator_rules() -> list[dict[str, Any]]:
    """What the operator needs in every namespace it serves (all namespaced resources)."""
    return [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
