"""Objects the schema cannot refuse, with the webhook down: the handlers mark them InvalidSpec.

The chart's webhook has ``failurePolicy: Ignore`` (an operator restart must not block creates),
so an object the CRD's schema and CEL rules accept can still be one that cannot work: a
payload over 16 KiB serialised, a cron date that never occurs.  Real kube-apiserver + etcd,
the operator under its ServiceAccount with no webhook registered, real PostgreSQL, two
sidecars and a recording app.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from testbed.operators import OperatorStack, at, operator_stack_fixture
from testbed.sidecars import wait_for

NAMESPACE = "e2e-invalid"
BIG = {"blob": "x" * 17_000}  # over 16 KiB serialised, one key: the schema lets it through


class Stack(OperatorStack):
    def ready(self, name: str) -> dict[str, Any]:
        found = [c for c in self.status(name).get("conditions") or [] if c["type"] == "Ready"]
        return found[0] if found else {}

    def warnings(self, name: str) -> list[tuple[str, str]]:
        out = self.kube.kubectl(
            "get", "events", "-n", self.namespace, "-o", "json",
            "--field-selector", f"involvedObject.name={name},type=Warning",
        )  # fmt: skip
        return [(e["reason"], e["message"]) for e in json.loads(out.stdout)["items"]]

    def resumed(self, name: str) -> bool:
        """kopf's own record that the restarted operator resumed the object (debug logs)."""
        for line in self.operator.log_text().splitlines():
            if '"Resuming is processed' in line and f'"name": "{name}"' in line:
                return True
        return False

    def rows(self, uid: str) -> int:
        found = self.sql(
            "SELECT (SELECT count(*) FROM schedlock_publishes WHERE uid = %s)"
            " + (SELECT count(*) FROM schedlock_schedules WHERE uid = %s)",
            uid,
            uid,
        )
        return int(found[0][0])


stack = operator_stack_fixture(Stack, NAMESPACE, operator_env={"SCHEDLOCK_LOG_LEVEL": "debug"})


def marked(stack: Stack, name: str, problem: str) -> None:
    wait_for(lambda: stack.ready(name).get("reason") == "InvalidSpec", 30, what=name)
    status, ready = stack.status(name), stack.ready(name)
    assert status["phase"] == "Failed" and status["observedGeneration"] == 1
    assert ready["status"] == "False" and ready["message"].startswith(problem), ready
    # one Warning, ours: kopf's "failed permanently" would repeat it
    wait_for(lambda: stack.warnings(name), 15, what=f"{name}'s Warning")
    assert stack.warnings(name) == [("InvalidSpec", ready["message"])]


def test_an_invalid_object_is_marked_once_and_fires_once_fixed(stack: Stack) -> None:
    stack.apply("big", publishAt=at(3), payload=BIG)
    stack.apply("never", schedule="0 0 30 2 *")  # 30 February
    uids = {name: stack.uid(name) for name in ("big", "never")}
    for name, problem in (("big", "spec.payload is"), ("never", "spec.schedule:")):
        marked(stack, name, problem)
        assert stack.rows(uids[name]) == 0

    # An operator restart resumes both: nothing new is said about them.
    stack.operator.kill()
    stack.operator.start()
    wait_for(lambda: stack.resumed("big") and stack.resumed("never"), 30, what="the resume")
    assert [len(stack.warnings(n)) for n in ("big", "never")] == [1, 1]

    # Fixed: the row is written, it fires once, the status follows.
    stack.apply("big", publishAt=at(2), payload={"small": 1})
    wait_for(lambda: stack.deliveries(uids["big"]), 30, what="big's fire")
    wait_for(lambda: stack.status("big").get("phase") == "Published", 15, what="Published")
    assert stack.status("big")["observedGeneration"] == 2
    assert [d["payload"] for d in stack.deliveries(uids["big"])] == [{"small": 1}]
    assert stack.warnings("big") == [("InvalidSpec", stack.warnings("big")[0][1])]


def test_a_deep_payload_stored_past_the_webhook_is_marked_and_the_operator_goes_on(
    stack: Stack,
) -> None:
    """Issue 21: with the webhook down, an object whose payload nests 3,000 deep is stored;
    kopf's list and watch read it (the operator's recursion limit), the handlers mark it
    InvalidSpec, and the other objects of every namespace are still handled."""
    deep = '{"a": ' * 3_000 + "1" + "}" * 3_000
    text = (
        '{"apiVersion": "schedlock.dev/v1", "kind": "ScheduledPublish", "metadata": '
        f'{{"name": "deep", "namespace": "{NAMESPACE}"}}, "spec": {{"target": "demo", '
        f'"publishAt": "{at(3)}", "payload": {deep}}}}}'
    )
    stack.kube.kubectl("create", "-f", "-", input=text)
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # this test reads the object back with json.loads too
    try:
        marked(stack, "deep", "spec.payload nests deeper than 32 levels")
        assert stack.rows(stack.uid("deep")) == 0
        stack.operator.kill()  # a restart lists it again: still read, nothing new said
        stack.operator.start()
        wait_for(lambda: stack.resumed("deep"), 30, what="the resume")
        assert len(stack.warnings("deep")) == 1
        stack.apply("after-deep", publishAt=at(2), payload={"n": 1})
        wait_for(lambda: stack.deliveries(stack.uid("after-deep")), 30, what="after-deep's fire")
    finally:
        sys.setrecursionlimit(old_limit)
