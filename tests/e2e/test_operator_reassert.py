"""Level-triggered: a row lost or reverted behind a ScheduledPublish comes back, fires once.

Real kube-apiserver + etcd, the operator process under its ServiceAccount (re-asserting every
2 s here; the default is at most 60 s, see tests/unit/test_reassert.py), real PostgreSQL, two
sidecars and a recording app.  Rows are deleted or reverted directly in the database, the way
a restore from a backup or an asynchronous fail-over loses them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.support.kube import KubeAPIServer
from tests.support.operators import OperatorProcess, install_crd, operator_kubeconfig
from tests.support.pg_fixtures import OPERATOR_ROLE, SIDECAR_ROLE, PostgresService, as_role
from tests.support.sidecars import SidecarGroup, wait_for

NAMESPACE = "e2e-reassert"
INTERVAL = 2.0


@dataclass
class Stack:
    kube: KubeAPIServer
    database: str
    operator: OperatorProcess
    sidecars: SidecarGroup

    def apply(self, name: str, **spec: Any) -> str:
        self.kube.apply(
            {
                "apiVersion": "schedlock.dev/v1",
                "kind": "ScheduledPublish",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"target": "demo", **spec},
            }
        )
        return str(wait_for(lambda: self.get(name).get("metadata", {}).get("uid"), 10))

    def get(self, name: str) -> dict[str, Any]:
        out = self.kube.kubectl("get", "sp", name, "-n", NAMESPACE, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def handled(self, name: str) -> bool:
        obj = self.get(name)
        return (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]

    def events(self, name: str) -> list[str]:
        out = self.kube.kubectl(
            "get", "events", "-n", NAMESPACE, "-o", "json",
            "--field-selector", f"involvedObject.name={name}",
        )  # fmt: skip
        return [e["reason"] for e in json.loads(out.stdout)["items"]]

    def sql(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def row(self, uid: str) -> tuple[Any, ...] | None:
        found = self.sql(
            "SELECT state, attempts, generation FROM schedlock_publishes WHERE uid = %s", uid
        )
        return found[0] if found else None

    def deliveries(self, uid: str) -> list[dict[str, Any]]:
        assert self.sidecars.receiver is not None
        return [e for e in self.sidecars.receiver.entries() if e["uid"] == uid]


def at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.fixture(scope="module")
def stack(
    kube: KubeAPIServer,
    postgres: PostgresService,
    migrated_template: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("operator-reassert")
    database = postgres.create_database(template=migrated_template)
    install_crd(kube)
    kube.kubectl("create", "namespace", NAMESPACE, check=False)
    operator = OperatorProcess(
        workdir / "operator",
        as_role(database, OPERATOR_ROLE),
        operator_kubeconfig(kube),
        extra_env={"SCHEDLOCK_MIGRATE": "off", "SCHEDLOCK_REASSERT_SECONDS": f"{INTERVAL:g}"},
    ).start()
    sidecars = SidecarGroup(
        workdir / "sidecars",
        as_role(database, SIDECAR_ROLE),
        namespace=NAMESPACE,
        replicas=2,
        extra_env={"SCHEDLOCK_MIGRATE": "off"},
    ).start()
    try:
        yield Stack(kube, database, operator, sidecars)
    finally:
        sidecars.stop()
        operator.stop()
        postgres.drop_database(database)


def test_a_deleted_row_of_a_future_object_comes_back_and_fires_once(stack: Stack) -> None:
    uid = stack.apply("future", publishAt=at(15))
    wait_for(lambda: stack.row(uid) and stack.handled("future"), 15, what="the row, handled")
    stack.sql("DELETE FROM schedlock_publishes WHERE uid = %s", uid)
    deleted = time.monotonic()
    wait_for(lambda: stack.row(uid), 3 * INTERVAL + 5, interval=0.05, what="the row back")
    assert time.monotonic() - deleted <= INTERVAL + 3
    assert stack.row(uid) == ("scheduled", 0, 1)
    wait_for(lambda: stack.deliveries(uid), 30, what="the fire")
    wait_for(lambda: stack.status("future").get("phase") == "Published", 15, what="Published")
    time.sleep(2 * INTERVAL)
    assert len(stack.deliveries(uid)) == 1
    assert stack.row(uid)[0] == "published"  # type: ignore[index]


def test_a_terminal_object_whose_row_was_lost_is_restored_terminal_not_fired(
    stack: Stack,
) -> None:
    uid = stack.apply("done", publishAt=at(2))
    wait_for(lambda: stack.status("done").get("phase") == "Published", 30, what="Published")
    before = stack.status("done")
    stack.sql("DELETE FROM schedlock_publishes WHERE uid = %s", uid)
    wait_for(lambda: stack.row(uid), 3 * INTERVAL + 5, interval=0.05, what="the row back")
    assert stack.row(uid) == ("published", before["attempts"], 1)
    # A restore from a backup taken before it fired: the row is back in `scheduled`, due now.
    stack.sql(
        "UPDATE schedlock_publishes SET state = 'scheduled', attempts = 0, term = NULL, "
        "next_attempt_at = now() + interval '8 seconds' WHERE uid = %s",
        uid,
    )
    wait_for(
        lambda: (stack.row(uid) or ("",))[0] == "published",
        3 * INTERVAL + 5,
        interval=0.05,
        what="the reverted row back in its outcome",
    )
    time.sleep(10)  # past the reverted due time: nothing fires
    assert len(stack.deliveries(uid)) == 1
    after = stack.status("done")
    assert after["phase"] == "Published"
    assert after["lastFiredAt"] == before["lastFiredAt"]
    assert stack.events("done").count("Published") == 1
