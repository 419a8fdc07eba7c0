"""schedlock in a real cluster, installed the way users install it (issue 11).

One node (kubelet + containerd + runc), the chart installed by helm with the image built from
the project's Dockerfile, the demo app's pods injected by the operator's webhook, PostgreSQL
reached by a Service name.  Every delivery the demo apps receive is forwarded to a recorder on
the host, so a deleted pod's deliveries are still counted.

The order of the tests matters only for the last one, which upgrades and then uninstalls the
release the module's fixture installed.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitoring import generate
from testbed.checks import assert_duplicates_only_across_crash
from testbed.deliveries import Delivery
from testbed.helm import CHART
from testbed.incluster import (
    INJECTED_LABEL,
    Product,
    StreamVerdict,
    installed_product,
    restricted_namespace,
    stream_rows,
    verdict,
    wait_settled,
)
from testbed.prometheus import Prometheus, podmonitor_scrape_config
from testbed.sidecars import wait_for
from testbed.tools import tool

CRD = "scheduledpublishes.schedlock.dev"
OVERRIDES = {"networkPolicy.enabled": True}


@pytest.fixture(scope="module")
def product(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    with installed_product(
        cluster, tmp_path_factory.mktemp("product"), overrides=OVERRIDES
    ) as installed:
        yield installed


def _json(product: Product, *args: str) -> Any:
    return json.loads(product.cluster.kubectl(*args, "-o", "json").stdout)


def _delete_app(product: Product, name: str, namespace: str) -> None:
    product.cluster.kubectl(
        "delete", "deployment", name, "-n", namespace, "--wait=true", "--timeout=120s",
        timeout=180,
    )  # fmt: skip


def _sidecar(pod: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (c for c in pod["spec"].get("initContainers") or [] if c["name"] == "schedlock"), None
    )


def _ready_counts(pod: dict[str, Any]) -> tuple[int, int]:
    """(ready, total) as `kubectl get pods` shows READY, native sidecars included."""
    statuses = [
        *(pod["status"].get("containerStatuses") or []),
        *[
            s
            for s in (pod["status"].get("initContainerStatuses") or [])
            if s["name"] == "schedlock"
        ],
    ]
    return sum(1 for s in statuses if s.get("ready")), len(statuses)


# --------------------------------------------------------------------------- 1. install


def test_install_runs_the_operator_under_the_charts_own_settings(product: Product) -> None:
    """helm install --wait returned: the operator pod is Ready under the chart's
    ServiceAccount, probes, security context, with its NetworkPolicy in place."""
    pods = product.running_pods(product.namespace, "app.kubernetes.io/component=operator")
    assert len(pods) == 1, pods
    pod = pods[0]
    assert pod["spec"]["serviceAccountName"] == "schedlock-operator"
    assert all(c.get("ready") for c in pod["status"]["containerStatuses"]), pod["status"]
    container = pod["spec"]["containers"][0]
    assert container["image"] == product.images.schedlock.ref
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["securityContext"]["runAsNonRoot"] is True or pod["spec"].get(
        "securityContext", {}
    ).get("runAsNonRoot")
    policies = _json(product, "get", "networkpolicy", "-n", product.namespace)["items"]
    assert [p["metadata"]["name"] for p in policies] == ["schedlock-operator"]


def test_webhook_is_reached_through_its_service_over_tls(product: Product) -> None:
    """The API server calls the validating webhook by its Service: a schedule that never
    occurs is refused with the operator's own message, not the CRD's."""
    obj = {
        "apiVersion": "schedlock.dev/v1",
        "kind": "ScheduledPublish",
        "metadata": {"name": "never", "namespace": "default"},
        "spec": {"target": "demo", "schedule": "0 0 30 2 *"},
    }
    out = product.cluster.kubectl("apply", "-f", "-", input=json.dumps(obj), check=False)
    assert out.returncode != 0
    assert "admission webhook" in out.stderr and "spec.schedule" in out.stderr, out.stderr


# --------------------------------------------------------------------------- 2. injection


def test_injected_app_fires_a_scheduledpublish(product: Product) -> None:
    namespace = "shop"
    product.cluster.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    product.deploy_app("shop", namespace, replicas=3)
    try:
        pods = product.running_pods(namespace, "app.kubernetes.io/name=shop")
        assert len(pods) == 3
        for pod in pods:
            sidecar = _sidecar(pod)
            assert sidecar is not None, f"{pod['metadata']['name']} has no sidecar"
            assert sidecar["restartPolicy"] == "Always"  # a native sidecar
            # The Dockerfile's schedlock-sidecar image, not the operator's.
            assert sidecar["image"] == product.images.sidecar.ref
            assert pod["metadata"]["labels"].get(INJECTED_LABEL) == "true"
            assert _ready_counts(pod) == (2, 2), pod["status"]
        at = (datetime.now(UTC) + timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
        name = f"launch-{uuid.uuid4().hex[:6]}"
        product.cluster.apply(
            {
                "apiVersion": "schedlock.dev/v1",
                "kind": "ScheduledPublish",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"target": "shop", "publishAt": at, "payload": {"hello": "cluster"}},
            }
        )

        def phase() -> str | None:
            status = _json(product, "get", "sp", name, "-n", namespace).get("status") or {}
            return status.get("phase") if status.get("phase") == "Published" else None

        wait_for(phase, 90, 0.2, f"ScheduledPublish {name} to be Published")
        assert product.recorder is not None
        got = [r for r in product.recorder.records() if _record_name(r) == name]
        assert len(got) == 1, got
        printed = product.cluster.kubectl("get", "sp", "-n", namespace).stdout
        assert name in printed and "Published" in printed, printed
    finally:
        _delete_app(product, "shop", namespace)


def _record_name(record: dict[str, Any]) -> str:
    return str(record.get("name", ""))


# --------------------------------------------------------------------------- 3./4. streams


def _stream(product: Product, app: str, prefix: str, count: int, spacing: float) -> list[str]:
    return stream_rows(
        product.database.host_url,
        count=count,
        spacing=spacing,
        prefix=prefix,
        start_in=1.0,
        target=app,
        namespace="default",
    )


def test_failover_when_the_leaders_pod_is_deleted(product: Product, record_property: Any) -> None:
    """Rows due every 100 ms; the leader's pod is force-deleted, then the next leader's pod
    is deleted gracefully.  Nothing is lost or failed; a row arrives twice only when its
    leader was killed mid-delivery, with the same key."""
    app = "failover"
    product.deploy_app(app, replicas=3)
    try:
        product.wait_leader("default", app)
        prefix = f"fo-{uuid.uuid4().hex[:6]}"
        uids = _stream(product, app, prefix, count=150, spacing=0.1)
        deleted: set[str] = set()
        for how in (("--grace-period=0", "--force"), ()):
            time.sleep(3)  # let the stream run under this leader
            leader = product.wait_leader("default", app)
            deleted.add(leader)
            product.cluster.kubectl("delete", "pod", leader, "-n", "default", "--wait=false", *how)
            product.wait_leader("default", app, timeout=30)
        _, deliveries = _all_published(product, prefix, uids, "failover", record_property)
        assert_duplicates_only_across_crash([d.as_check_entry() for d in deliveries], deleted)
    finally:
        _delete_app(product, app, "default")


def _all_published(
    product: Product, prefix: str, uids: list[str], name: str, record_property: Any
) -> tuple[StreamVerdict, list[Delivery]]:
    """Wait for every row of PREFIX to settle, judge what arrived, record it under NAME; nothing
    may be lost and every row must be published."""
    outcomes = wait_settled(product.database.host_url, prefix, len(uids), timeout=120)
    assert product.recorder is not None
    deliveries = product.recorder.deliveries(prefix)
    result = verdict(uids, outcomes, deliveries)
    record_property(name, result.as_json())
    print(f"cluster {name}:", json.dumps(result.as_json()))
    assert result.lost == [], result.as_json()
    assert result.states == {"published": len(uids)}, result.as_json()
    return result, deliveries


def test_rolling_update_loses_nothing_and_nothing_is_late(
    product: Product, record_property: Any
) -> None:
    """`kubectl rollout restart` while rows fall due every 100 ms: each pod's app drains (503
    for 2 s) and exits before its sidecar is stopped.  Nothing lost, nothing failed, no row
    more than 1 s late."""
    app = "rolling"
    product.deploy_app(app, replicas=2, drain_seconds=2)
    try:
        product.wait_leader("default", app)
        prefix = f"ru-{uuid.uuid4().hex[:6]}"
        uids = _stream(product, app, prefix, count=400, spacing=0.1)
        product.cluster.kubectl("rollout", "restart", f"deployment/{app}", "-n", "default")
        product.rollout_status(app, "default")
        result, _ = _all_published(product, prefix, uids, "rolling_update", record_property)
        assert result.late_max_ms < 1000, result.as_json()
        assert result.duplicates == {}, result.duplicates  # nobody crashed
    finally:
        _delete_app(product, app, "default")


# --------------------------------------------------------------------------- 5. Prometheus


def _podmonitor(product: Product) -> dict[str, Any]:
    rendered = product.helm(
        "template", product.release, CHART, "--namespace", product.namespace,
        "--values", product.values_file(OVERRIDES), "--set", "monitoring.forceRender=true",
    ).stdout  # fmt: skip
    found = [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") == "PodMonitor"]
    assert len(found) == 1, found
    return dict(found[0])


def test_prometheus_discovers_the_sidecars_as_the_podmonitor_describes(
    product: Product, tmp_path: Path
) -> None:
    app = "watched"
    product.deploy_app(app, replicas=2)
    scrape = podmonitor_scrape_config(
        _podmonitor(product), product.cluster.admin_kubeconfig, interval="1s"
    )
    # Built from Prometheus's Go module: Debian's package has no Kubernetes discovery.
    server = Prometheus(
        tool("prometheus-upstream"),
        tmp_path / "prometheus",
        [scrape],
        generate.prometheus_rules_yaml(for_override="5s", interval="1s"),
    ).start()
    key = f'namespace="default", target="{app}"'
    try:

        def leaders() -> dict[str, float] | None:
            result = server.query(f"schedlock_leader{{{key}}}")
            if len(result) != 4:  # two pods x two schedulers
                return None
            return {
                f"{r['metric']['scheduler']}/{r['metric']['pod']}": float(r["value"][1])
                for r in result
            }

        seen = wait_for(leaders, 60, 0.2, "Prometheus to scrape both sidecars of the app")
        for scheduler in ("publish", "recurring"):
            ones = [k for k, v in seen.items() if k.startswith(scheduler + "/") and v == 1]
            assert len(ones) == 1, seen

        def absent_state() -> str | None:
            for alert in server.alerts():
                labels = alert["labels"]
                if labels["alertname"] == "SchedlockLeaderAbsent" and labels.get("target") == app:
                    return str(alert["state"])
            return None

        product.cluster.kubectl("scale", f"deployment/{app}", "-n", "default", "--replicas=0")
        wait_for(lambda: absent_state() == "firing", 90, 0.2, "SchedlockLeaderAbsent to fire")
        product.cluster.kubectl("scale", f"deployment/{app}", "-n", "default", "--replicas=1")
        product.rollout_status(app, "default")
        wait_for(lambda: absent_state() is None, 90, 0.2, "SchedlockLeaderAbsent to clear")
    finally:
        server.stop()
        _delete_app(product, app, "default")


# --------------------------------------------------------------------------- 6. Pod Security


def test_injected_pod_runs_in_a_restricted_namespace(product: Product) -> None:
    namespace = "restricted-apps"
    product.cluster.apply(restricted_namespace(namespace))
    product.deploy_app("strict", namespace, replicas=1)
    try:
        pods = product.running_pods(namespace, "app.kubernetes.io/name=strict")
        assert len(pods) == 1 and _sidecar(pods[0]) is not None
        assert _ready_counts(pods[0]) == (2, 2), pods[0]["status"]
        uids = stream_rows(
            product.database.host_url, count=3, spacing=0.1, prefix="strict",
            target="strict", namespace=namespace,
        )  # fmt: skip
        outcomes = wait_settled(product.database.host_url, "strict", len(uids), timeout=60)
        assert set(outcomes.values()) == {"published"}, outcomes
    finally:
        _delete_app(product, "strict", namespace)


# --------------------------------------------------------------------------- 1. upgrade, uninstall


def test_upgrade_then_uninstall(product: Product) -> None:
    """Last in the module: it ends the release the fixture installed."""
    before = product.running_pods(product.namespace, "app.kubernetes.io/component=operator")
    product.upgrade({**OVERRIDES, "operator.logLevel": "debug"})
    after = product.running_pods(product.namespace, "app.kubernetes.io/component=operator")
    assert len(after) == 1 and after[0]["metadata"]["uid"] != before[0]["metadata"]["uid"]
    env = {e["name"]: e.get("value") for e in after[0]["spec"]["containers"][0]["env"]}
    assert env.get("SCHEDLOCK_LOG_LEVEL") == "debug", env
    product.uninstall()
    assert not product.installed()
    left = product.cluster.kubectl(
        "get", "deployment,service,mutatingwebhookconfiguration,validatingwebhookconfiguration",
        "-A", "-l", f"app.kubernetes.io/instance={product.release}", "-o", "name",
    ).stdout  # fmt: skip
    assert left.strip() == "", left
    # The CRD is kept (crds.keep), and with it every ScheduledPublish object.
    assert product.cluster.kubectl("get", "crd", CRD, check=False).returncode == 0
