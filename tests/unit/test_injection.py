"""Sidecar injection (pure): who opts in, what is added, idempotence, workloads."""

from __future__ import annotations

from typing import Any

import pytest
from schedlock.operator.injection import (
    CONTAINER_NAME,
    LABEL_INJECTED,
    InjectionConfig,
    inject_manifest,
    inject_pod,
    wants_sidecar,
)

CONFIG = InjectionConfig(image="example/schedlock:1.2.3")


def pod(
    annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app-1", "annotations": annotations or {}, "labels": labels or {}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }


def test_opt_in_by_annotation_with_target_from_annotation_or_label() -> None:
    assert not wants_sidecar(pod()["metadata"]).inject
    assert not wants_sidecar(pod({"schedlock.dev/inject": "false"})["metadata"]).inject
    by_label = wants_sidecar(
        pod({"schedlock.dev/inject": "true"}, {"app.kubernetes.io/name": "billing"})["metadata"]
    )
    assert by_label.inject and by_label.target == "billing"
    by_annotation = wants_sidecar(
        pod(
            {"schedlock.dev/inject": "true", "schedlock.dev/target": "mail"},
            {"app.kubernetes.io/name": "billing"},
        )["metadata"]
    )
    assert by_annotation.target == "mail"
    nameless = wants_sidecar(pod({"schedlock.dev/inject": "true"})["metadata"])
    assert not nameless.inject and "app.kubernetes.io/name" in nameless.reason


def test_native_sidecar_with_restricted_security() -> None:
    p = pod(
        {"schedlock.dev/inject": "true", "schedlock.dev/target-url": "http://127.0.0.1:3000/hook"},
        {"app.kubernetes.io/name": "billing"},
    )
    changed = inject_pod(p["metadata"], p["spec"], CONFIG)
    assert changed is not None
    meta, spec = changed
    assert meta["labels"][LABEL_INJECTED] == "true"
    [sidecar] = spec["initContainers"]
    assert sidecar["name"] == CONTAINER_NAME and sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == "example/schedlock:1.2.3" and sidecar["args"] == ["sidecar"]
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["SCHEDLOCK_TARGET"]["value"] == "billing"
    assert env["SCHEDLOCK_TARGET_URL"]["value"] == "http://127.0.0.1:3000/hook"
    assert env["SCHEDLOCK_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "schedlock-database",
        "key": "url",
    }
    assert env["SCHEDLOCK_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    security = sidecar["securityContext"]
    assert security["runAsNonRoot"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert (
        security["seccompProfile"] == {"type": "RuntimeDefault"}
        and security["readOnlyRootFilesystem"]
    )
    assert spec["containers"] == p["spec"]["containers"]  # the app is untouched


def test_injection_is_idempotent_and_leaves_others_alone() -> None:
    p = pod({"schedlock.dev/inject": "true"}, {"app.kubernetes.io/name": "billing"})
    meta, spec = inject_pod(p["metadata"], p["spec"], CONFIG) or ({}, {})
    assert inject_pod(meta, spec, CONFIG) is None
    plain = pod()
    assert inject_pod(plain["metadata"], plain["spec"], CONFIG) is None


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"])
def test_workload_templates_are_injected(kind: str) -> None:
    template = {
        "metadata": {
            "annotations": {"schedlock.dev/inject": "true"},
            "labels": {"app.kubernetes.io/name": "billing"},
        },
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }
    spec: dict[str, Any] = {"template": template}
    if kind == "CronJob":
        spec = {"jobTemplate": {"spec": {"template": template}}}
    out = inject_manifest({"kind": kind, "metadata": {"name": "x"}, "spec": spec}, CONFIG)
    holder = (
        out["spec"]["jobTemplate"]["spec"]["template"]
        if kind == "CronJob"
        else out["spec"]["template"]
    )
    assert holder["spec"]["initContainers"][0]["name"] == CONTAINER_NAME
    assert "initContainers" not in template["spec"]  # the input is not mutated
