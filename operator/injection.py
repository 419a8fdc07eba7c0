"""Sidecar injection, pure: a pod (or pod template) in, the same with the schedlock sidecar out.

Used by the operator's mutating webhook (``/inject``) and by ``schedlock inject`` for people
who do not want a webhook — one code path, so both add exactly the same container.

A pod opts in with the annotation ``schedlock.dev/inject: "true"``. The target is the
annotation ``schedlock.dev/target``, else the label ``app.kubernetes.io/name``. The sidecar is
a Kubernetes native sidecar (an init container with ``restartPolicy: Always``): it starts
before the app, keeps running beside it, and stops after it. Its settings come from the pod's
own namespace: the database URL from a Secret there (``schedlock-database``/``url`` unless the
operator is told otherwise, or the annotation ``schedlock.dev/database-secret``), the namespace
and holder from the downward API.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schedlock import __version__

ANNOTATION_INJECT = "schedlock.dev/inject"
ANNOTATION_TARGET = "schedlock.dev/target"
ANNOTATION_TARGET_URL = "schedlock.dev/target-url"
ANNOTATION_DATABASE_SECRET = "schedlock.dev/database-secret"
LABEL_INJECTED = "schedlock.dev/injected"
CONTAINER_NAME = "schedlock"
METRICS_PORT = 9090
METRICS_PORT_NAME = "schedlock-http"  # port names are at most 15 characters
DEFAULT_TARGET_URL = "http://127.0.0.1:8080/schedlock"
DEFAULT_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "10m", "memory": "48Mi"},
    "limits": {"memory": "128Mi"},
}
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")


@dataclass(frozen=True)
class InjectionConfig:
    image: str = f"ghcr.io/schedlock/schedlock:{__version__}"
    database_secret: str = "schedlock-database"
    database_secret_key: str = "url"
    lease_seconds: float = 10.0
    resources: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_RESOURCES))


@dataclass(frozen=True)
class Decision:
    inject: bool
    reason: str
    target: str | None = None


def wants_sidecar(metadata: Mapping[str, Any]) -> Decision:
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    if str(annotations.get(ANNOTATION_INJECT, "")).lower() != "true":
        return Decision(False, f'no {ANNOTATION_INJECT}: "true" annotation')
    target = annotations.get(ANNOTATION_TARGET) or labels.get("app.kubernetes.io/name")
    if not target:
        return Decision(
            False,
            f"{ANNOTATION_INJECT} is set but the pod has neither a {ANNOTATION_TARGET} "
            "annotation nor an app.kubernetes.io/name label to name its target: not injected",
        )
    return Decision(True, "opted in", str(target))


def restricted_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def sidecar_container(
    config: InjectionConfig, target: str, annotations: Mapping[str, Any]
) -> dict[str, Any]:
    secret = annotations.get(ANNOTATION_DATABASE_SECRET) or config.database_secret

    def probe(path: str, **timing: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": METRICS_PORT_NAME}, **timing}

    return {
        "name": CONTAINER_NAME,
        "image": config.image,
        "args": ["sidecar"],
        "restartPolicy": "Always",
        "env": [
            {
                "name": "SCHEDLOCK_DATABASE_URL",
                "valueFrom": {"secretKeyRef": {"name": secret, "key": config.database_secret_key}},
            },
            {
                "name": "SCHEDLOCK_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": "SCHEDLOCK_HOLDER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "SCHEDLOCK_TARGET", "value": target},
            {
                "name": "SCHEDLOCK_TARGET_URL",
                "value": str(annotations.get(ANNOTATION_TARGET_URL) or DEFAULT_TARGET_URL),
            },
            {"name": "SCHEDLOCK_HTTP_PORT", "value": str(METRICS_PORT)},
            {"name": "SCHEDLOCK_LEASE_SECONDS", "value": f"{config.lease_seconds:g}"},
            {"name": "SCHEDLOCK_HEARTBEAT_SECONDS", "value": f"{config.lease_seconds / 3.5:.2g}"},
            {"name": "SCHEDLOCK_MIGRATE", "value": "off"},
            {"name": "SCHEDLOCK_LOG_FORMAT", "value": "json"},
        ],
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "startupProbe": probe("/healthz", periodSeconds=1, failureThreshold=60),
        "livenessProbe": probe("/healthz", periodSeconds=10, failureThreshold=3),
        "readinessProbe": probe("/readyz", periodSeconds=5, failureThreshold=2),
        "resources": copy.deepcopy(config.resources),
        "securityContext": restricted_security_context(),
    }


def inject_pod(
    metadata: Mapping[str, Any], spec: Mapping[str, Any], config: InjectionConfig
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """New (metadata, spec) with the sidecar, or None when nothing is to change."""
    decision = wants_sidecar(metadata)
    if not decision.inject or decision.target is None:
        return None
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    if any(c.get("name") == CONTAINER_NAME for c in containers):
        return None  # already injected (idempotent)
    new_spec = copy.deepcopy(dict(spec))
    sidecar = sidecar_container(config, decision.target, metadata.get("annotations") or {})
    new_spec["initContainers"] = [*(new_spec.get("initContainers") or []), sidecar]
    new_meta = copy.deepcopy(dict(metadata))
    new_meta["labels"] = {**(new_meta.get("labels") or {}), LABEL_INJECTED: "true"}
    return new_meta, new_spec


def inject_manifest(obj: dict[str, Any], config: InjectionConfig) -> dict[str, Any]:
    """A Pod or a workload (its pod template) with the sidecar added where it opts in."""
    kind = obj.get("kind")
    if kind == "Pod":
        changed = inject_pod(obj.get("metadata") or {}, obj.get("spec") or {}, config)
        if changed:
            obj = {**obj, "metadata": changed[0], "spec": changed[1]}
        return obj
    template_path: tuple[str, ...] | None = None
    if kind in WORKLOAD_KINDS:
        template_path = ("spec", "template")
    elif kind == "CronJob":
        template_path = ("spec", "jobTemplate", "spec", "template")
    if template_path is None:
        return obj
    result = copy.deepcopy(obj)
    holder: dict[str, Any] = result
    for key in template_path:
        holder = holder.setdefault(key, {})
    changed = inject_pod(holder.get("metadata") or {}, holder.get("spec") or {}, config)
    if changed:
        holder["metadata"], holder["spec"] = changed
    return result


def parse_resources(raw: str) -> dict[str, Any]:
    """``SCHEDLOCK_SIDECAR_RESOURCES``: a JSON object like the container ``resources`` field."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"must be a JSON object of requests/limits: {exc.msg}") from None
    if not isinstance(value, dict) or not set(value) <= {"requests", "limits"}:
        raise ValueError('must be a JSON object like {"requests": {"cpu": "10m"}, "limits": {...}}')
    return value
