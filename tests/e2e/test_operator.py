"""ScheduledPublish end to end: kubectl -> operator -> row -> sidecar -> app -> status + Events.

Real kube-apiserver + etcd (RBAC on), the operator under a ServiceAccount bound to exactly
the chart's rules, its validating webhook called over TLS by the API server, real PostgreSQL,
two sidecars and a recording app.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import psycopg

from schedlock.core.logs import Event, records
from schedlock.operator.injection import LABEL_INJECT, LABEL_INJECT_VALUE
from testbed.operators import (
    OPERATOR_NAMESPACE,
    OPERATOR_SA,
    OperatorProcess,
    OperatorStack,
    at,
    mutating_webhook_configuration,
    operator_stack_fixture,
)
from testbed.pg_fixtures import OPERATOR_ROLE, RUNTIME_ENV, as_role
from testbed.sidecars import wait_for

NAMESPACE = "e2e-publish"
OPT_IN = {LABEL_INJECT: LABEL_INJECT_VALUE}  # the label pods opt in to the sidecar with


class Stack(OperatorStack):
    def row(self, uid: str) -> dict[str, Any] | None:
        found = self.sql(
            "SELECT state, due_at, attempts, generation FROM schedlock_publishes WHERE uid = %s",
            uid,
        )
        if not found:
            return None
        return dict(zip(("state", "due_at", "attempts", "generation"), found[0], strict=True))

    def fire_a_later_row(self, name: str, seconds: float) -> None:
        """Apply ``name`` due in ``seconds`` and wait for its delivery: the positive signal
        that the leader has claimed everything due before it (instead of a sleep)."""
        self.apply(name, publishAt=at(seconds))
        uid = self.uid(name)
        wait_for(lambda: self.deliveries(uid), timeout=seconds + 15, what=f"{name}'s delivery")


def ready(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})


stack = operator_stack_fixture(Stack, NAMESPACE, webhooks=True)


def test_apply_fires_and_status_follows(stack: Stack) -> None:
    stack.apply("hello", publishAt=at(3), payload={"greeting": 'héllo "world"'})
    uid = stack.uid("hello")
    wait_for(lambda: stack.row(uid), timeout=5, what="the row")
    # The handler writes the row, then kopf patches the status it returned: a moment later.
    phase = wait_for(lambda: stack.status("hello").get("phase"), timeout=5, what="a phase")
    assert phase in ("Scheduled", "Published", "Firing")
    [delivery] = wait_for(lambda: stack.deliveries(uid), timeout=15, what="the delivery")
    assert delivery["payload"] == {"greeting": 'héllo "world"'}
    wait_for(
        lambda: stack.status("hello").get("phase") == "Published",
        timeout=10,
        what="status Published",
    )
    # (That the sync acts on the outcomes' NOTIFY at once, not at its sweep, is timed exactly
    # on virtual time in tests/unit/test_status_sync_wakeups.py: no wall clock here.)
    status = stack.status("hello")
    assert ready(status)["status"] == "True"
    assert ready(status)["observedGeneration"] == 1
    assert status["lastFiredAt"] and status["firedBy"]["holder"].startswith("demo-")
    assert status["observedGeneration"] == 1
    try:
        wait_for(
            lambda: "Published" in stack.events("hello"), timeout=10, what="the Published event"
        )
    except TimeoutError:
        print(stack.kube.kubectl("get", "events", "-A", "-o", "wide").stdout)
        raise
    assert stack.events("hello") == ["Published"], "Events for outcomes only"


def test_update_moves_the_row_and_refires_only_for_a_new_time(stack: Stack) -> None:
    stack.apply("moving", publishAt=at(600))
    uid = stack.uid("moving")
    wait_for(lambda: stack.row(uid), timeout=5, what="the row")
    stack.apply("moving", publishAt=at(2))
    wait_for(lambda: (stack.row(uid) or {}).get("generation") == 2, timeout=5, what="the moved row")
    wait_for(lambda: len(stack.deliveries(uid)) == 1, timeout=15, what="the moved fire")
    wait_for(
        lambda: stack.status("moving").get("phase") == "Published", timeout=10, what="Published"
    )
    # A payload-only change after firing does not fire again...
    stack.apply(
        "moving", publishAt=(stack.get("moving") or {})["spec"]["publishAt"], payload={"v": 2}
    )
    wait_for(lambda: (stack.row(uid) or {}).get("generation") == 3, timeout=5, what="generation 3")
    assert (stack.row(uid) or {}).get("state") == "published", "terminal: nothing to fire"
    stack.fire_a_later_row("after-moving", 1)
    assert len(stack.deliveries(uid)) == 1
    # ...a new time does, with a new idempotency key.
    stack.apply("moving", publishAt=at(2), payload={"v": 2})
    wait_for(lambda: len(stack.deliveries(uid)) == 2, timeout=15, what="the second fire")
    first, second = stack.deliveries(uid)
    assert first["key"] != second["key"]


def test_delete_before_firing_cancels(stack: Stack) -> None:
    stack.apply("doomed", publishAt=at(4))
    uid = stack.uid("doomed")
    wait_for(lambda: stack.row(uid), timeout=5, what="the row")
    stack.kube.kubectl("delete", "sp", "doomed", "-n", NAMESPACE, "--wait=true", "--timeout=20s")
    assert stack.get("doomed") is None
    assert (stack.row(uid) or {}).get("state") == "cancelled"
    stack.fire_a_later_row("after-doomed", 5)  # due after the cancelled one was
    assert stack.deliveries(uid) == []


def test_operator_killed_mid_burst(stack: Stack) -> None:
    names = [f"burst-{i:03d}" for i in range(200)]
    due = at(15)

    def manifest(chunk: list[str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "schedlock.dev/v1",
                    "kind": "ScheduledPublish",
                    "metadata": {"name": n, "namespace": NAMESPACE},
                    "spec": {"target": "demo", "publishAt": due, "payload": {"n": n}},
                }
                for n in chunk
            ],
        }

    stack.kube.apply(manifest(names[:100]))
    # Killed mid-burst: once the first rows are written, before the last ones are.
    wait_for(
        lambda: stack.sql(
            "SELECT 1 FROM schedlock_publishes WHERE name LIKE %s LIMIT 1", "burst-%"
        ),
        timeout=20,
        interval=0.05,
        what="the burst's first rows",
    )
    stack.operator.kill()
    stack.kube.apply(manifest(names[100:]))
    stack.operator.start()
    uids = {}
    for name in names:
        uids[name] = stack.uid(name)

    def all_published() -> bool:
        out = stack.kube.kubectl("get", "sp", "-n", NAMESPACE, "-o", "json")
        phases = {
            o["metadata"]["name"]: (o.get("status") or {}).get("phase")
            for o in json.loads(out.stdout)["items"]
        }
        return all(phases.get(n) == "Published" for n in names)

    wait_for(all_published, timeout=90, interval=1, what="200 objects Published")
    with psycopg.connect(stack.database, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT uid, count(*) FROM schedlock_publishes WHERE uid = ANY(%s) GROUP BY uid",
            (list(uids.values()),),
        ).fetchall()
    assert len(rows) == 200 and all(n == 1 for _, n in rows)
    assert stack.sidecars.receiver is not None
    counts: dict[str, int] = {}
    for entry in stack.sidecars.receiver.entries():
        counts[entry["uid"]] = counts.get(entry["uid"], 0) + 1
    assert all(counts.get(uid) == 1 for uid in uids.values()), (
        "a burst object fired twice or not at all"
    )


def test_suspend_and_recurring_status(stack: Stack) -> None:
    stack.apply("paused", publishAt=at(2), suspend=True)
    uid = stack.uid("paused")
    wait_for(
        lambda: stack.status("paused").get("phase") == "Suspended", timeout=10, what="Suspended"
    )
    stack.fire_a_later_row("after-paused", 3)  # due after the suspended one
    assert stack.deliveries(uid) == []
    assert (stack.row(uid) or {}).get("state") == "suspended"
    stack.apply("nightly", schedule="0 3 * * *", timeZone="Europe/Berlin")
    wait_for(lambda: stack.status("nightly").get("nextFireAt"), timeout=10, what="nextFireAt")
    status = stack.status("nightly")
    assert status["phase"] == "Scheduled" and ready(status)["status"] == "True"
    assert status["nextFireAt"].endswith(("01:00:00Z", "02:00:00Z"))  # 03:00 Berlin in UTC


def test_webhook_refuses_what_the_schema_cannot_see(stack: Stack) -> None:
    big = {"blob": "x" * 20_000}
    obj: dict[str, Any] = {
        "apiVersion": "schedlock.dev/v1",
        "kind": "ScheduledPublish",
        "metadata": {"name": "too-big", "namespace": NAMESPACE},
        "spec": {"target": "demo", "publishAt": at(60), "payload": big},
    }
    out = stack.kube.kubectl("apply", "-f", "-", input=json.dumps(obj), check=False)
    assert out.returncode != 0
    assert "spec.payload is" in out.stderr and "at most 16384 bytes" in out.stderr
    obj["metadata"]["name"] = "never"
    obj["spec"] = {"target": "demo", "schedule": "0 0 30 2 *"}
    out = stack.kube.kubectl("apply", "-f", "-", input=json.dumps(obj), check=False)
    assert out.returncode != 0 and "spec.schedule" in out.stderr


def test_webhook_refuses_a_deep_payload_in_one_line(stack: Stack) -> None:
    """Issue 21: kopf's json.loads raised RecursionError on a payload ~1,000 deep, the webhook
    answered 500 and failurePolicy: Ignore admitted the object.  Written as text: the test's
    own json.dumps would recurse too."""
    deep = '{"a": ' * 3_000 + "1" + "}" * 3_000
    text = (
        '{"apiVersion": "schedlock.dev/v1", "kind": "ScheduledPublish", "metadata": '
        f'{{"name": "too-deep", "namespace": "{NAMESPACE}"}}, "spec": {{"target": "demo", '
        f'"publishAt": "{at(60)}", "payload": {deep}}}}}'
    )
    out = stack.kube.kubectl("create", "-f", "-", input=text, check=False)
    assert out.returncode != 0, out.stdout
    assert "spec.payload nests deeper than 32 levels" in out.stderr, out.stderr


def test_operator_runs_with_least_privilege(stack: Stack) -> None:
    who = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}"

    def can(*args: str) -> bool:
        out = stack.kube.kubectl("auth", "can-i", *args, "--as", who, check=False)
        return out.stdout.strip() == "yes"

    assert can("watch", "scheduledpublishes.schedlock.dev", "--all-namespaces")
    assert can("patch", "scheduledpublishes.schedlock.dev/status", "-n", NAMESPACE)
    assert can("create", "events", "-n", NAMESPACE)
    for verb, resource in [
        ("delete", "scheduledpublishes.schedlock.dev"),
        ("create", "scheduledpublishes.schedlock.dev"),
        ("get", "secrets"),
        ("list", "pods"),
        ("list", "namespaces"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
        ("create", "leases.coordination.k8s.io"),
    ]:
        assert not can(verb, resource, "-n", NAMESPACE), f"{verb} {resource} must not be granted"
    assert "Forbidden" not in stack.operator.log_text()


def test_pods_that_opt_in_get_the_native_sidecar(stack: Stack) -> None:
    def create(
        name: str, annotations: dict[str, str], opt_in: dict[str, str] = OPT_IN
    ) -> dict[str, Any]:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "annotations": annotations,
                "labels": {**opt_in, "app.kubernetes.io/name": "billing"},
            },
            "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
        }
        out = stack.kube.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(pod))
        created: dict[str, Any] = json.loads(out.stdout)
        return created

    injected = create("opted-in", {})
    [sidecar] = injected["spec"]["initContainers"]
    assert sidecar["name"] == "schedlock" and sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert {"name": "SCHEDLOCK_TARGET", "value": "billing"} in sidecar["env"]
    assert sidecar["securityContext"]["runAsNonRoot"] is True
    assert injected["metadata"]["labels"]["schedlock.dev/injected"] == "true"
    assert [c["name"] for c in injected["spec"]["containers"]] == ["app"]
    untouched = create("plain", {}, opt_in={})
    assert "initContainers" not in untouched["spec"]
    assert "schedlock.dev/injected" not in untouched["metadata"].get("labels", {})
    # The opt-in of 0.1, the annotation alone, is not sent to the webhook any more.
    legacy = create("annotated-only", {"schedlock.dev/inject": "true"}, opt_in={})
    assert "initContainers" not in legacy["spec"]
    # A malformed signing Secret is never half-applied: no sidecar, and kubectl shows why.
    malformed: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "bad-signing-secret",
            "namespace": NAMESPACE,
            "annotations": {"schedlock.dev/signing-secret": "Billing_HMAC"},
            "labels": {**OPT_IN, "app.kubernetes.io/name": "billing"},
        },
        "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
    }
    out = stack.kube.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(malformed))
    assert "initContainers" not in json.loads(out.stdout)["spec"]
    assert (
        "Warning: schedlock: schedlock.dev/signing-secret must be NAME or NAME/KEY of a Secret; "
        "'Billing_HMAC' is not a Secret name"
    ) in out.stderr, out.stderr
    # Every other annotation the same way: the pod runs, without a sidecar that could not
    # start (and would keep the app from starting), and kubectl shows which value and why.
    for n, (key, value, says) in enumerate(
        [
            ("schedlock.dev/target", "Billing", "must be a DNS label"),
            ("schedlock.dev/target-url", "ftp://127.0.0.1:21/", "must be an http:// or https://"),
            ("schedlock.dev/target-ready-url", "tcp://127.0.0.1", "or tcp://host:port"),
            ("schedlock.dev/database-secret", "App_DB", "must name a Secret"),
            ("schedlock.dev/target-ulr", "http://x:1/", "is not an annotation schedlock reads"),
        ]
    ):
        out = stack.kube.kubectl(
            "create",
            "-f",
            "-",
            "-o",
            "json",
            input=json.dumps(
                {
                    **malformed,
                    "metadata": {
                        **malformed["metadata"],
                        "name": f"bad-{n}",
                        "annotations": {key: value},
                    },
                }
            ),
        )
        assert "initContainers" not in json.loads(out.stdout)["spec"], key
        assert "Warning: schedlock: " in out.stderr and key in out.stderr, out.stderr
        assert says in out.stderr, out.stderr
    logged = list(records(stack.operator.log_text(), Event.POD_NOT_INJECTED))
    assert {r["pod"] for r in logged} >= {f"bad-{n}" for n in range(5)}, logged
    assert all(r["namespace"] == NAMESPACE for r in logged), logged


def test_injected_pods_pass_the_restricted_pod_security_profile(stack: Stack) -> None:
    namespace = "e2e-restricted"
    stack.kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": namespace,
                "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest",
                },
            },
        }
    )
    stack.kube.apply(
        mutating_webhook_configuration(
            stack.operator.webhook_port,
            stack.operator.webhook.ca_pem,  # type: ignore[union-attr]
            namespace,
        )
    )
    restricted_app = {
        "name": "app",
        "image": "example/app:1",
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }

    # The app has a volume of its own, named like the one the injector adds for the signing key.
    own_volume = {"name": "schedlock-signing-secret", "emptyDir": {}}

    def create(name: str, container: dict[str, Any]) -> Any:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {"schedlock.dev/signing-secret": "billing-hmac/hmac"},
                "labels": {**OPT_IN, "app.kubernetes.io/name": "billing"},
            },
            "spec": {"containers": [container], "volumes": [own_volume]},
        }
        return stack.kube.kubectl(
            "create", "-f", "-", "-o", "json", input=json.dumps(pod), check=False
        )

    try:
        accepted = create("compliant", restricted_app)
        assert accepted.returncode == 0, accepted.stderr
        spec = json.loads(accepted.stdout)["spec"]
        [sidecar] = spec["initContainers"]
        assert sidecar["name"] == "schedlock"
        # Signed with the key from the Secret: a read-only volume only the sidecar mounts.
        [own, signing] = spec["volumes"]
        assert own == own_volume
        assert signing == {
            "name": "schedlock-signing-secret-2",
            "secret": {
                "secretName": "billing-hmac",
                "items": [{"key": "hmac", "path": "signing-secret"}],
                "defaultMode": 0o444,
            },
        }
        assert sidecar["volumeMounts"] == [
            {
                "name": "schedlock-signing-secret-2",
                "mountPath": "/var/run/secrets/schedlock.dev/signing",
                "readOnly": True,
            }
        ]
        assert {
            "name": "SCHEDLOCK_SIGNING_SECRET_FILE",
            "value": "/var/run/secrets/schedlock.dev/signing/signing-secret",
        } in sidecar["env"]
        assert "volumeMounts" not in spec["containers"][0]
        # The namespace really enforces the profile: an app without the context is refused.
        refused = create("careless", {"name": "app", "image": "example/app:1"})
        assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr
        assert '"schedlock"' not in refused.stderr  # the injected sidecar is never the culprit
    finally:
        stack.kube.kubectl(
            "delete",
            "mutatingwebhookconfiguration",
            f"schedlock-test-inject-{namespace}",
            check=False,
        )


def test_one_status_sync_at_a_time_and_a_clean_shutdown(stack: Stack, tmp_path: Path) -> None:
    second = OperatorProcess(
        tmp_path / "second",
        as_role(stack.database, OPERATOR_ROLE),
        stack.operator.kubeconfig,
        extra_env={**RUNTIME_ENV, "SCHEDLOCK_HOLDER": "operator-two"},
    )
    second.start()
    try:
        stack.apply("twice", publishAt=at(1))
        uid = stack.uid("twice")
        wait_for(
            lambda: stack.status("twice").get("phase") == "Published", timeout=15, what="Published"
        )
        # A later object synced too: the sync has gone past "twice" (no sleep).
        stack.fire_a_later_row("after-twice", 1)
        wait_for(
            lambda: stack.status("after-twice").get("phase") == "Published",
            timeout=15,
            what="the later object Published",
        )
        assert stack.events("twice").count("Published") == 1, stack.events("twice")
        # waiting on the advisory lock
        assert not list(records(second.log_text(), Event.STATUS_SYNC_ACTIVE))
        assert len(stack.deliveries(uid)) == 1
    finally:
        assert second.process is not None
        second.process.send_signal(signal.SIGTERM)
        assert second.process.wait(20) == 0, second.log_text()[-2000:]
