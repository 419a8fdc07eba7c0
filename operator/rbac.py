"""The operator's least-privilege RBAC rules — the one place the chart and the tests use.

Every rule is here because a code path needs it:

* ``scheduledpublishes``: get/list/watch (kopf watches them), patch (kopf's finalizer and
  progress annotations under ``schedlock.dev/``).
* ``scheduledpublishes/status``: get/patch (handlers and the status sync write ``.status``).
* ``events`` (core): create/patch (kopf's and the sync's Events).

Every one is on a namespaced resource, so with a list of watched namespaces they are granted
by a Role in each and nothing is needed cluster-wide (kopf's scanning is off and standalone
mode has no peering objects: docs/architecture.md, "Least privilege").  The chart renders them
from the generated ``charts/schedlock/files/operator-rbac-rules.yaml`` (``hack/gen-manifests.py``).
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
