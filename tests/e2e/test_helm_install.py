"""The chart against a real API server: install, upgrade, uninstall, and its RBAC is enough.

The session's kube-apiserver + etcd (RBAC on) has no controllers and no kubelet: objects are
validated and stored, nothing runs, so no `--wait` (the Deployment never becomes ready).  The
second test runs the real operator under a token for the chart's RENDERED ServiceAccount and
RBAC (ClusterRole and ClusterRoleBinding, or with `operator.watchNamespaces` a Role and
RoleBinding per watched namespace) and fires one ScheduledPublish end to end through real
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

from schedlock.operator.injection import LABEL_INJECT, LABEL_INJECT_VALUE
from testbed.helm import CHART, Helm
from testbed.kube import KubeAPIServer
from testbed.operators import OperatorProcess, at
from testbed.pg import free_port
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
        kube.wait_established(CRD)
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


def _render(helm: Helm, release: str, namespace: str, *args: str) -> list[Manifest]:
    result = helm("template", release, CHART, "--namespace", namespace, *args)
    return [d for d in yaml.safe_load_all(result.stdout) if d]


RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("watched", [False, True], ids=["cluster-wide", "watch-namespaces"])
def test_operator_runs_on_the_charts_rendered_rbac(
    kube: KubeAPIServer,
    postgres: PostgresService,
    migrated_template: str,
    tmp_path: Path,
    watched: bool,
) -> None:
    """With ``operator.watchNamespaces`` the chart grants a Role in each watched namespace and
    nothing cluster-wide: the operator serves the watched namespace on it alone (no Forbidden
    in its log), may not even read another namespace's objects, and leaves them alone."""
    helm = Helm(kube.admin_kubeconfig, tmp_path / "helm-home")
    release = f"rbac-{uuid.uuid4().hex[:6]}"
    namespace = f"{release}-system"
    apps = f"{release}-apps"
    other = f"{release}-other"  # not watched (watch-namespaces): never served
    scope = ("--set", f"operator.watchNamespaces={{{apps}}}") if watched else ()
    docs = _render(helm, release, namespace, *scope)
    by_kind = {d["kind"]: d for d in docs}
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    assert {d["kind"] for d in rbac} == (
        {"Role", "RoleBinding"} if watched else {"ClusterRole", "ClusterRoleBinding"}
    )
    for name in (namespace, apps, other):
        kube.kubectl("create", "namespace", name)
    # The CRD as the chart renders it, and exactly the chart's identity and rules.
    kube.apply(by_kind["CustomResourceDefinition"])
    kube.wait_established(CRD)
    kube.apply([by_kind["ServiceAccount"], *rbac])
    account = by_kind["ServiceAccount"]["metadata"]["name"]
    kubeconfig = kube.service_account_kubeconfig(namespace, account, create=False)
    who = f"system:serviceaccount:{namespace}:{account}"

    def can(*args: str) -> bool:
        out = kube.kubectl("auth", "can-i", *args, "--as", who, check=False)
        return out.stdout.strip() == "yes"

    assert can("watch", CRD, "-n", apps) and can("patch", f"{CRD}/status", "-n", apps)
    assert can("watch", CRD, "--all-namespaces") is not watched
    assert can("list", CRD, "-n", other) is not watched
    assert can("create", "events", "-n", other) is not watched

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
        # Served only when the operator watches the whole cluster.
        kube.apply({**publish, "metadata": {"name": "elsewhere", "namespace": other}})

        def status(where: str = apps, name: str = "rbac-check") -> dict[str, Any]:
            obj = _get(kube, "sp", name, namespace=where) or {}
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
            if watched:
                # The other namespace's object was never seen: no status, no finalizer.
                assert status(other, "elsewhere") == {}
                elsewhere = _get(kube, "sp", "elsewhere", namespace=other) or {}
                assert not elsewhere["metadata"].get("finalizers"), elsewhere["metadata"]
            else:
                wait_for(
                    lambda: status(other, "elsewhere").get("phase") == "Scheduled",
                    timeout=30,
                    what="the other namespace's object served",
                )
                kube.kubectl(
                    "delete", "sp", "elsewhere", "-n", other, "--wait=true", "--timeout=30s"
                )
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
        for name in (apps, other, namespace):
            kube.kubectl("delete", "namespace", name, "--wait=false", check=False)
        if not watched:
            kube.kubectl(
                "delete",
                "clusterrolebinding,clusterrole",
                by_kind["ClusterRole"]["metadata"]["name"],
                check=False,
            )


def test_the_injection_webhook_is_sent_only_labelled_pods_of_watched_namespaces(
    kube: KubeAPIServer, tmp_path: Path
) -> None:
    """The chart's MutatingWebhookConfiguration, as rendered, pointed at an address where
    nothing listens with ``failurePolicy: Fail``: a pod the API server sends to the webhook is
    refused, one it does not send is admitted.  So the API server itself proves which pods
    reach the injector: only those labelled ``schedlock.dev/inject: "true"``, and, with
    ``operator.watchNamespaces``, only in those namespaces (never kube-system or the
    release's own)."""
    helm = Helm(kube.admin_kubeconfig, tmp_path / "helm-home")
    release = f"sel-{uuid.uuid4().hex[:6]}"
    namespace, apps, other = f"{release}-system", f"{release}-apps", f"{release}-other"
    for name in (namespace, apps, other):
        kube.kubectl("create", "namespace", name)
    dead = f"https://127.0.0.1:{free_port()}/inject"  # nothing listens: a call fails

    def install(*args: str) -> str:
        docs = _render(helm, release, namespace, *args)
        (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
        (hook,) = config["webhooks"]
        hook["clientConfig"] = {"url": dead, "caBundle": hook["clientConfig"]["caBundle"]}
        hook["failurePolicy"] = "Fail"
        kube.apply(config)
        return str(config["metadata"]["name"])

    def sent(where: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> bool:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": "app-",
                "namespace": where,
                "labels": {"app.kubernetes.io/name": "billing", **labels},
                "annotations": annotations or {},
            },
            "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
        }
        out = kube.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
        )
        if out.returncode == 0:
            return False
        assert 'failed calling webhook "inject.schedlock.dev"' in out.stderr, out.stderr
        return True

    opt_in = {LABEL_INJECT: LABEL_INJECT_VALUE}
    name = install()
    try:
        assert sent(apps, opt_in) and sent(other, opt_in)  # the whole cluster
        assert not sent(apps, {})  # no label: never sent, whatever else the pod says
        assert not sent(apps, {}, annotations=opt_in)  # the opt-in of 0.1 is not enough
        assert not sent(apps, {LABEL_INJECT: "True"})  # the selector is exact, as the injector
        assert not sent(namespace, opt_in) and not sent("kube-system", opt_in)
        kube.kubectl("delete", "mutatingwebhookconfiguration", name)
        name = install("--set", f"operator.watchNamespaces={{{apps}}}")
        assert sent(apps, opt_in)
        assert not sent(other, opt_in)  # not watched: not sent
        assert not sent(apps, {})
    finally:
        kube.kubectl("delete", "mutatingwebhookconfiguration", name, check=False)
        for ns in (namespace, apps, other):
            kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
