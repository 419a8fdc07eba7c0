"""The Helm chart and the image recipe, checked without a cluster.

`helm lint --strict` and `helm template` of the defaults and every `ci/` values file, the values
schema refusing bad values with a readable message, Pod Security "restricted" on every pod
template, RBAC exactly `operator_rbac()` (cluster-wide or per watched namespace), the CRD
exactly `crd_manifest()`, the operator's environment 1:1 on its settings, the webhooks and their certificates, monitoring gated on its
API, checkov on the rendered manifests, and the Dockerfile's build commands run outside a
container.  Installing into a real API server is tests/e2e/test_helm_install.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from schedlock import __version__
from schedlock.core.settings import specs
from schedlock.operator.crd import crd_manifest
from schedlock.operator.injection import LABEL_INJECT, LABEL_INJECT_VALUE
from schedlock.operator.rbac import operator_rules
from schedlock.operator.settings import OperatorSettings
from testbed.rbac import operator_rbac
from testbed.tools import ToolMissing, tool

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "schedlock"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
NAMESPACE = "schedlock-system"
RELEASE = "schedlock"
CHECKOV_CONFIG = CHART / ".checkov.yaml"

RECOMMENDED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
)
MONITORING_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}

Manifest = dict[str, Any]


# --------------------------------------------------------------------------- helpers


def helm(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tool("helm")), *(str(a) for a in args)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@cache
def _render(args: tuple[str, ...]) -> tuple[Manifest, ...]:
    result = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def render(*args: str | Path) -> list[Manifest]:
    """`helm template` with extra arguments (values files, --set, --api-versions)."""
    return [json.loads(json.dumps(d)) for d in _render(tuple(str(a) for a in args))]


def values_args(values: Path | None) -> list[str]:
    return [] if values is None else ["-f", str(values)]


def one(docs: Iterable[Manifest], kind: str) -> Manifest:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def kinds(docs: Iterable[Manifest]) -> set[str]:
    return {d["kind"] for d in docs}


def operator_container(docs: Iterable[Manifest]) -> Manifest:
    deployment = one(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def env_of(container: Manifest) -> dict[str, Manifest]:
    return {e["name"]: e for e in container.get("env", [])}


VALUES_IDS = ["defaults", *(p.stem for p in CI_VALUES)]
VALUES = [None, *CI_VALUES]


# --------------------------------------------------------------------------- lint and schema


@pytest.mark.parametrize("values", VALUES, ids=VALUES_IDS)
def test_helm_lint_strict(values: Path | None) -> None:
    result = helm("lint", "--strict", CHART, *values_args(values))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_ci_values_cover_the_documented_cases() -> None:
    assert {p.stem for p in CI_VALUES} == {
        "defaults-values",
        "all-features-values",
        "existing-secret-values",
        "no-webhooks-values",
    }


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "injection.failurePolicy=Sometimes",
            "at '/injection/failurePolicy': value must be one of 'Ignore', 'Fail'",
        ),
        ("operator.logLevel=verbose", "at '/operator/logLevel': value must be one of"),
        ("operator.replicas=2", "at '/operator': additional properties 'replicas' not allowed"),
        ("injection.sidecar.leaseSeconds=1", "at '/injection/sidecar/leaseSeconds': minimum"),
        ("injection.sidecar.signingSecret=App_Hmac", "at '/injection/sidecar/signingSecret'"),
        ("operator.syncSweepSeconds=7200", "at '/operator/syncSweepSeconds': maximum"),
        ("database.url=sqlite:///tmp/x.db", "at '/database/url'"),
        ("monitoring.podMonitor.portName=schedlock-metrics", "maxLength"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        ("webhook.certManager.issuerRef.kind=Vault", "at '/webhook/certManager/issuerRef/kind'"),
        ("networkPolicy.database.port=70000", "at '/networkPolicy/database/port': maximum"),
        (
            "monitoring.grafana.alerts.datasourceUid=${x}",
            "at '/monitoring/grafana/alerts/datasourceUid'",
        ),
        (
            "monitoring.grafana.dashboard.datasourceUid=prom",
            "additional properties 'datasourceUid' not allowed",
        ),
    ],
)
def test_schema_refuses_bad_values_with_a_clear_message(setting: str, message: str) -> None:
    result = helm("template", RELEASE, CHART, "--set", setting)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


def test_unknown_top_level_key_is_refused() -> None:
    result = helm("template", RELEASE, CHART, "--set", "replicaCount=3")
    assert result.returncode != 0
    assert "additional properties 'replicaCount' not allowed" in result.stderr


def _schema_objects(node: Any, path: str = "$") -> Iterable[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if node.get("type") == "object" or "properties" in node:
            yield path, node
        for key, child in node.items():
            yield from _schema_objects(child, f"{path}.{key}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _schema_objects(child, f"{path}[{index}]")


def _resolve(schema: dict[str, Any], ref: str) -> dict[str, Any]:
    """The node a local ``$ref`` (``#/$defs/kubernetes.json/$defs/labels``) points at."""
    node: Any = schema
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return dict(node)


def _closed(schema: dict[str, Any], node: dict[str, Any]) -> bool:
    """Unknown keys are refused here, or by the closed definition the node refers to."""
    extra = node.get("additionalProperties")
    if extra is False or isinstance(extra, dict):
        return True
    return "$ref" in node and _closed(schema, _resolve(schema, node["$ref"]))


def test_schema_closes_every_object_and_covers_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    for path, node in _schema_objects(schema):
        if path == "$.properties.global" or path.endswith("Affinity"):  # free-form by design
            continue
        assert _closed(schema, node), f"{path} accepts unknown keys"

    def walk(values: Any, node: dict[str, Any], path: str) -> None:
        if "$ref" in node and "properties" not in node:
            node = _resolve(schema, node["$ref"])
        if isinstance(values, dict) and "properties" in node:
            for key, value in values.items():
                assert key in node["properties"], f"{path}.{key} is not in the schema"
                walk(value, node["properties"][key], f"{path}.{key}")

    walk(yaml.safe_load((CHART / "values.yaml").read_text()), schema, "values")


def _gen_chart_docs_check(**env: str) -> subprocess.CompletedProcess[str]:
    """`hack/gen-chart-docs.sh --check`: regenerate both into a temporary directory and diff."""
    return subprocess.run(
        ["bash", str(REPO / "hack" / "gen-chart-docs.sh"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, **env},
    )


def test_schema_and_values_table_are_generated_from_values_yaml() -> None:
    result = _gen_chart_docs_check()
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("old", "new", "stale"),
    [
        (
            "# -- Create the operator's ServiceAccount.",
            "# -- Make one.",
            {"values.schema.json", "install.md"},
        ),
        ("enum: [Ignore, Fail]", "enum: [Ignore, Fail, Maybe]", {"values.schema.json"}),
    ],
    ids=["description", "schema-keyword"],
)
def test_the_check_names_what_is_stale_and_how_to_regenerate(
    tmp_path: Path, old: str, new: str, stale: set[str]
) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    values = chart / "values.yaml"
    assert values.read_text().count(old) == 1
    values.write_text(values.read_text().replace(old, new))
    shutil.copy(REPO / "docs" / "install.md", tmp_path / "install.md")
    result = _gen_chart_docs_check(
        SCHEDLOCK_CHART_DIR=str(chart), SCHEDLOCK_INSTALL_DOC=str(tmp_path / "install.md")
    )
    assert result.returncode == 1
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("stale: ")]
    assert {Path(p).name for p in line.split(" (")[0].removeprefix("stale: ").split()} == stale
    assert "run `bash hack/gen-chart-docs.sh`" in line


def test_values_yaml_documents_the_choices() -> None:
    text = (CHART / "values.yaml").read_text()
    assert "crds:" in text and "helm.sh/resource-policy: keep" in text
    assert "Helm installs `crds/` once and never upgrades it" in text
    assert "failurePolicy is Ignore" in text  # the validating webhook's choice
    assert "pods start WITHOUT a sidecar" in text  # the injector's choice


# --------------------------------------------------------------------------- rendering


def test_defaults_render_the_operator_and_its_webhooks() -> None:
    docs = render()
    assert kinds(docs) == {
        "ServiceAccount",
        "Secret",  # the self-managed webhook certificate
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "Deployment",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    }
    assert not (CHART / "crds").exists(), "the CRD is a template now: crds/ is never upgraded"


@pytest.mark.parametrize("values", VALUES, ids=VALUES_IDS)
def test_every_object_has_the_recommended_labels(values: Path | None) -> None:
    for doc in render(*values_args(values)):
        labels = doc["metadata"].get("labels") or {}
        missing = [key for key in RECOMMENDED_LABELS if key not in labels]
        assert not missing, f"{doc['kind']} {doc['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/version"] == __version__
        assert labels["app.kubernetes.io/part-of"] == "schedlock"
        if doc["kind"] in ("Deployment",):
            template_labels = doc["spec"]["template"]["metadata"]["labels"]
            assert all(key in template_labels for key in RECOMMENDED_LABELS)


def test_image_is_pinned_to_the_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    container = operator_container(render())
    assert container["image"] == f"ghcr.io/schedlock/schedlock:{__version__}"
    digest = "sha256:" + "ab" * 32
    pinned = operator_container(render("--set", f"image.digest={digest}"))
    assert pinned["image"] == f"ghcr.io/schedlock/schedlock@{digest}"


def sidecar_image(*args: str) -> str:
    return str(env_of(operator_container(render(*args)))["SCHEDLOCK_SIDECAR_IMAGE"]["value"])


def test_sidecar_image_is_its_own_derived_from_the_operators() -> None:
    """The injector adds the Dockerfile's schedlock-sidecar image, named after the operator's."""
    assert sidecar_image() == f"ghcr.io/schedlock/schedlock-sidecar:{__version__}"
    # The operator's digest is of the other image: the sidecar's keeps its tag.
    digest = "sha256:" + "ab" * 32
    assert sidecar_image("--set", f"image.digest={digest}") == sidecar_image()
    assert sidecar_image("--set", "image.repository=r.example/s", "--set", "image.tag=t") == (
        "r.example/s-sidecar:t"
    )
    assert sidecar_image(
        "--set", "injection.sidecar.image.repository=mine/car", "--set", "image.tag=t"
    ) == ("mine/car:t")
    assert sidecar_image("--set", "injection.sidecar.image.tag=u", "--set", "image.tag=t") == (
        "ghcr.io/schedlock/schedlock-sidecar:u"
    )
    assert sidecar_image("--set", f"injection.sidecar.image.digest={digest}") == (
        f"ghcr.io/schedlock/schedlock-sidecar@{digest}"
    )


def test_operator_deployment_shape() -> None:
    deployment = one(render(), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == one(render(), "ServiceAccount")["metadata"]["name"]
    container = operator_container(render())
    assert container["args"] == ["operator"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": 8080,
        "webhook": 9443,
    }
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        path = "/readyz" if probe == "readinessProbe" else "/healthz"
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert set(mounts) == {"/tmp", "/tls"}
    assert mounts["/tls"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert volumes[mounts["/tls"]["name"]]["secret"]["secretName"] == "schedlock-webhook-tls"
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    assert one(render(), "Service")["spec"]["selector"] == selector


def _restricted_violations(pod: Manifest, where: str) -> list[str]:
    """Pod Security Standards "restricted" (v1.29+) plus our read-only root filesystem."""
    problems: list[str] = []
    pod_sc = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            problems.append(f"{where}: {field}")
    allowed_volumes = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
    for volume in pod.get("volumes") or []:
        types = set(volume) - {"name"}
        if not types <= allowed_volumes:
            problems.append(f"{where}: volume {volume['name']} of type {types}")
    containers = [*(pod.get("initContainers") or []), *pod["containers"]]
    for container in containers:
        name = f"{where}/{container['name']}"
        sc = container.get("securityContext") or {}
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {caps['add']}")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) in (0, None):
            problems.append(f"{name}: runAsUser must be a non-zero uid")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile {seccomp}")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: readOnlyRootFilesystem")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{name}: hostPort")
    return problems


@pytest.mark.parametrize("values", VALUES, ids=VALUES_IDS)
def test_every_pod_template_passes_pod_security_restricted(values: Path | None) -> None:
    templates = []
    for doc in render(*values_args(values)):
        if doc["kind"] == "Pod":
            templates.append((doc["metadata"]["name"], doc["spec"]))
        elif doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
            templates.append((doc["metadata"]["name"], doc["spec"]["template"]["spec"]))
    assert templates
    for name, pod in templates:
        assert _restricted_violations(pod, name) == []
        pod_sc = pod["securityContext"]
        assert pod_sc["runAsUser"] == 65532 and pod_sc["runAsNonRoot"] is True
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["runAsUser"] == 65532
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_restricted_checker_catches_violations() -> None:
    """The checker above is not vacuous."""
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert _restricted_violations(pod, "ok") == []
    bad = json.loads(json.dumps(pod))
    bad["hostNetwork"] = True
    bad["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    bad["containers"][0]["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}
    bad["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    assert len(_restricted_violations(bad, "bad")) == 5


RBAC_KINDS = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def _rbac(docs: Iterable[Manifest]) -> list[Manifest]:
    return sorted(
        (d for d in docs if d["kind"] in RBAC_KINDS),
        key=lambda d: (d["metadata"].get("namespace", ""), d["kind"]),
    )


@pytest.mark.parametrize("values", VALUES, ids=VALUES_IDS)
def test_rbac_is_exactly_operator_rbac(values: Path | None) -> None:
    """The rendered RBAC equals operator_rbac() (rules, kinds, bindings) for these values."""
    docs = render(*values_args(values))
    deployment = one(docs, "Deployment")
    watched = env_of(operator_container(docs))["SCHEDLOCK_WATCH_NAMESPACES"]["value"]
    rendered = _rbac(docs)
    expected = operator_rbac(
        deployment["metadata"]["name"],
        NAMESPACE,
        one(docs, "ServiceAccount")["metadata"]["name"],
        [n for n in watched.split(",") if n],
        labels=rendered[0]["metadata"]["labels"],
    )
    assert rendered == _rbac(expected)
    assert all(d["rules"] == operator_rules() for d in rendered if "rules" in d)


def test_rbac_is_namespaced_when_the_operator_watches_namespaces() -> None:
    cluster_wide = render()
    assert kinds(_rbac(cluster_wide)) == {"ClusterRole", "ClusterRoleBinding"}
    scoped = _rbac(render("--set", "operator.watchNamespaces={apps,billing}"))
    # Nothing cluster-wide: kopf needs no cluster-scoped rule with scanning off (rbac.py).
    assert kinds(scoped) == {"Role", "RoleBinding"}
    assert [(d["kind"], d["metadata"]["namespace"]) for d in scoped] == [
        ("Role", "apps"),
        ("RoleBinding", "apps"),
        ("Role", "billing"),
        ("RoleBinding", "billing"),
    ]
    for binding in (d for d in scoped if d["kind"] == "RoleBinding"):
        assert binding["roleRef"]["kind"] == "Role"
        # The operator's ServiceAccount lives in the release namespace, not the watched one.
        assert [s["namespace"] for s in binding["subjects"]] == [NAMESPACE]
    off = render("--set", "rbac.create=false", "--set", "operator.watchNamespaces={apps}")
    assert not _rbac(off)
    assert not _rbac(render("--set", "rbac.create=false"))


def test_crd_is_the_generated_manifest_and_kept_on_uninstall() -> None:
    crd = one(render(), "CustomResourceDefinition")
    expected = crd_manifest()
    assert crd["spec"] == expected["spec"]
    assert crd["metadata"]["name"] == expected["metadata"]["name"]
    assert expected["metadata"]["labels"].items() <= crd["metadata"]["labels"].items()
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    unkept = one(render("--set", "crds.keep=false"), "CustomResourceDefinition")
    assert "annotations" not in unkept["metadata"]
    assert "CustomResourceDefinition" not in kinds(render("--set", "crds.install=false"))


def test_operator_env_maps_one_to_one_onto_its_settings() -> None:
    """Every SCHEDLOCK_* variable the chart sets is an operator setting, and parses."""
    settings = {spec.env: spec for _, spec in specs(OperatorSettings)}
    for values in VALUES:
        env = env_of(operator_container(render(*values_args(values))))
        unknown = set(env) - set(settings)
        assert not unknown, f"the operator has no setting for {sorted(unknown)}"
        for name, entry in env.items():
            if "value" not in entry or settings[name].unit == "path":
                continue
            settings[name].parse(entry["value"])  # raises on a value the operator refuses
    env = env_of(operator_container(render()))
    assert env["SCHEDLOCK_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "schedlock-database",
        "key": "url",
    }
    fixed = {name: entry.get("value") for name, entry in env.items() if "value" in entry}
    assert fixed == {
        "SCHEDLOCK_DATABASE_SCHEMA": "schedlock",
        "SCHEDLOCK_WATCH_NAMESPACES": "",
        "SCHEDLOCK_HEALTH_PORT": "8080",
        "SCHEDLOCK_WEBHOOK_PORT": "9443",
        "SCHEDLOCK_WEBHOOK_CERT_FILE": "/tls/tls.crt",
        "SCHEDLOCK_WEBHOOK_KEY_FILE": "/tls/tls.key",
        "SCHEDLOCK_LOG_FORMAT": "json",
        "SCHEDLOCK_LOG_LEVEL": "info",
        "SCHEDLOCK_SYNC_SWEEP_SECONDS": "30",
        "SCHEDLOCK_REASSERT_SECONDS": "30",
        "SCHEDLOCK_MIGRATE": "auto",
        # retention.*, the same defaults as the settings' (the injected sidecars get them too)
        "SCHEDLOCK_RETENTION_SECONDS": "86400",
        "SCHEDLOCK_FAILED_RETENTION_SECONDS": "604800",
        "SCHEDLOCK_PRUNE_INTERVAL_SECONDS": "60",
        "SCHEDLOCK_PRUNE_BATCH_SIZE": "1000",
        "SCHEDLOCK_SIDECAR_IMAGE": f"ghcr.io/schedlock/schedlock-sidecar:{__version__}",
        "SCHEDLOCK_SIDECAR_DATABASE_SECRET": "schedlock-database",
        "SCHEDLOCK_SIDECAR_DATABASE_SECRET_KEY": "url",
        "SCHEDLOCK_SIDECAR_LEASE_SECONDS": "10",
        "SCHEDLOCK_SIDECAR_SIGNING_SECRET": "",  # no signing unless a pod asks
        "SCHEDLOCK_SIDECAR_RESOURCES": json.dumps(
            {"limits": {"memory": "128Mi"}, "requests": {"cpu": "10m", "memory": "48Mi"}},
            separators=(",", ":"),
        ),
    }


def test_all_features_env() -> None:
    env = env_of(operator_container(render("-f", CHART / "ci" / "all-features-values.yaml")))
    assert env["SCHEDLOCK_WATCH_NAMESPACES"]["value"] == "apps,billing"
    assert env["SCHEDLOCK_SYNC_SWEEP_SECONDS"]["value"] == "15"
    assert env["SCHEDLOCK_REASSERT_SECONDS"]["value"] == "20"
    assert env["SCHEDLOCK_MIGRATE"]["value"] == "off"
    assert env["SCHEDLOCK_SIDECAR_DATABASE_SECRET"]["value"] == "app-database"
    assert env["SCHEDLOCK_SIDECAR_DATABASE_SECRET_KEY"]["value"] == "dsn"
    assert env["SCHEDLOCK_SIDECAR_LEASE_SECONDS"]["value"] == "6"
    assert env["SCHEDLOCK_SIDECAR_SIGNING_SECRET"]["value"] == "app-signing/hmac"
    assert json.loads(env["SCHEDLOCK_SIDECAR_RESOURCES"]["value"]) == {
        "requests": {"cpu": "20m", "memory": "64Mi"},
        "limits": {"memory": "160Mi"},
    }


# --------------------------------------------------------------------------- database secret


def test_database_url_from_an_existing_secret() -> None:
    docs = render("-f", CHART / "ci" / "existing-secret-values.yaml")
    ref = env_of(operator_container(docs))["SCHEDLOCK_DATABASE_URL"]["valueFrom"]
    assert ref["secretKeyRef"] == {"name": "platform-postgres", "key": "connection-url"}
    secrets = [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"]
    assert "platform-postgres" not in secrets  # never created by the chart


def test_database_url_value_becomes_a_secret_and_is_printed_nowhere() -> None:
    url = "postgresql://schedlock:s3cr3t-pa55@db.example:5432/app"
    result = helm("template", RELEASE, CHART, "-n", NAMESPACE, "--set", f"database.url={url}")
    assert result.returncode == 0, result.stderr
    assert "s3cr3t-pa55" not in result.stdout
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    secret = next(d for d in docs if d["metadata"]["name"] == "schedlock-database")
    assert secret["kind"] == "Secret"
    assert base64.b64decode(secret["data"]["url"]).decode() == url
    ref = env_of(operator_container(docs))["SCHEDLOCK_DATABASE_URL"]["valueFrom"]
    assert ref["secretKeyRef"] == {"name": "schedlock-database", "key": "url"}
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/database" in annotations  # a new URL restarts the operator


def test_notes_never_print_the_database_url() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert ".Values.database.url }}" not in notes.replace("if not .Values.database.url }}", "")


# --------------------------------------------------------------------------- webhooks


def _webhook(docs: list[Manifest], kind: str) -> Manifest:
    (hook,) = one(docs, kind)["webhooks"]
    return dict(hook)


def test_validating_webhook() -> None:
    docs = render()
    hook = _webhook(docs, "ValidatingWebhookConfiguration")
    service = one(docs, "Service")
    assert hook["clientConfig"]["service"] == {
        "name": service["metadata"]["name"],
        "namespace": NAMESPACE,
        "path": "/validate",
        "port": 443,
    }
    assert hook["rules"] == [
        {
            "apiGroups": ["schedlock.dev"],
            "apiVersions": ["v1"],
            "resources": ["scheduledpublishes"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
    ]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["timeoutSeconds"] == 5
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {"webhook": (443, "webhook"), "http": (8080, "http")}
    scoped = _webhook(
        render("--set", "operator.watchNamespaces={a,b}"), "ValidatingWebhookConfiguration"
    )
    assert scoped["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}
    ]


def test_mutating_webhook_for_sidecar_injection() -> None:
    docs = render()
    hook = _webhook(docs, "MutatingWebhookConfiguration")
    assert hook["clientConfig"]["service"]["path"] == "/inject"
    assert hook["clientConfig"]["service"]["port"] == 443
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "operations": ["CREATE"],
            "scope": "Namespaced",
        }
    ]
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", NAMESPACE],
            }
        ]
    }
    # Only pods that opt in are sent: the label injection.py asks for, not every pod CREATE.
    assert hook["objectSelector"] == {"matchLabels": {LABEL_INJECT: LABEL_INJECT_VALUE}}
    assert hook["timeoutSeconds"] == 5
    assert hook["failurePolicy"] == "Ignore"
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    custom = _webhook(
        render("-f", CHART / "ci" / "all-features-values.yaml"), "MutatingWebhookConfiguration"
    )
    assert custom["failurePolicy"] == "Fail"
    # injection.objectSelector is ANDed with the opt-in label, never replaces it.
    assert custom["objectSelector"] == {
        "matchExpressions": [{"key": "schedlock.dev/skip", "operator": "DoesNotExist"}],
        "matchLabels": {LABEL_INJECT: LABEL_INJECT_VALUE},
    }
    overridden = _webhook(
        render("--set", "injection.objectSelector.matchLabels.schedlock\\.dev/inject=no"),
        "MutatingWebhookConfiguration",
    )
    assert overridden["objectSelector"] == {"matchLabels": {LABEL_INJECT: LABEL_INJECT_VALUE}}
    # The same namespaces as the operator (all-features watches apps and billing), less the
    # excluded ones: both expressions must hold.
    assert custom["namespaceSelector"]["matchExpressions"] == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", NAMESPACE, "kube-public", "kube-node-lease"],
        },
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["apps", "billing"]},
    ]
    validating = _webhook(
        render("-f", CHART / "ci" / "all-features-values.yaml"), "ValidatingWebhookConfiguration"
    )
    assert validating["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["apps", "billing"]}
    ]


def test_self_managed_certificate_serves_the_service_and_matches_the_ca_bundle() -> None:
    docs = render()
    secret = one(docs, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["name"] == "schedlock-webhook-tls"
    ca_b64 = secret["data"]["ca.crt"]
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        assert _webhook(docs, kind)["clientConfig"]["caBundle"] == ca_b64
    ca = x509.load_pem_x509_certificate(base64.b64decode(ca_b64))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    service = one(docs, "Service")["metadata"]["name"]
    assert f"{service}.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    validity = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert validity.days >= 3649


def test_cert_manager_mode() -> None:
    docs = render("-f", CHART / "ci" / "all-features-values.yaml")
    assert "Secret" not in {d["kind"] for d in docs if d["metadata"]["name"].endswith("-tls")}
    certificate = one(docs, "Certificate")
    issuer = one(docs, "Issuer")
    assert certificate["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    assert issuer["spec"] == {"selfSigned": {}}
    service = one(docs, "Service")["metadata"]["name"]
    assert f"{service}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    tls = next(v for v in volumes if v["name"] == "tls")
    assert tls["secret"]["secretName"] == certificate["spec"]["secretName"]
    inject_from = f"{NAMESPACE}/{certificate['metadata']['name']}"
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        config = one(docs, kind)
        assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": inject_from}
        assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    external = render("-f", CHART / "ci" / "existing-secret-values.yaml")
    assert "Issuer" not in kinds(external)
    assert one(external, "Certificate")["spec"]["issuerRef"] == {
        "name": "cluster-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_no_webhooks() -> None:
    docs = render("-f", CHART / "ci" / "no-webhooks-values.yaml")
    assert not {
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "Secret",
        "Certificate",
        "CustomResourceDefinition",
    } & kinds(docs)
    container = operator_container(docs)
    assert not {"SCHEDLOCK_WEBHOOK_CERT_FILE", "SCHEDLOCK_WEBHOOK_KEY_FILE"} & set(
        env_of(container)
    )
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp"]
    assert [p["name"] for p in one(docs, "Service")["spec"]["ports"]] == ["http"]
    # Injection alone still needs the HTTPS server and its certificate.
    only_injection = render("--set", "webhook.enabled=false")
    assert "MutatingWebhookConfiguration" in kinds(only_injection)
    assert "ValidatingWebhookConfiguration" not in kinds(only_injection)
    assert "SCHEDLOCK_WEBHOOK_CERT_FILE" in env_of(operator_container(only_injection))


# --------------------------------------------------------------------------- optional objects


def test_pdb_never_blocks_a_drain_and_network_policy() -> None:
    assert not {"PodDisruptionBudget", "NetworkPolicy"} & kinds(render())
    docs = render("-f", CHART / "ci" / "all-features-values.yaml")
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    selector = one(docs, "Deployment")["spec"]["selector"]
    assert pdb["spec"]["selector"] == selector
    policy = one(docs, "NetworkPolicy")["spec"]
    assert policy["podSelector"] == selector
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    webhook_rule, health_rule = policy["ingress"]
    assert webhook_rule == {"ports": [{"port": 9443, "protocol": "TCP"}]}  # from anywhere
    assert health_rule["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert health_rule["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
    }
    egress_ports = [sorted(p["port"] for p in rule["ports"]) for rule in policy["egress"]]
    assert egress_ports == [[53, 53], [443, 6443], [6432]]
    assert policy["egress"][2]["to"] == [{"ipBlock": {"cidr": "10.20.0.0/16"}}]


def test_monitoring_objects_are_absent_by_default() -> None:
    docs = render()
    assert not MONITORING_KINDS & kinds(docs)
    assert "ConfigMap" not in kinds(docs)


def test_monitoring_objects_render_when_the_api_is_served() -> None:
    docs = render("--api-versions", "monitoring.coreos.com/v1")
    assert {"PodMonitor", "PrometheusRule"} <= kinds(docs)
    assert "ServiceMonitor" not in kinds(docs)  # the operator serves no /metrics yet


def test_monitoring_objects_when_forced() -> None:
    docs = render("-f", CHART / "ci" / "all-features-values.yaml")
    assert kinds(docs) >= MONITORING_KINDS
    pod_monitor = one(docs, "PodMonitor")["spec"]
    assert pod_monitor["selector"] == {"matchLabels": {"schedlock.dev/injected": "true"}}
    assert pod_monitor["namespaceSelector"] == {"any": True}
    (endpoint,) = pod_monitor["podMetricsEndpoints"]
    assert endpoint["port"] == "schedlock-http"
    assert len(endpoint["port"]) <= 15  # an IANA service name, or the API refuses the pod
    assert endpoint["honorLabels"] is True
    assert endpoint["path"] == "/metrics"
    service_monitor = one(docs, "ServiceMonitor")
    assert service_monitor["spec"]["endpoints"][0]["port"] == "http"
    assert (
        service_monitor["spec"]["selector"]["matchLabels"].items()
        <= one(docs, "Service")["metadata"]["labels"].items()
    )
    for kind in MONITORING_KINDS:
        assert one(docs, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    assert one(docs, "PrometheusRule")["spec"] == rules
    # Prometheus' own templates reach it untouched (Helm does not expand them).
    assert "{{ $labels." in json.dumps(one(docs, "PrometheusRule")["spec"])


def test_grafana_config_maps() -> None:
    docs = render("-f", CHART / "ci" / "all-features-values.yaml")
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    dashboard = maps["schedlock-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == NAMESPACE
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "schedlock"}
    expected = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["schedlock.json"]) == expected
    alerts = maps["schedlock-grafana-alerts"]
    assert alerts["metadata"]["labels"]["grafana_alert"] == "1"
    assert alerts["metadata"]["namespace"] == "monitoring"
    assert alerts["data"]["schedlock-alerts.yaml"] == (
        CHART / "files" / "grafana-alerts.yaml"
    ).read_text(encoding="utf-8")
    assert "${DS_PROMETHEUS}" in alerts["data"]["schedlock-alerts.yaml"]
    pinned = render(
        "--set",
        "monitoring.grafana.alerts.enabled=true",
        "--set",
        "monitoring.grafana.alerts.datasourceUid=prom-1",
    )
    rules = yaml.safe_load(one(pinned, "ConfigMap")["data"]["schedlock-alerts.yaml"])
    queries = [q for g in rules["groups"] for r in g["rules"] for q in r["data"]]
    assert {q["datasourceUid"] for q in queries} == {"prom-1", "__expr__"}
    assert "DS_PROMETHEUS" not in json.dumps(rules)
    relabelled = render(
        "--set",
        "monitoring.grafana.dashboard.enabled=true",
        "--set",
        "monitoring.grafana.dashboard.labelKey=dashboards",
        "--set",
        "monitoring.grafana.dashboard.labelValue=schedlock",
    )
    labels = one(relabelled, "ConfigMap")["metadata"]["labels"]
    assert labels["dashboards"] == "schedlock" and "grafana_dashboard" not in labels


def test_a_missing_monitoring_file_fails_with_a_hint(tmp_path: Path) -> None:
    chart = tmp_path / "schedlock"
    shutil.copytree(CHART, chart)
    (chart / "files" / "prometheus-rules.yaml").unlink()
    result = helm("template", RELEASE, chart, "--set", "monitoring.forceRender=true")
    assert result.returncode != 0
    assert "files/prometheus-rules.yaml is missing from the chart" in result.stderr


# --------------------------------------------------------------------------- checkov


def checkov_bin() -> Path:
    """checkov from $CHECKOV, the tool cache (hack/tools.sh), the venv or PATH; never skips."""
    candidates = [Path(sys.executable).parent / "checkov"]
    with contextlib.suppress(ToolMissing):
        candidates.insert(0, tool("checkov"))
    if os.environ.get("CHECKOV"):
        candidates.insert(0, Path(os.environ["CHECKOV"]))
    found = shutil.which("checkov")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(
        "checkov is not installed: `bash hack/tools.sh ensure checkov` (run by make lint/test) "
        "installs it (or point $CHECKOV at a checkov binary)",
        pytrace=False,
    )


def test_checkov_passes_on_the_rendered_chart(tmp_path: Path) -> None:
    for values in VALUES:
        name = "defaults" if values is None else values.stem
        result = helm("template", RELEASE, CHART, "-n", NAMESPACE, *values_args(values))
        assert result.returncode == 0, result.stderr
        (tmp_path / f"{name}.yaml").write_text(result.stdout)
    run = subprocess.run(
        [
            str(checkov_bin()),
            "--config-file",
            str(CHECKOV_CONFIG),
            "-d",
            str(tmp_path),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    report = json.loads(run.stdout)
    reports = report if isinstance(report, list) else [report]
    failed = [
        f"{check['check_id']} {check['check_name']} — {check['resource']}"
        for r in reports
        for check in r.get("results", {}).get("failed_checks", [])
    ]
    assert failed == [], "\n".join(failed)
    assert run.returncode == 0, run.stderr
    summary = reports[0]["summary"]
    assert summary["passed"] > 100 and summary["parsing_errors"] == 0
    assert summary["resource_count"] >= 30  # it did read the rendered objects


def test_checkov_skip_list_is_documented() -> None:
    config = yaml.safe_load(CHECKOV_CONFIG.read_text())
    skipped = config["skip-check"]
    text = CHECKOV_CONFIG.read_text()
    for check in skipped:
        block = text.split(f"- {check}")[0].rsplit("- CKV", 1)[-1]
        assert block.count("#") >= 2, f"{check} is skipped without a reason"
    assert config["framework"] == ["kubernetes"]


# --------------------------------------------------------------------------- Dockerfile

DOCKERFILE = REPO / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in joined.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        word, _, rest = stripped.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _stage(name: str) -> list[tuple[str, str]]:
    (stage,) = [s for s in _stages() if s[0][1].endswith(f" AS {name}")]
    return stage


def test_hadolint_passes() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_final_stages() -> None:
    """Two images: the ``schedlock-sidecar`` target (the slim Python with the sidecar's venv,
    pruned in ``sidecar-root`` and flattened into one layer) and, as the default last stage,
    ``schedlock``: that image plus the operator's venv (the sidecar's plus the extra)."""
    stages = _stages()
    assert stages[0][0][1].endswith(" AS build")
    assert stages[-1][0] == ("FROM", "schedlock-sidecar AS schedlock")
    assert _stage("schedlock-sidecar")[0] == ("FROM", "scratch AS schedlock-sidecar")
    assert _stage("venv-operator")[0] == ("FROM", "venv-sidecar AS venv-operator")
    sidecar = _stage("schedlock-sidecar")
    text = "\n".join(f"{i} {a}" for i, a in sidecar)
    assert ("USER", "65532:65532") in sidecar
    assert ("ENTRYPOINT", '["schedlock"]') in sidecar
    for label in ("title", "description", "version", "revision", "licenses", "source"):
        assert f"org.opencontainers.image.{label}=" in text, label
    (version,) = [a for i, a in sidecar if i == "ARG" and a.startswith("VERSION=")]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert version == f"VERSION={__version__}" == f"VERSION={chart['appVersion']}"
    copies = {
        name: [a for i, a in _stage(name) if i == "COPY"]
        for name in ("schedlock", "sidecar-root", "schedlock-sidecar")
    }
    assert copies == {
        "schedlock": ["--from=venv-operator /opt/schedlock /opt/schedlock"],
        "sidecar-root": ["--from=venv-sidecar /opt/schedlock /opt/schedlock"],
        "schedlock-sidecar": ["--from=sidecar-root / /"],
    }
    for name in ("schedlock", "sidecar-root", "schedlock-sidecar"):
        text = "\n".join(f"{i} {a}" for i, a in _stage(name))
        for forbidden in ("apt-get", "gcc", "build-essential", "pip install", "COPY . "):
            assert forbidden not in text, f"{name}: {forbidden}"
    # Only the operator's venv asks for the operator extra (kopf, the Kubernetes client).
    assert "[operator]" in " ".join(a for i, a in _stage("venv-operator") if i == "RUN")
    assert "[operator]" not in " ".join(a for i, a in _stage("venv-sidecar") if i == "RUN")


def test_dockerignore_lets_exactly_the_copied_sources_through() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set()
    for instruction, args in _stages()[0]:
        if instruction == "COPY":
            *sources, _ = args.split()
            copied |= {s.rstrip("/") for s in sources}
    assert copied == allowed
    assert all((REPO / source).exists() for source in copied)


def _replay(
    stage: list[tuple[str, str]], workdir: Path, root: Path, wheels: Path, env: dict[str, str]
) -> None:
    """Run a stage's RUN commands with its absolute image paths moved under ``root``."""
    for instruction, args in stage:
        if instruction != "RUN":
            continue
        local = args.replace("/opt/schedlock", f"{root}/opt/schedlock").replace(
            "/wheels", str(wheels)
        )
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", local],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=840,
        )
        assert result.returncode == 0, f"{local}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.mark.timeout(1200)
def test_dockerfile_build_commands_work_outside_a_container(tmp_path: Path) -> None:
    """The build stage's COPY and RUN, then the venv stages' RUN (the sidecar's, then the
    operator's on top of it), replayed in a scratch tree with this Python: the sidecar's venv
    has no kopf and no Kubernetes client and says so when asked to run the operator; the
    operator's runs every command.

    Slow-ish (two fresh venvs with their dependencies, about two minutes with a warm pip cache).
    """
    build = _stage("build")
    src, root = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    workdir = src
    for instruction, args in build:
        if instruction == "WORKDIR":
            assert args == "/src"
        elif instruction == "COPY":
            *sources, destination = args.split()
            into_dir = len(sources) > 1 or destination.endswith("/")
            for source in sources:
                target = (
                    workdir / destination / Path(source).name if into_dir else workdir / destination
                )
                if (REPO / source).is_dir():
                    shutil.copytree(
                        REPO / source, target, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    shutil.copy2(REPO / source, target)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SCHEDLOCK_", "PIP_"))},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    wheels = root / "wheels"
    _replay(build, workdir, root, wheels, env)
    assert len(list(wheels.glob("schedlock-*.whl"))) == 1

    def schedlock(venv: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(venv / "bin" / "schedlock"), *args],
            env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=check,
        )

    # The sidecar's venv first; the operator's stage adds the extra to the same venv.
    venv = tmp_path / "image" / "opt" / "schedlock"
    _replay(_stage("venv-sidecar"), workdir, tmp_path / "image", wheels, env)
    assert not (venv / "bin" / "pip").exists(), "the runtime venv must not carry pip"
    assert schedlock(venv, "--version").stdout.strip() == f"schedlock {__version__}"
    assert "SCHEDLOCK_DATABASE_URL" in schedlock(venv, "sidecar", "--help").stdout
    site = next((venv / "lib").glob("python3*/site-packages"))

    def installed() -> set[str]:
        return {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}

    assert "schedlock" in installed() and "psycopg" in installed()
    assert not installed() & {"kopf", "kubernetes"}, installed()
    refused = schedlock(venv, "operator", check=False)
    assert refused.returncode == 2, refused
    assert "schedlock[operator]" in refused.stderr and "Traceback" not in refused.stderr

    _replay(_stage("venv-operator"), workdir, tmp_path / "image", wheels, env)
    assert {"kopf", "kubernetes"} <= installed()
    assert not (venv / "bin" / "pip").exists(), "the runtime venv must not carry pip"
    assert "SCHEDLOCK_WEBHOOK_CERT_FILE" in schedlock(venv, "operator", "--help").stdout
