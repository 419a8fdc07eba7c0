"""The chart against a real API server: install, upgrade, uninstall, and its RBAC is enough.

The session's kube-apiserver + etcd (RBAC on) has no controllers and no kubelet: objects are
validated and stored, nothing runs, so no `--wait` (the Deployment never becomes ready).  The
second test runs the real operator under a token for the chart's RENDERED ServiceAccount,
ClusterRole and ClusterRoleBinding and fires one ScheduledPublish end to end through real
sidecars: a rule missing from the chart fails it with a Forbidden in the operator's log.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.helm import CHART, Helm
from testbed.kube import KubeAPIServer
from testbed.operators import OperatorProcess, at
from testbed.pg_fixtures import PostgresService
from testbed.sidecars import SidecarGroup, wait_for

REPO = Path(__file__).resolve().parents[2]
CRD = "scheduledpublishes.schedlock.dev"
SECRET_PASSWORD = "n0t-in-the-notes"

Manifest = dict[str, Any]


def _get(kube: KubeAPIServer, *what: str, namespace: str | None = None) -> Manifest | None:
    args = ["get", *what, "-o", "json"]
    if namespace:
        args += ["-n", namespace]
    out = kube.kubectl(*args, check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _adopt_existing_crd(kube: KubeAPIServer, release: str, namespace: str) -> None:
    """Let the release take over a CRD applied earlier by kubectl (docs/install.md)."""
    if _get(kube, "crd", CRD) is None:
        return
    kube.kubectl("label", "crd", CRD, "app.kubernetes.io/managed-by=Helm", "--overwrite")
    kube.kubectl(
        "annotate",
        "crd",
        CRD,
        f"meta.helm.sh/release-name={release}",
        f"meta.helm.sh/release-namespace={namespace}",
        "--overwrite",
    )


def test_install_upgrade_uninstall(kube: KubeAPIServer, tmp_path: Path) -> None:
    helm = Helm(kube.admin_kubeconfig, tmp_path / "helm-home")
    release = "schedlock"
    namespace = f"sl-{uuid.uuid4().hex[:8]}"
    url = f"postgresql://schedlock:{SECRET_PASSWORD}@db.example:5432/app"
    _adopt_existing_crd(kube, release, namespace)
    # The release namespace enforces (and warns about) Pod Security "restricted".
    kube.apply(_restricted_namespace(namespace))
    installed = False
    try:
        chart = (release, CHART, "--namespace", namespace, "--set", f"database.url={url}")
        install = helm("install", *chart)
        installed = True
        assert "STATUS: deployed" in install.stdout
        assert "PodSecurity" not in install.stderr, install.stderr  # no "would violate" warning
        assert SECRET_PASSWORD not in install.stdout + install.stderr  # NOTES never print it
        assert "schedlock.dev/inject" in install.stdout  # the next steps are shown
        operator = "schedlock-operator"

        # Everything was accepted and stored by the API server.
        kube.kubectl("wait", "--for=condition=Established", "--timeout=30s", f"crd/{CRD}")
        crd = _get(kube, "crd", CRD)
        assert crd is not None
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        for kind, name in (
            ("deployment", operator),
            ("service", operator),
            ("serviceaccount", operator),
            ("secret", "schedlock-webhook-tls"),
            ("secret", "schedlock-database"),
        ):
            assert _get(kube, kind, name, namespace=namespace), f"{kind}/{name}"
        role = _get(kube, "clusterrole", operator)
        assert role is not None
        assert _get(kube, "clusterrolebinding", operator)
        validating = _get(kube, "validatingwebhookconfiguration", "schedlock-validate")
        mutating = _get(kube, "mutatingwebhookconfiguration", "schedlock-inject")
        assert validating is not None and mutating is not None
        deployment = _get(kube, "deployment", operator, namespace=namespace)
        assert deployment is not None
        assert deployment["spec"]["strategy"]["type"] == "Recreate"
        _assert_admitted_as_a_pod(kube, deployment, namespace)

        tls = _get(kube, "secret", "schedlock-webhook-tls", namespace=namespace)
        assert tls is not None
        ca_bundle = validating["webhooks"][0]["clientConfig"]["caBundle"]
        assert ca_bundle == tls["data"]["ca.crt"]
        assert mutating["webhooks"][0]["clientConfig"]["caBundle"] == ca_bundle
        assert base64.b64decode(tls["data"]["tls.crt"]).startswith(b"-----BEGIN CERTIFICATE")

        # An upgrade changes the operator and keeps the certificate (lookup).
        helm("upgrade", *chart, "--set", "operator.logLevel=debug")
        after = _get(kube, "secret", "schedlock-webhook-tls", namespace=namespace)
        assert after is not None
        assert after["data"] == tls["data"], "the upgrade regenerated the webhook certificate"
        validating = _get(kube, "validatingwebhookconfiguration", "schedlock-validate")
        assert validating is not None
        assert validating["webhooks"][0]["clientConfig"]["caBundle"] == ca_bundle
        deployment = _get(kube, "deployment", operator, namespace=namespace)
        assert deployment is not None
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SCHEDLOCK_LOG_LEVEL"] == "debug"
        history = json.loads(helm("history", release, "-n", namespace, "-o", "json").stdout)
        assert [h["revision"] for h in history] == [1, 2]

        # Uninstall removes the release's objects; the CRD (and every object) stays.
        uninstall = helm("uninstall", release, "--namespace", namespace)
        installed = False
        assert "kept due to the resource policy" in uninstall.stdout + uninstall.stderr
        assert _get(kube, "deployment", operator, namespace=namespace) is None
        assert _get(kube, "service", operator, namespace=namespace) is None
        assert _get(kube, "secret", "schedlock-webhook-tls", namespace=namespace) is None
        assert _get(kube, "clusterrole", operator) is None
        assert _get(kube, "clusterrolebinding", operator) is None
        assert _get(kube, "validatingwebhookconfiguration", "schedlock-validate") is None
        assert _get(kube, "mutatingwebhookconfiguration", "schedlock-inject") is None
        assert _get(kube, "crd", CRD) is not None
    finally:
        if installed:
            helm("uninstall", release, "--namespace", namespace, check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _restricted_namespace(name: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn")
            }
            | {"pod-security.kubernetes.io/enforce-version": "latest"},
        },
    }


def _assert_admitted_as_a_pod(kube: KubeAPIServer, deployment: Manifest, namespace: str) -> None:
    """No controller runs here, so no pod is ever made from the Deployment: create its pod
    template as a Pod (server-side dry run, so admission runs in full and nothing is stored)."""
    template = deployment["spec"]["template"]

    def create(spec: Manifest) -> subprocess.CompletedProcess[str]:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "operator-", "namespace": namespace},
            "spec": spec,
        }
        return kube.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
        )

    admitted = create(template["spec"])
    assert admitted.returncode == 0, admitted.stderr
    # The namespace really enforces the profile: without its security contexts it is refused.
    careless = {
        **template["spec"],
        "securityContext": {},
        "containers": [
            {k: v for k, v in c.items() if k != "securityContext"}
            for c in template["spec"]["containers"]
        ],
    }
    refused = create(careless)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr


def _render(helm: Helm, release: str, namespace: str) -> list[Manifest]:
    result = helm("template", release, CHART, "--namespace", namespace)
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.mark.timeout(240)
def test_operator_runs_on_the_charts_rendered_rbac(
    kube: KubeAPIServer,
    postgres: PostgresService,
    migrated_template: str,
    tmp_path: Path,
) -> None:
    helm = Helm(kube.admin_kubeconfig, tmp_path / "helm-home")
    release = f"rbac-{uuid.uuid4().hex[:6]}"
    namespace = f"{release}-system"
    apps = f"{release}-apps"
    docs = _render(helm, release, namespace)
    by_kind = {d["kind"]: d for d in docs}
    kube.kubectl("create", "namespace", namespace)
    kube.kubectl("create", "namespace", apps)
    # The CRD as the chart renders it, and exactly the chart's identity and rules.
    kube.apply(by_kind["CustomResourceDefinition"])
    kube.kubectl("wait", "--for=condition=Established", "--timeout=30s", f"crd/{CRD}")
    kube.apply([by_kind["ServiceAccount"], by_kind["ClusterRole"], by_kind["ClusterRoleBinding"]])
    account = by_kind["ServiceAccount"]["metadata"]["name"]
    kubeconfig = kube.service_account_kubeconfig(namespace, account, create=False)

    # The operator with the chart's own environment (bar ports, certificate files, the URL).
    (container,) = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"]
    managed_by_the_test = {
        "SCHEDLOCK_HEALTH_PORT",
        "SCHEDLOCK_WEBHOOK_PORT",
        "SCHEDLOCK_WEBHOOK_CERT_FILE",
        "SCHEDLOCK_WEBHOOK_KEY_FILE",
    }
    chart_env = {
        e["name"]: e["value"]
        for e in container["env"]
        if "value" in e and e["name"] not in managed_by_the_test
    }
    assert "SCHEDLOCK_MIGRATE" in chart_env and "SCHEDLOCK_SIDECAR_IMAGE" in chart_env
    database = postgres.create_database(template=migrated_template)
    operator = OperatorProcess(tmp_path / "operator", database, kubeconfig, extra_env=chart_env)
    sidecars = SidecarGroup(tmp_path / "sidecars", database, namespace=apps, replicas=2)
    try:
        operator.start()
        sidecars.start()
        publish = {
            "apiVersion": "schedlock.dev/v1",
            "kind": "ScheduledPublish",
            "metadata": {"name": "rbac-check", "namespace": apps},
            "spec": {"target": sidecars.target, "publishAt": at(3), "payload": {"n": 1}},
        }
        kube.apply(publish)

        def status() -> dict[str, Any]:
            obj = _get(kube, "sp", "rbac-check", namespace=apps) or {}
            return dict(obj.get("status") or {})

        receiver = sidecars.receiver
        assert receiver is not None

        def reasons() -> set[str]:
            events = _get(kube, "events", namespace=apps) or {"items": []}
            return {e["reason"] for e in events["items"]}

        try:
            wait_for(receiver.entries, timeout=30, what="the delivery")
            wait_for(
                lambda: status().get("phase") == "Published", timeout=30, what="status Published"
            )
            wait_for(lambda: "Published" in reasons(), timeout=20, what="the Published event")
            # Delete goes through the finalizer: the cancel handler patches it away.
            kube.kubectl("delete", "sp", "rbac-check", "-n", apps, "--wait=true", "--timeout=30s")
        except (TimeoutError, AssertionError) as exc:
            raise AssertionError(f"{exc}\noperator log:\n{operator.log_text()[-4000:]}") from exc
        log = operator.log_text()
        assert "Forbidden" not in log, log[-4000:]
        assert " 403" not in log and '"403"' not in log, log[-4000:]
        assert operator.alive(), log[-4000:]
    finally:
        sidecars.stop()
        operator.stop()
        postgres.drop_database(database)
        for name in (apps, namespace):
            kube.kubectl("delete", "namespace", name, "--wait=false", check=False)
        kube.kubectl(
            "delete",
            "clusterrolebinding,clusterrole",
            by_kind["ClusterRole"]["metadata"]["name"],
            check=False,
        )
