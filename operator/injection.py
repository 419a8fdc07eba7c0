"""Sidecar injection, pure: a pod (or pod template) in, the same with the schedlock sidecar out.

Used by the operator's mutating webhook (``/inject``) and by ``schedlock inject`` — one code
path, so both add exactly the same container.  docs/install.md has the opt-in label, the
annotations and their defaults.

Invariants:

* Only the label ``schedlock.dev/inject: "true"`` opts in (:func:`wants_sidecar` asks for what
  the webhook's objectSelector selects); an annotation of that name alone, the opt-in until
  0.1, does not (``schedlock inject`` reports it with the upgrade step).
* The sidecar is a Kubernetes native sidecar (an init container with ``restartPolicy:
  Always``): it starts before the app, runs beside it, stops after it.  Its settings come from
  the pod's own namespace; a signing key is mounted from a Secret by name, its value never
  appears in a manifest or an annotation.
* Nothing is half-applied: every ``schedlock.dev/`` annotation is checked by one table
  (:data:`ANNOTATION_CHECKS`, the sidecar's own parsers), and a malformed or unknown one (a typo
  such as ``schedlock.dev/target-ulr``) means no sidecar and a warning, logged
  (``pod_not_injected``): a sidecar that would refuse to start, or a pod the API server would
  refuse, is never made.
* A manifest whose shape no Kubernetes object has is a :class:`ManifestError` naming the field.
* The input is never mutated; a pod that already has the ``schedlock`` container is returned
  unchanged (re-injection is a no-op); names the injector adds never collide with the pod's own.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from schedlock import __version__
from schedlock.core.settings import DEFAULT_SCHEMA, check_url, dns_label, http_url, quoted
from schedlock.core.timings import DEFAULT_LEASE_SECONDS, LeaseTimings

LABEL_INJECT = "schedlock.dev/inject"
"""The opt-in label; its only value that opts in is ``"true"`` (what the webhook selects on)."""
LABEL_INJECT_VALUE = "true"
ANNOTATION_INJECT = LABEL_INJECT  # the opt-in of 0.1: no longer enough, reported when alone
ANNOTATION_TARGET = "schedlock.dev/target"
ANNOTATION_TARGET_URL = "schedlock.dev/target-url"
ANNOTATION_TARGET_READY_URL = "schedlock.dev/target-ready-url"
ANNOTATION_DATABASE_SECRET = "schedlock.dev/database-secret"
ANNOTATION_SIGNING_SECRET = "schedlock.dev/signing-secret"
LABEL_INJECTED = "schedlock.dev/injected"
LABEL_NAME = "app.kubernetes.io/name"  # the target when the pod has no target annotation
ANNOTATION_PREFIX = "schedlock.dev/"
CONTAINER_NAME = "schedlock"
METRICS_PORT = 9090
METRICS_PORT_NAME = "schedlock-http"  # port names are at most 15 characters
DEFAULT_TARGET_URL = "http://127.0.0.1:8080/schedlock"
# The Dockerfile's schedlock-sidecar target (only what the sidecar imports).
DEFAULT_IMAGE = f"ghcr.io/schedlock/schedlock-sidecar:{__version__}"
DEFAULT_DATABASE_SECRET = "schedlock-database"
DEFAULT_DATABASE_SECRET_KEY = "url"
DEFAULT_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "10m", "memory": "48Mi"},
    "limits": {"memory": "128Mi"},
}
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")
DEFAULT_SIGNING_SECRET_KEY = "signing-secret"
SIGNING_VOLUME = "schedlock-signing-secret"
SIGNING_SECRET_DIR = "/var/run/secrets/schedlock.dev/signing"
# The file has this name whatever the Secret's key, so the sidecar's path never changes.
SIGNING_SECRET_FILE_NAME = "signing-secret"
SIGNING_SECRET_FILE = f"{SIGNING_SECRET_DIR}/{SIGNING_SECRET_FILE_NAME}"
# A secret volume's files belong to root, and to the pod's fsGroup when it has one (the kubelet
# then adds group read). The sidecar runs as 65532:65532, so without an fsGroup only "other"
# read lets it open the file. Only the sidecar mounts the volume, so no other container sees it.
SIGNING_FILE_MODE = 0o444
SIGNING_FILE_MODE_WITH_FS_GROUP = 0o440

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# Used with fullmatch. A Secret key may not be "." nor start with "..", as the API server says.
DNS_SUBDOMAIN = re.compile(rf"(?=.{{1,253}}\Z){_DNS_LABEL}(\.{_DNS_LABEL})*")
SECRET_KEY = re.compile(r"(?=.{1,253}\Z)(?!\.\Z)(?!\.\.)[-._a-zA-Z0-9]+")


class ManifestError(ValueError):
    """A manifest field the injector reads has a shape no Kubernetes object has."""


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` as a mapping (absent: empty); ManifestError when it is anything else."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ManifestError(f"{where} is {json_type(value)}, not an object")
    return value


def _mappings(value: Any, where: str) -> list[Mapping[str, Any]]:
    """``value`` as a list of mappings (absent: empty); ManifestError otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ManifestError(f"{where} is {json_type(value)}, not an array")
    return [_mapping(item, f"{where}[{n}]") for n, item in enumerate(value)]


def json_type(value: Any) -> str:
    """What a decoded manifest value is, as an error names it ("an array", "a string"…)."""
    for cls, name in ((bool, "a boolean"), (dict, "an object"), (list, "an array")):
        if isinstance(value, cls):
            return name
    if isinstance(value, int | float):
        return "a number"
    return "a string" if isinstance(value, str) else "null" if value is None else "a value"


def check_pod_shape(metadata: Any, spec: Any, prefix: str = "") -> None:
    """Every field of a pod (template) that injection reads has its Kubernetes shape; the
    error names the field from the manifest's top (``prefix``: ``spec.template.`` …)."""
    meta = _mapping(metadata, f"{prefix}metadata")
    _mapping(meta.get("annotations"), f"{prefix}metadata.annotations")
    _mapping(meta.get("labels"), f"{prefix}metadata.labels")
    pod_spec = _mapping(spec, f"{prefix}spec")
    for field_name in ("containers", "initContainers", "volumes"):
        _mappings(pod_spec.get(field_name), f"{prefix}spec.{field_name}")
    _mapping(pod_spec.get("securityContext"), f"{prefix}spec.securityContext")


@dataclass(frozen=True)
class SecretRef:
    """One key of a Secret in the pod's own namespace."""

    name: str
    key: str = DEFAULT_SIGNING_SECRET_KEY

    def __str__(self) -> str:
        return f"{self.name}/{self.key}"


def parse_signing_secret(raw: str) -> SecretRef | None:
    """``NAME`` or ``NAME/KEY`` (KEY defaults to ``signing-secret``); blank means no signing."""
    value = raw.strip()
    if not value:
        return None
    name, slash, key = value.partition("/")
    if not slash:
        key = DEFAULT_SIGNING_SECRET_KEY
    if not DNS_SUBDOMAIN.fullmatch(name):
        raise ValueError(
            f"must be NAME or NAME/KEY of a Secret; {quoted(name)} is not a Secret name "
            "(a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253)"
        )
    if not SECRET_KEY.fullmatch(key):
        raise ValueError(
            f"must be NAME or NAME/KEY of a Secret; {quoted(key)} is not a Secret key "
            "(letters, digits, '-', '_' and '.', at most 253)"
        )
    return SecretRef(name, key)


@dataclass(frozen=True)
class InjectionConfig:
    """What every injected sidecar gets (the operator's ``InjectionSettings``, parsed)."""

    image: str = DEFAULT_IMAGE
    database_secret: str = DEFAULT_DATABASE_SECRET
    database_secret_key: str = DEFAULT_DATABASE_SECRET_KEY
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    """Only the lease goes into the sidecar's environment: it derives the rest (core/timings)."""
    resources: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_RESOURCES))
    signing_secret: SecretRef | None = None
    """Signs the deliveries of every injected pod unless the pod's annotation says otherwise."""
    database_schema: str = DEFAULT_SCHEMA
    """The operator's schema: its sidecars find the tables where it writes the rows."""
    retention: tuple[tuple[str, str], ...] = ()
    """The retention settings (variable, value) the operator prunes by, for the sidecars too:
    whichever process holds the pruning lease prunes by its own (schedlock.store.retention)."""

    def __post_init__(self) -> None:
        LeaseTimings(self.lease_seconds)  # a lease the sidecar would refuse is refused here


@dataclass(frozen=True)
class Decision:
    """Why a pod gets the sidecar or not; the target (and signing key) when it does."""

    reason: str
    target: str | None = None
    signing_secret: SecretRef | None = None

    @property
    def inject(self) -> bool:
        return self.target is not None


def opt_in_problem(metadata: Mapping[str, Any]) -> str | None:
    """Why the pod is not opted in (None: it carries the label ``schedlock.dev/inject: "true"``)."""
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    label = labels.get(LABEL_INJECT)
    if label == LABEL_INJECT_VALUE:
        return None
    if label is not None:
        return (
            f'the label {LABEL_INJECT} must be "{LABEL_INJECT_VALUE}" exactly (the webhook '
            f"selects on it), got {quoted(str(label))}: not injected"
        )
    if ANNOTATION_INJECT in annotations:
        return (
            f"{ANNOTATION_INJECT} is a label now: the annotation alone no longer opts in; "
            f'add the label {LABEL_INJECT}: "{LABEL_INJECT_VALUE}" to the pod (template)'
        )
    return f'no {LABEL_INJECT}: "{LABEL_INJECT_VALUE}" label'


def secret_name(raw: str) -> str:
    """The name of a Secret (a DNS subdomain), as the pod's ``secretKeyRef`` will carry it."""
    if not DNS_SUBDOMAIN.fullmatch(raw):
        raise ValueError(f"must name a Secret (a DNS subdomain), got {quoted(raw)}")
    return raw


# Every pod annotation the injector reads, and the check its value must pass: the parser the
# sidecar itself runs on the variable it becomes (schedlock.sidecar.settings), or what the API
# server demands of the field, so a value that passes never makes a sidecar that refuses to
# start, nor a pod the API server refuses.  A blank value means the default (for the signing
# secret: no signing).  One path for all of them: a value that fails is not half-applied, the
# pod is admitted without the sidecar and the reason is the webhook's warning.
ANNOTATION_CHECKS: Mapping[str, Callable[[str], object]] = {
    ANNOTATION_TARGET: dns_label,
    ANNOTATION_TARGET_URL: http_url,
    ANNOTATION_TARGET_READY_URL: check_url,
    ANNOTATION_DATABASE_SECRET: secret_name,
    ANNOTATION_SIGNING_SECRET: parse_signing_secret,
}
# ANNOTATION_INJECT too: left on a pod beside the label, it is ignored, not a typo.
KNOWN_ANNOTATIONS = frozenset({ANNOTATION_INJECT, *ANNOTATION_CHECKS})


def annotation_problem(annotations: Mapping[str, Any]) -> str | None:
    """What is wrong with the pod's ``schedlock.dev/`` annotations (None: nothing).

    A ``schedlock.dev/`` annotation the injector does not read is a typo until shown otherwise
    (``schedlock.dev/target-ulr`` would silently deliver to the default URL), so it is refused
    like a bad value."""
    for key in sorted(str(k) for k in annotations):
        if key.startswith(ANNOTATION_PREFIX) and key not in KNOWN_ANNOTATIONS:
            return (
                f"{quoted(key)} is not an annotation schedlock reads (it reads "
                f"{', '.join(sorted(ANNOTATION_CHECKS))}): not injected"
            )
    for key, check in ANNOTATION_CHECKS.items():
        if not annotation(annotations, key):
            continue  # the default (a blank signing secret: no signing)
        try:
            check(str(annotations[key]))  # as given: a Secret's name is not stripped by the API
        except ValueError as exc:
            return f"{key} {exc}: not injected"
    return None


def wants_sidecar(metadata: Mapping[str, Any], config: InjectionConfig | None = None) -> Decision:
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    not_opted_in = opt_in_problem(metadata)
    if not_opted_in is not None:
        return Decision(not_opted_in)
    problem = annotation_problem(annotations)
    if problem is not None:
        return Decision(problem)
    target = annotations.get(ANNOTATION_TARGET) or labels.get(LABEL_NAME)
    if not target:
        return Decision(
            f"{LABEL_INJECT} is set but the pod has neither a {ANNOTATION_TARGET} "
            f"annotation nor an {LABEL_NAME} label to name its target: not injected",
        )
    try:
        target = dns_label(str(target))
    except ValueError as exc:  # the label's (the annotation passed its check above)
        return Decision(f"{LABEL_NAME} {exc}: not injected")
    signing = config.signing_secret if config is not None else None
    if ANNOTATION_SIGNING_SECRET in annotations:
        signing = parse_signing_secret(annotation(annotations, ANNOTATION_SIGNING_SECRET))
    return Decision("opted in", target, signing)


def annotation(annotations: Mapping[str, Any], key: str) -> str:
    """The value the pod gives KEY, stripped; blank (or absent) means the default."""
    return str(annotations.get(key) or "").strip()


def refusal(metadata: Mapping[str, Any], config: InjectionConfig) -> str | None:
    """Why a pod that asks for the sidecar gets none (None: it gets one, or it did not ask).

    The webhook returns it as an admission warning and ``schedlock inject`` prints it. Any value
    of the inject label but "false" counts as asking, so a typo ("yes", "True") is reported;
    so does the annotation of 0.1 on a pod without the label (the webhook never sees such a
    pod, ``schedlock inject`` says what to change).
    """
    labels = metadata.get("labels") or {}
    # The label decides when there is one; without it, the annotation of 0.1 is still heard.
    said = labels.get(LABEL_INJECT, (metadata.get("annotations") or {}).get(ANNOTATION_INJECT))
    if str(said or "false").lower() == "false":
        return None
    decision = wants_sidecar(metadata, config)
    return None if decision.inject else decision.reason


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
    secret = annotation(annotations, ANNOTATION_DATABASE_SECRET) or config.database_secret
    ready_url = annotation(annotations, ANNOTATION_TARGET_READY_URL)

    def probe(path: str, **timing: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": METRICS_PORT_NAME}, **timing}

    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": config.image,
        "args": ["sidecar"],
        "restartPolicy": "Always",
        "env": [
            {
                "name": "SCHEDLOCK_DATABASE_URL",
                "valueFrom": {"secretKeyRef": {"name": secret, "key": config.database_secret_key}},
            },
            {"name": "SCHEDLOCK_DATABASE_SCHEMA", "value": config.database_schema},
            {
                "name": "SCHEDLOCK_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": "SCHEDLOCK_HOLDER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "SCHEDLOCK_TARGET", "value": target},
            {
                "name": "SCHEDLOCK_TARGET_URL",
                "value": annotation(annotations, ANNOTATION_TARGET_URL) or DEFAULT_TARGET_URL,
            },
            {"name": "SCHEDLOCK_HTTP_PORT", "value": str(METRICS_PORT)},
            {"name": "SCHEDLOCK_LEASE_SECONDS", "value": f"{config.lease_seconds:g}"},
            {"name": "SCHEDLOCK_MIGRATE", "value": "off"},
            {"name": "SCHEDLOCK_LOG_FORMAT", "value": "json"},
            *({"name": name, "value": value} for name, value in config.retention),
        ],
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "startupProbe": probe("/healthz", periodSeconds=1, failureThreshold=60),
        "livenessProbe": probe("/healthz", periodSeconds=10, failureThreshold=3),
        "readinessProbe": probe("/readyz", periodSeconds=5, failureThreshold=2),
        "resources": copy.deepcopy(config.resources),
        "securityContext": restricted_security_context(),
    }
    if ready_url:
        container["env"].append({"name": "SCHEDLOCK_TARGET_READY_URL", "value": ready_url})
    return container


def signing_volume(secret: SecretRef, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A secret volume with only the signing key, named apart from the pod's own volumes."""
    taken = {v.get("name") for v in spec.get("volumes") or []}
    candidates = itertools.chain(
        [SIGNING_VOLUME], (f"{SIGNING_VOLUME}-{n}" for n in itertools.count(2))
    )
    name = next(c for c in candidates if c not in taken)
    has_fs_group = (spec.get("securityContext") or {}).get("fsGroup") is not None
    return {
        "name": name,
        "secret": {
            "secretName": secret.name,
            "items": [{"key": secret.key, "path": SIGNING_SECRET_FILE_NAME}],
            "defaultMode": SIGNING_FILE_MODE_WITH_FS_GROUP if has_fs_group else SIGNING_FILE_MODE,
        },
    }


def inject_pod(
    metadata: Mapping[str, Any], spec: Mapping[str, Any], config: InjectionConfig
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """New (metadata, spec) with the sidecar, or None when nothing is to change."""
    decision = wants_sidecar(metadata, config)
    if decision.target is None:
        return None
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    if any(c.get("name") == CONTAINER_NAME for c in containers):
        return None  # already injected (idempotent)
    new_spec = copy.deepcopy(dict(spec))
    sidecar = sidecar_container(config, decision.target, metadata.get("annotations") or {})
    if decision.signing_secret is not None:
        volume = signing_volume(decision.signing_secret, new_spec)
        new_spec["volumes"] = [*(new_spec.get("volumes") or []), volume]
        sidecar["volumeMounts"] = [
            {"name": volume["name"], "mountPath": SIGNING_SECRET_DIR, "readOnly": True}
        ]
        sidecar["env"].append(
            {"name": "SCHEDLOCK_SIGNING_SECRET_FILE", "value": SIGNING_SECRET_FILE}
        )
    new_spec["initContainers"] = [*(new_spec.get("initContainers") or []), sidecar]
    new_meta = copy.deepcopy(dict(metadata))
    new_meta["labels"] = {**(new_meta.get("labels") or {}), LABEL_INJECTED: "true"}
    return new_meta, new_spec


def inject_manifest(
    obj: dict[str, Any], config: InjectionConfig, warnings: list[str] | None = None
) -> dict[str, Any]:
    """A Pod or a workload (its pod template) with the sidecar added where it opts in.

    A pod template that asks for the sidecar but cannot have it adds ``Kind/name: reason`` to
    ``warnings``. A field on the way to the pod template, or of it, that has no Kubernetes shape
    is a :class:`ManifestError`.
    """
    kind = obj.get("kind")
    name = _mapping(obj.get("metadata"), "metadata").get("name")

    def inject(
        metadata: Mapping[str, Any], spec: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        problem = refusal(metadata, config)
        if problem is not None and warnings is not None:
            warnings.append(f"{kind}/{name}: {problem}")
        return inject_pod(metadata, spec, config)

    if kind == "Pod":
        check_pod_shape(obj.get("metadata"), obj.get("spec"))
        changed = inject(obj.get("metadata") or {}, obj.get("spec") or {})
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
    template: Mapping[str, Any] = obj
    for depth, key in enumerate(template_path, 1):
        template = _mapping(template.get(key), ".".join(template_path[:depth]))
    check_pod_shape(template.get("metadata"), template.get("spec"), ".".join(template_path) + ".")
    result = copy.deepcopy(obj)
    holder: dict[str, Any] = result
    for key in template_path:
        if holder.get(key) is None:  # absent or null: the sidecar's template starts empty
            holder[key] = {}
        holder = holder[key]
    changed = inject(holder.get("metadata") or {}, holder.get("spec") or {})
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
